#!/usr/bin/env bash
# Evaluate a checkpoint on a SLURM cluster (the mmdet / mmseg convention):
#   [GPUS=8] bash tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT [test.py args...]
# GPUS, GPUS_PER_NODE, CPUS_PER_TASK, GRES and SRUN_ARGS: see tools/slurm_job.sh.
set -euo pipefail
source "$(dirname "$0")/slurm_job.sh"
slurm_job 'CHECKPOINT [test.py args...]' "$@"
slurm_run "$1" "$2" test.py "$3" "$4" "${@:5}"
