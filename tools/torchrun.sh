#!/usr/bin/env bash
# torchrun for the dist_*.sh scripts: torchrun.sh NPROC SCRIPT [SCRIPT args...]
# Multi-node: NNODES, NODE_RANK, MASTER_ADDR, PORT as in OpenMMLab. The interpreter is
# $PYTHON, else the project's environment (.venv/bin/python, as tools/install.sh makes it),
# else python3 on PATH. Without GPUs the processes run on CPU with the gloo backend.
# Workers stop when this launcher is killed; --dist-timeout SECONDS bounds how long one
# waits for a stopped peer.
set -euo pipefail
NPROC=$1
SCRIPT=$2
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
if [ -n "${PYTHON:-}" ]; then
  PY="$PYTHON"
elif [ -x "${VITDENSE_VENV:-$ROOT/.venv}/bin/python" ]; then
  PY="${VITDENSE_VENV:-$ROOT/.venv}/bin/python"
else
  PY="$(command -v python3 || command -v python)"
fi
"$PY" -c 'import torch' 2>/dev/null || {
  echo "torchrun.sh: $PY cannot import torch; run tools/install.sh or set PYTHON" >&2; exit 1; }

PYTHONPATH="$ROOT:${PYTHONPATH:-}" exec "$PY" -m torch.distributed.run \
    --nnodes="${NNODES:-1}" --node_rank="${NODE_RANK:-0}" \
    --master_addr="${MASTER_ADDR:-127.0.0.1}" --master_port="${PORT:-29500}" \
    --nproc_per_node="$NPROC" "$SCRIPT" "${@:3}" --launcher pytorch
