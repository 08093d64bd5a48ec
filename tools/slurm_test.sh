#!/usr/bin/env bash
# Evaluate a checkpoint on a SLURM cluster (the mmdet / mmseg convention):
#   [GPUS=8] bash tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT [test.py args...]
# GPUS, GPUS_PER_NODE, CPUS_PER_TASK, GRES and SRUN_ARGS as in tools/slurm_train.sh.
set -euo pipefail
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
CHECKPOINT=$4
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-$((GPUS < 8 ? GPUS : 8))}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
GRES=${GRES-gpu:$GPUS_PER_NODE}
source "$(dirname "$0")/python_env.sh"

# shellcheck disable=SC2086
exec srun -p "$PARTITION" --job-name="$JOB_NAME" ${GRES:+--gres="$GRES"} \
    --ntasks="$GPUS" --ntasks-per-node="$GPUS_PER_NODE" --cpus-per-task="$CPUS_PER_TASK" \
    --kill-on-bad-exit=1 ${SRUN_ARGS:-} \
    "$PY" -u "$ROOT/tools/test.py" "$CONFIG" "$CHECKPOINT" --launcher=slurm "${@:5}"
