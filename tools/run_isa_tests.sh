#!/usr/bin/env bash
# Run the suite's numerical tests (those that hold floating-point results to a reference within
# a bound) once per instruction-set level torch's CPU kernels can be forced to here, so that a
# bound tuned on one machine's ISA shows before it fails on another's (AVX-512 and AMX servers,
# AVX2 laptops, CPUs without either). Levels: `native` (ATEN_CPU_CAPABILITY unset: the best
# the CPU has), `avx2` (x86-64 CPUs with AVX-512; oneDNN limited to AVX2 as well) and `default`
# (no vector kernels; oneDNN at SSE4.1 on x86-64). A level above the CPU's own is skipped.
#
#   bash tools/run_isa_tests.sh                       # the numerical tests, every level
#   bash tools/run_isa_tests.sh tests/models/test_layers.py -k rope   # other tests
#
# Each level runs in one process (OMP_NUM_THREADS=1); the time of each and its pytest status
# are printed at the end. Exits non-zero when a level fails.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${VITDENSE_VENV:-$ROOT/.venv}/bin/python"
cd "$ROOT"

# parity with timm, the official code and float64 references; compiled against eager; fused
# attention against maps written out
NUMERICAL=(
    tests/models/test_layers.py
    tests/models/test_backbones.py
    tests/models/test_fused_attention.py
    tests/models/test_window_attention.py
    tests/models/test_timm_export.py
    tests/models/test_dense_official.py
    tests/models/test_adapter.py
    tests/compat/test_mmcv_ext_ops.py
    tests/engine/test_compile.py
    "tests/tools/test_train.py::test_compiled_training_has_the_eager_losses"
)
[ $# -gt 0 ] && NUMERICAL=("$@")

NATIVE="$("$PYTHON" -c 'import torch; print(torch.backends.cpu.get_cpu_capability())')"
LEVELS=(native)
case "$NATIVE" in AVX512*) LEVELS+=(avx2) ;; esac
LEVELS+=(default)

export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
SUMMARY=()
FAILED=0
for level in "${LEVELS[@]}"; do
    env=()
    if [ "$level" != native ]; then
        env+=(ATEN_CPU_CAPABILITY="$level")
        if [ "$(uname -m)" = x86_64 ]; then
            [ "$level" = avx2 ] && env+=(ONEDNN_MAX_CPU_ISA=AVX2) || env+=(ONEDNN_MAX_CPU_ISA=SSE41)
        fi
    fi
    printf '\n[vitdense ISA tests] %s (native: %s) %s\n' "$level" "$NATIVE" "${env[*]:-}"
    start=$SECONDS
    env "${env[@]}" "$PYTHON" -m pytest -q -p no:cacheprovider -n 0 -rfE "${NUMERICAL[@]}"
    status=$?
    [ "$status" = 0 ] || FAILED=1
    SUMMARY+=("$(printf '%-8s pytest status %s, %s s' "$level" "$status" $((SECONDS - start)))")
done
printf '\n[vitdense ISA tests] native ISA: %s\n' "$NATIVE"
printf '%s\n' "${SUMMARY[@]}"
exit "$FAILED"
