#!/bin/bash
# One call of the GPU report (docs/gpu_report.md), from the repository root on a GPU machine
# without network, with .whl/ (the OpenMMLab wheels) and work_dirs/gpu_report/ (the records of
# the earlier calls, if any) beside it and OUT an empty folder whose files come back. Arguments go to `python -m benchmarks.gpu_report`. Writes
# $OUT/gpu_report.jsonl (every record so far) and, on the first call, $OUT/cuda_parity.txt (the
# CUDA tests: served ops, talking heads, GPSA, the Triton kernel, decoding on the device; not
# with SKIP_CUDA_TESTS=1, as the floors call runs).
set -u
if [ ! -d /tmp/site/mmdet ]; then  # a fresh machine: install the carried wheels once
  python3 -m pip uninstall -y -q transformers sentence-transformers peft 2>/dev/null
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    || exit 1
  # mmcv-lite's ops come from vitdense's torch-native mmcv._ext, as the installer sets up: its
  # start-up file and module at the root of the interpreter's site-packages.
  site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  cp packaging/vitdense-mmcv-ext/vitdense-mmcv-ext.pth \
    packaging/vitdense-mmcv-ext/vitdense_mmcv_ext.py "$site/" || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -c 'import mmcv.ops; print("mmcv ops:", mmcv.ops.get_compiler_version())' || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
earlier=work_dirs/gpu_report
[ -f $earlier/gpu_report.jsonl ] && cp $earlier/gpu_report.jsonl "$OUT/"
if [ -z "${SKIP_CUDA_TESTS:-}" ] && [ ! -f $earlier/cuda_parity.txt ]; then
  timeout 240 python3 -m pytest -q -p no:cacheprovider -rs tests/models/test_cuda_parity.py \
    tests/models/test_talking_heads_triton.py::test_kernel_on_a_gpu_equals_the_fold \
    tests/cls/test_device_augment.py::test_gpu_decode_and_augment_match_the_cpu \
    > "$OUT/cuda_parity.txt" 2>&1
  tail -n 3 "$OUT/cuda_parity.txt"
fi
python3 -m benchmarks.gpu_report --out "$OUT/gpu_report.jsonl" "$@" | cut -c1-300
python3 -m benchmarks.gpu_report --out "$OUT/gpu_report.jsonl" --list "$@" | cut -c1-8 | sort | uniq -c
