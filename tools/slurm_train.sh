#!/usr/bin/env bash
# Train on a SLURM cluster (the mmdet / mmseg convention):
#   [GPUS=16] [GPUS_PER_NODE=8] bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [train.py args...]
# GPUS, GPUS_PER_NODE, CPUS_PER_TASK, GRES and SRUN_ARGS: see tools/slurm_job.sh.
# SIGTERM / SIGUSR1 make the tasks save a checkpoint of the iteration in progress and exit
# with status 75; WORK_DIR then resumes with --resume.
set -euo pipefail
source "$(dirname "$0")/slurm_job.sh"
slurm_job 'WORK_DIR [train.py args...]' "$@"
slurm_run "$1" "$2" train.py "$3" --work-dir="$4" "${@:5}"
