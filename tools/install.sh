#!/usr/bin/env bash
# Install vitdense and the OpenMMLab stack into .venv/ (CPU or CUDA torch, mmcv with compiled ops).
#
# Idempotent: each step checks what is already there.  The mmcv wheel, the only
# package that must be compiled (~13 min on 2 cores), is cached outside the repo in
# $VITDENSE_CACHE (default ~/.cache/vitdense) so a second install takes seconds.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VITDENSE_VENV:-$ROOT/.venv}"
CACHE="${VITDENSE_CACHE:-$HOME/.cache/vitdense}"
PYTHON="${PYTHON:-python3.11}"
MMCV_VERSION=2.1.0
CONSTRAINTS="$ROOT/requirements/constraints.txt"

step() { printf '\n[vitdense install %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

mkdir -p "$CACHE/wheels"
if [ ! -x "$VENV/bin/python" ]; then
  step "creating virtual environment $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip install --disable-pip-version-check --progress-bar off -c "$CONSTRAINTS")

have() { "$PY" - "$@" <<'PYEOF' 2>/dev/null
import sys
from importlib.metadata import version
for spec in sys.argv[1:]:
    name, _, want = spec.partition('==')
    if version(name) != want:
        sys.exit(1)
PYEOF
}

step "build tools and torch"
have torch==2.14.1 torchvision==0.29.1 setuptools==69.5.1 || \
  "${PIP[@]}" torch==2.14.1 torchvision==0.29.1 'setuptools<70' wheel ninja numpy packaging

step "mmengine"
have "mmengine==$(sed -n 's/^mmengine==//p' "$CONSTRAINTS")" || "${PIP[@]}" mmengine

if ! have "mmcv==$MMCV_VERSION"; then
  WHEEL=$(ls "$CACHE"/wheels/mmcv-"$MMCV_VERSION"-*.whl 2>/dev/null | head -1 || true)
  if [ -z "$WHEEL" ]; then
    step "building mmcv $MMCV_VERSION with CPU/CUDA ops from source (one time, ~15 min on 2 cores)"
    BUILD=$(mktemp -d)
    "$PY" -m pip download --no-deps --no-binary :all: "mmcv==$MMCV_VERSION" -d "$BUILD" --quiet
    tar -xzf "$BUILD"/mmcv-"$MMCV_VERSION".tar.gz -C "$BUILD"
    # torch >= 2.6 headers need C++20; mmcv 2.1.0 hard-codes c++14 / c++17.
    sed -i -E 's/-std=c\+\+1[47]/-std=c++20/g' "$BUILD/mmcv-$MMCV_VERSION/setup.py"
    (cd "$BUILD/mmcv-$MMCV_VERSION" && MMCV_WITH_OPS=1 MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
      "$PY" -m pip wheel --no-build-isolation --no-deps -w "$CACHE/wheels" .)
    rm -rf "$BUILD"
    WHEEL=$(ls "$CACHE"/wheels/mmcv-"$MMCV_VERSION"-*.whl | head -1)
  fi
  step "installing cached $WHEEL"
  "${PIP[@]}" --no-deps "$WHEEL"
fi

step "mmdet, mmsegmentation, mmpretrain, timm and the rest"
"${PIP[@]}" -r "$ROOT/requirements/runtime.txt" -r "$ROOT/requirements/tests.txt" --quiet
step "vitdense (editable)"
"${PIP[@]}" --no-deps --no-build-isolation -e "$ROOT" --quiet
"$PY" -c "import vitdense, mmcv.ops, mmdet, mmseg, mmpretrain, timm; print('vitdense stack OK: torch', __import__('torch').__version__, 'mmcv', mmcv.__version__, 'mmdet', mmdet.__version__, 'mmseg', mmseg.__version__, 'mmpretrain', mmpretrain.__version__, 'timm', timm.__version__)"
