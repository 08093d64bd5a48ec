#!/usr/bin/env bash
# Install vitdense and the OpenMMLab stack into .venv/ (torch 2.14.1, mmengine, mmdet, mmseg,
# mmpretrain, timm, peft, panopticapi): nothing is compiled, on CPU and GPU machines alike.
#
#   bash tools/install.sh               # mmcv-lite 2.1.0 + vitdense's torch-native mmcv ops
#   bash tools/install.sh --full-mmcv   # mmcv 2.1.0 with its compiled ops instead
#   bash tools/install.sh --deploy      # also onnx, onnxscript, onnxruntime (~120 MB installed)
#                                       # for exporting models (tools/deployment/)
#
# Default: mmcv-lite is mmcv without its compiled extension; vitdense serves the ops our
# configs call (nms, RoIAlign) on torchvision's CPU / CUDA kernels (vitdense/compat/mmcv_ext.py)
# and every other compiled op raises an error naming it.  The small distribution
# vitdense-mmcv-ext (packaging/vitdense-mmcv-ext) puts a one-line start-up file into
# site-packages that makes every interpreter of the environment find them as mmcv._ext;
# pip records it (`pip uninstall vitdense-mmcv-ext` removes it, as --full-mmcv does).
# --full-mmcv builds mmcv's C++ ops (and CUDA ops where torch sees a GPU; FORCE_CUDA=1
# forces them) from the PyPI source,
# ~10-25 min on 2 cores, needs g++ (and nvcc for CUDA), and caches the wheel, keyed by the
# torch version, in $VITDENSE_CACHE (default ~/.cache/vitdense) so later installs take seconds.
# Either way the other is uninstalled: both provide the `mmcv` package.
#
# Idempotent and quick when warm: every step checks what is there first.  Versions come from
# requirements/constraints.txt, the exact set the tests passed with.
#
# Disk: a fresh install takes ~6.2 GB (torch's CUDA build is 5.6 GB of it); the script checks
# the free space before installing torch and stops there when there is not enough.
#
# Environment: VITDENSE_VENV (default <repo>/.venv), VITDENSE_CACHE, PYTHON (default python3.11),
# MAX_JOBS (compile jobs for --full-mmcv, default: number of cores).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VITDENSE_VENV:-$ROOT/.venv}"
CACHE="${VITDENSE_CACHE:-$HOME/.cache/vitdense}"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3 || echo python3.11)}"
CONSTRAINTS="$ROOT/requirements/constraints.txt"
MMCV_VERSION=2.1.0
FULL_MMCV=0
DEPLOY=0
for arg in "$@"; do
  case "$arg" in
    --full-mmcv) FULL_MMCV=1 ;;
    --deploy) DEPLOY=1 ;;
    -h|--help) sed -n '2,/^set /{/^#/p}' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) printf '[vitdense install] error: unknown option %s (see --help)\n' "$arg" >&2; exit 2 ;;
  esac
done
MMCV_SETUPTOOLS=69.5.1   # last setuptools series whose pkg_resources mmcv 2.1.0's setup.py needs

