#!/usr/bin/env bash
# torchrun for the dist_*.sh scripts: torchrun.sh NPROC SCRIPT [SCRIPT args...]
# Multi-node: NNODES, NODE_RANK, MASTER_ADDR, PORT as in OpenMMLab; PYTHON picks the
# interpreter. Without GPUs the processes run on CPU with the gloo backend.
set -euo pipefail
NPROC=$1
SCRIPT=$2
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

PYTHONPATH="$ROOT:${PYTHONPATH:-}" exec "${PYTHON:-python}" -m torch.distributed.run \
    --nnodes="${NNODES:-1}" --node_rank="${NODE_RANK:-0}" \
    --master_addr="${MASTER_ADDR:-127.0.0.1}" --master_port="${PORT:-29500}" \
    --nproc_per_node="$NPROC" "$SCRIPT" "${@:3}" --launcher pytorch
