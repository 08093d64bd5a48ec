"""Benchmarks and fault injection: measuring scripts over ``vitdense``, run from the
repository root as ``python -m benchmarks.<name>``; their results go to ``benchmarks/results/``
and ``docs/benchmarks.md`` / ``docs/faults.md``."""
