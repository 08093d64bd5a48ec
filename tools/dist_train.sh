#!/usr/bin/env bash
# Multi-process training with torchrun: dist_train.sh CONFIG NPROC [train.py args...]
# Multi-node: NNODES, NODE_RANK, MASTER_ADDR, PORT as in OpenMMLab. Without GPUs the
# processes train on CPU with the gloo backend.
set -euo pipefail
CONFIG=$1
NPROC=$2
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

PYTHONPATH="$ROOT:${PYTHONPATH:-}" exec "${PYTHON:-python}" -m torch.distributed.run \
    --nnodes="$NNODES" --node_rank="$NODE_RANK" --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$NPROC" --master_port="$PORT" \
    "$ROOT/tools/train.py" "$CONFIG" --launcher pytorch "${@:3}"
