#!/usr/bin/env bash
# Multi-process evaluation with torchrun: dist_test.sh CONFIG CHECKPOINT NPROC [test.py args...]
# Multi-node: NNODES, NODE_RANK, MASTER_ADDR, PORT as in OpenMMLab.
set -euo pipefail
CONFIG=$1
CHECKPOINT=$2
NPROC=$3
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

PYTHONPATH="$ROOT:${PYTHONPATH:-}" exec "${PYTHON:-python}" -m torch.distributed.run \
    --nnodes="$NNODES" --node_rank="$NODE_RANK" --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$NPROC" --master_port="$PORT" \
    "$ROOT/tools/test.py" "$CONFIG" "$CHECKPOINT" --launcher pytorch "${@:4}"
