#!/usr/bin/env bash
# Make sure the environment exists (tools/install.sh --deploy: idempotent, seconds when warm;
# with the deployment extras, so that the export parity tests run too), then run the test
# suite on VITDENSE_TEST_WORKERS pytest-xdist workers (default 2, the project machine's
# cores; 0 runs it in this process), each test on one thread.  Extra arguments go to pytest:
# `bash tools/run_tests.sh -m "not slow"` is the inner loop, the tests under 2 s
# (tests/slow_tests.txt).  Exits with pytest's status: non-zero when any test fails, and 5
# when no test ran (nothing collected, or every test deselected), so a selection that
# matches nothing fails the run instead of passing it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VITDENSE_VENV:-$ROOT/.venv}"
WORKERS="${VITDENSE_TEST_WORKERS:-2}"

bash "$ROOT/tools/install.sh" --deploy

cd "$ROOT"
# a worker per core: a second thread per worker would only take the other's core
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# and a tool that a test starts with more threads lets the idle ones sleep instead of spinning
# on the core the other worker holds
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
# loadgroup: a worker takes a file (or the group tests/conftest.py gives it) at a time, the
# longest first (conftest's order, kept by --no-loadscope-reorder)
PARALLEL=()
[ "$WORKERS" = 0 ] || PARALLEL=(-n "$WORKERS" --dist loadgroup --no-loadscope-reorder)
printf '\n[vitdense tests %s] pytest, %s workers\n' "$(date +%H:%M:%S)" "$WORKERS"
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider -rfEs "${PARALLEL[@]}" tests "$@"
