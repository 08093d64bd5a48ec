# Sourced by the launch scripts: sets ROOT (the checkout) and PY, the interpreter: $PYTHON,
# else the project's environment (.venv/bin/python, as tools/install.sh makes it), else
# python3 on PATH; stops when it cannot import torch.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -n "${PYTHON:-}" ]; then
  PY="$PYTHON"
elif [ -x "${VITDENSE_VENV:-$ROOT/.venv}/bin/python" ]; then
  PY="${VITDENSE_VENV:-$ROOT/.venv}/bin/python"
else
  PY="$(command -v python3 || command -v python)"
fi
"$PY" -c 'import torch' 2>/dev/null || {
  echo "$(basename "$0"): $PY cannot import torch; run tools/install.sh or set PYTHON" >&2; exit 1; }
# the checkout first; no empty entry, which would put the working directory on sys.path
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