step() { printf '\n[vitdense install %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { printf '[vitdense install] error: %s\n' "$*" >&2; exit 1; }

# Version of NAME pinned in the constraints file (empty when not pinned).
pinned() { sed -n "s/^$1==//Ip" "$CONSTRAINTS" | head -1; }

# require_free_space GB DIR WHAT: stop when the filesystem holding DIR has less than GB
# gigabytes free.  pip would otherwise stop half-way with ENOSPC, after uninstalling what it
# meant to replace.
require_free_space() {
  local need_gb=$1 dir=$2 what=$3 free_kb
  free_kb=$(df -Pk "$dir" | awk 'NR == 2 {print $4}')
  [ "$free_kb" -ge $((need_gb * 1024 * 1024)) ] || \
    die "$what needs about $need_gb GB free on the filesystem of $dir, which has $((free_kb / 1024)) MB free; free some space there, or set VITDENSE_VENV to a directory on a larger disk"
}

[ -f "$CONSTRAINTS" ] || die "missing $CONSTRAINTS"
TORCH_VERSION="$(pinned torch)"
[ -n "$TORCH_VERSION" ] || die "torch is not pinned in $CONSTRAINTS"

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null || \
    die "$PYTHON is not Python 3.11 (set PYTHON=/path/to/python3.11)"
  step "creating virtual environment $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip install --disable-pip-version-check --progress-bar off -c "$CONSTRAINTS")

# have NAME[==VERSION] ...: true when every NAME is installed (at VERSION, if given).
have() {
  "$PY" - "$@" <<'PYEOF' 2>/dev/null
import sys
from importlib.metadata import PackageNotFoundError, version
for spec in sys.argv[1:]:
    name, _, want = spec.partition('==')
    try:
        got = version(name)
    except PackageNotFoundError:
        sys.exit(1)
    if want and got != want:
        sys.exit(1)
PYEOF
}

step "torch $TORCH_VERSION, torchvision, mmengine"
have "torch==$TORCH_VERSION" "torchvision==$(pinned torchvision)" "setuptools==$(pinned setuptools)" \
     "mmengine==$(pinned mmengine)" || {
  require_free_space 7 "$VENV" "installing torch $TORCH_VERSION (a CUDA build) and the OpenMMLab stack"
  "${PIP[@]}" --only-binary=:all: torch torchvision setuptools numpy mmengine
}

if [ "$FULL_MMCV" = 1 ]; then
  WHEEL_DIR="$CACHE/wheels/torch-$TORCH_VERSION-$("$PY" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')"
  if ! have "mmcv==$MMCV_VERSION"; then
    WHEEL=$(ls "$WHEEL_DIR"/mmcv-"$MMCV_VERSION"-*.whl 2>/dev/null | head -1 || true)
    if [ -z "$WHEEL" ]; then
      command -v g++ >/dev/null || die "g++ is needed to build mmcv's ops (apt-get install g++)"
      step "building mmcv $MMCV_VERSION with its ops from the PyPI source (one time, ~10-25 min on 2 cores)"
      require_free_space 1 "${TMPDIR:-/tmp}" "building mmcv"
      BUILD=$(mktemp -d)
      restore_setuptools() { "${PIP[@]}" --no-deps --quiet "setuptools==$(pinned setuptools)"; }
      trap 'restore_setuptools; rm -rf "$BUILD"' EXIT
      # mmcv's setup.py imports pkg_resources, gone from setuptools >= 82: downgrade for the
      # build only (--no-deps: torch itself asks for a newer one), restored right after.
      "$PY" -m pip install --disable-pip-version-check --quiet --no-deps \
        "setuptools==$MMCV_SETUPTOOLS" "wheel==$(pinned wheel)" "ninja==$(pinned ninja)"
      "$PY" -m pip download --disable-pip-version-check --quiet --no-deps --no-binary :all: \
        "mmcv==$MMCV_VERSION" -d "$BUILD"
      tar -xzf "$BUILD/mmcv-$MMCV_VERSION.tar.gz" -C "$BUILD"
      # torch >= 2.6 headers need C++20; mmcv 2.1.0 hard-codes c++14 / c++17.
      sed -i -E 's/-std=c\+\+1[47]/-std=c++20/g' "$BUILD/mmcv-$MMCV_VERSION/setup.py"
      mkdir -p "$WHEEL_DIR"
      (cd "$BUILD/mmcv-$MMCV_VERSION" && MMCV_WITH_OPS=1 MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
        "$PY" -m pip wheel --disable-pip-version-check --no-build-isolation --no-deps \
          -w "$WHEEL_DIR" .)
      restore_setuptools
      rm -rf "$BUILD"
      trap - EXIT
      WHEEL=$(ls "$WHEEL_DIR"/mmcv-"$MMCV_VERSION"-*.whl | head -1)
    fi
    ! have mmcv-lite || "$PY" -m pip uninstall --disable-pip-version-check --quiet -y mmcv-lite
    step "installing mmcv from $WHEEL"
    "${PIP[@]}" --no-deps --quiet --force-reinstall "$WHEEL"
  fi
elif ! have "mmcv-lite==$MMCV_VERSION"; then
  ! have mmcv || "$PY" -m pip uninstall --disable-pip-version-check --quiet -y mmcv
  step "mmcv-lite $MMCV_VERSION (mmcv without compiled ops; vitdense serves the ops it uses)"
  "${PIP[@]}" --quiet --only-binary=:all: "mmcv-lite==$MMCV_VERSION"
fi

step "mmdet, mmsegmentation, mmpretrain, timm, peft, pycocotools and test tools"
"${PIP[@]}" --quiet --only-binary=:all: -r "$ROOT/requirements/runtime.txt" -r "$ROOT/requirements/tests.txt"

step "panopticapi (COCO panoptic evaluation; no dependencies: see requirements/panoptic.txt)"
have "panopticapi-lite==$(pinned panopticapi-lite)" || \
  "${PIP[@]}" --quiet --no-deps --only-binary=:all: -r "$ROOT/requirements/panoptic.txt"

if [ "$DEPLOY" = 1 ]; then
  step "onnx, onnxscript, onnxruntime (model export)"
  have "onnx==$(pinned onnx)" "onnxscript==$(pinned onnxscript)" \
       "onnxruntime==$(pinned onnxruntime)" || \
    "${PIP[@]}" --quiet --only-binary=:all: -r "$ROOT/requirements/deploy.txt"
fi

step "vitdense (editable)"
# Already editable from this checkout? (find_spec only locates modules, runs none of them.)
"$PY" -I -c 'import importlib.util as u, sys; s = u.find_spec("vitdense")
sys.exit(not (s and s.origin == sys.argv[1]))' "$ROOT/vitdense/__init__.py" 2>/dev/null || \
  "${PIP[@]}" --quiet --no-deps --no-build-isolation -e "$ROOT"
# mmcv-lite: every interpreter of the environment finds vitdense's torch-native ops as
# mmcv._ext, through the start-up file of vitdense-mmcv-ext (a regular install, so that pip
# records the file); with the compiled mmcv it goes.
EXT="$ROOT/packaging/vitdense-mmcv-ext"
SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ "$FULL_MMCV" = 1 ]; then
  ! have vitdense-mmcv-ext || \
    "$PY" -m pip uninstall --disable-pip-version-check --quiet -y vitdense-mmcv-ext
  rm -f "$SITE/vitdense-mmcv-ext.pth"  # an unrecorded copy, as earlier installers wrote it
elif ! { have vitdense-mmcv-ext && cmp -s "$EXT/vitdense-mmcv-ext.pth" "$SITE/vitdense-mmcv-ext.pth" \
         && cmp -s "$EXT/vitdense_mmcv_ext.py" "$SITE/vitdense_mmcv_ext.py"; }; then
  step "vitdense-mmcv-ext (serves vitdense's torch-native ops as mmcv._ext under mmcv-lite)"
  "${PIP[@]}" --quiet --no-deps --no-build-isolation --force-reinstall "$EXT"
fi

"$PY" - <<'PYEOF'
import torch, mmcv, mmcv.ops, mmengine, mmdet, mmseg, mmpretrain, timm, peft
ops = mmcv.ops.get_compiler_version()
ops = 'torch-native ops' if ops.startswith('none') else 'compiled ops (' + ops + ')'
print('[vitdense install] ready: torch', torch.__version__, '| mmengine', mmengine.__version__,
      '| mmcv', mmcv.__version__, ops, '| mmdet', mmdet.__version__, '| mmseg',
      mmseg.__version__, '| mmpretrain', mmpretrain.__version__, '| timm', timm.__version__,
      '| peft', peft.__version__)
PYEOF
