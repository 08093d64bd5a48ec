#!/usr/bin/env bash
# Train on a SLURM cluster (the mmdet / mmseg convention):
#   [GPUS=16] [GPUS_PER_NODE=8] bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [train.py args...]
# srun starts GPUS tasks, GPUS_PER_NODE per node (default 8, or GPUS when fewer), with
# CPUS_PER_TASK cores each (default 5); SRUN_ARGS adds srun options; GRES is the generic
# resource asked per node (default gpu:GPUS_PER_NODE; GRES= for CPU-only nodes). Every task
# reads its rank from SLURM's variables (--launcher slurm); the rendezvous port derives from
# the job id. SIGTERM / SIGUSR1 (srun passes them on) make the tasks save a checkpoint of the
# iteration in progress and exit with status 75; WORK_DIR then resumes with --resume.
set -euo pipefail
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
WORK_DIR=$4
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-$((GPUS < 8 ? GPUS : 8))}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
GRES=${GRES-gpu:$GPUS_PER_NODE}
source "$(dirname "$0")/python_env.sh"

# SRUN_ARGS is a list of options: split on spaces on purpose
# shellcheck disable=SC2086
exec srun -p "$PARTITION" --job-name="$JOB_NAME" ${GRES:+--gres="$GRES"} \
    --ntasks="$GPUS" --ntasks-per-node="$GPUS_PER_NODE" --cpus-per-task="$CPUS_PER_TASK" \
    --kill-on-bad-exit=1 ${SRUN_ARGS:-} \
    "$PY" -u "$ROOT/tools/train.py" "$CONFIG" --work-dir="$WORK_DIR" --launcher=slurm "${@:5}"
