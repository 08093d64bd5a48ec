# Sourced by tools/slurm_train.sh and tools/slurm_test.sh: the srun set-up they share.
#   slurm_job USAGE PARTITION JOB_NAME CONFIG ARG4 [tool args...]   checks the arguments
#   slurm_run PARTITION JOB_NAME TOOL [TOOL args...]                runs TOOL under srun
# srun starts GPUS tasks (default 8), GPUS_PER_NODE per node (default 8, or GPUS when
# fewer), with CPUS_PER_TASK cores each (default 5); SRUN_ARGS adds srun options; GRES is the
# generic resource asked per node (default gpu:GPUS_PER_NODE; GRES= for CPU-only nodes).
# Every task reads its rank from SLURM's variables (--launcher slurm); the rendezvous port is
# the step's reserved one (SRUN_ARGS=--resv-ports) or derives from the job id, and a task
# that reaches another job's rendezvous stops at once. srun passes SIGTERM / SIGUSR1 on to
# the tasks (docs/cluster.md).
source "$(dirname "${BASH_SOURCE[0]}")/python_env.sh"

slurm_job() {
  local usage=$1 names=(PARTITION JOB_NAME CONFIG "${1%% *}")
  shift
  if [ $# -lt 4 ]; then
    echo "$(basename "$0"): ${names[$#]} missing; usage: [GPUS=8] [GPUS_PER_NODE=8]" \
         "[CPUS_PER_TASK=5] [SRUN_ARGS=...] bash $0 PARTITION JOB_NAME CONFIG $usage" >&2
    exit 2
  fi
}

slurm_run() {
  local gpus=${GPUS:-8}
  local per_node=${GPUS_PER_NODE:-$((gpus < 8 ? gpus : 8))}
  local gres=${GRES-gpu:$per_node}
  # SRUN_ARGS is a list of options: split on spaces on purpose
  # shellcheck disable=SC2086
  exec srun -p "$1" --job-name="$2" ${gres:+--gres="$gres"} \
      --ntasks="$gpus" --ntasks-per-node="$per_node" --cpus-per-task="${CPUS_PER_TASK:-5}" \
      --kill-on-bad-exit=1 ${SRUN_ARGS:-} \
      "$PY" -u "$ROOT/tools/$3" "${@:4}" --launcher=slurm
}
