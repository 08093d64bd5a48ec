#!/usr/bin/env bash
# torchrun for the dist_*.sh scripts: torchrun.sh NPROC SCRIPT [SCRIPT args...]
# One node: a free rendezvous port is picked (two jobs on one node do not collide) unless
# PORT is set. Several nodes: NNODES, NODE_RANK, MASTER_ADDR, PORT (default 29500) as in
# OpenMMLab, the same on every node; the job's id (VITDENSE_RUN_ID: RUN_ID, else a checksum
# of the rendezvous address and the command line) makes a worker that reached another job's
# port stop at once instead of joining it. The interpreter is chosen by tools/python_env.sh.
# Without GPUs the processes run on CPU with the gloo backend.
# SIGTERM, SIGINT, SIGHUP, SIGQUIT and SIGUSR1 to this launcher are passed on to the workers,
# which save a checkpoint of the iteration in progress and exit (docs/cluster.md); the
# launcher waits SHUTDOWN_TIMEOUT seconds (default 300) for them before SIGKILL. Workers stop
# when this launcher is killed; --dist-timeout SECONDS bounds how long one waits for a
# stopped peer. No process started under this launcher outlives it: once torchrun is gone,
# the launcher waits (SHUTDOWN_TIMEOUT at most, then SIGKILL) for every process whose
# environment holds its VITDENSE_STOPPED_DIR (workers torchrun's agent left behind when a
# second signal ended its shutdown, their loader workers).
# Exit status: when torchrun failed and every worker of this node left its outcome in
# VITDENSE_STOPPED_DIR (a directory made here and removed on exit): 75 if any saved its stop
# checkpoint (torchrun itself exits 1 on a stop), 0 if all had finished training (a signal
# in a finished run's tail); torchrun's own status otherwise.
set -euo pipefail
NPROC=$1
SCRIPT=$2
source "$(dirname "$0")/python_env.sh"

if [ "${NNODES:-1}" = 1 ] && [ -z "${PORT:-}" ]; then
  RENDEZVOUS=(--standalone)
else
  VITDENSE_RUN_ID=${RUN_ID:-$(printf '%s\n' "${MASTER_ADDR:-127.0.0.1}:${PORT:-29500}" "${@:2}" \
                              | cksum | cut -d' ' -f1)}
  export VITDENSE_RUN_ID
  RENDEZVOUS=(--nnodes="${NNODES:-1}" --node_rank="${NODE_RANK:-0}"
              --master_addr="${MASTER_ADDR:-127.0.0.1}" --master_port="${PORT:-29500}")
fi
VITDENSE_STOPPED_DIR=$(mktemp -d "${TMPDIR:-/tmp}/vitdense-stopped.XXXXXX")
export VITDENSE_STOPPED_DIR
trap 'rm -rf "$VITDENSE_STOPPED_DIR"' EXIT
"$PY" -m torch.distributed.run "${RENDEZVOUS[@]}" \
    --signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 \
    --shutdown-timeout="${SHUTDOWN_TIMEOUT:-300}" \
    --nproc_per_node="$NPROC" "$SCRIPT" "${@:3}" --launcher pytorch &
TORCHRUN=$!
for SIGNAL in TERM INT HUP QUIT USR1; do
  trap "kill -$SIGNAL $TORCHRUN 2>/dev/null || true" "$SIGNAL"
done
# a trapped signal ends `wait` early: wait again while torchrun runs, then take its status
while kill -0 "$TORCHRUN" 2>/dev/null; do
  wait "$TORCHRUN" || true
done
STATUS=0
wait "$TORCHRUN" || STATUS=$?

# the processes whose environment (as they were started) holds this VITDENSE_STOPPED_DIR
survivors() {
  local environ variable pid
  for environ in /proc/[0-9]*/environ; do
    while IFS= read -r -d '' variable; do
      if [ "$variable" = "VITDENSE_STOPPED_DIR=$VITDENSE_STOPPED_DIR" ]; then
        pid=${environ#/proc/}
        echo "${pid%/environ}"
        break
      fi
    done 2>/dev/null < "$environ" || true
  done
}
DEADLINE=$((SECONDS + ${SHUTDOWN_TIMEOUT:-300}))
while [ -n "$(survivors)" ] && [ "$SECONDS" -lt "$DEADLINE" ]; do
  sleep 0.2
done
LEFT=$(survivors)
if [ -n "$LEFT" ]; then
  echo "$(basename "$0"): SIGKILL to the processes left after ${SHUTDOWN_TIMEOUT:-300} s:" $LEFT >&2
  # shellcheck disable=SC2086
  kill -KILL $LEFT 2>/dev/null || true
fi

count() { find "$VITDENSE_STOPPED_DIR" -mindepth 1 -maxdepth 1 -name "*.$1" | wc -l | tr -d " "; }
STOPPED=$(count stopped)
FINISHED=$(count finished)
if [ "$STATUS" != 0 ] && [ $((STOPPED + FINISHED)) = "$NPROC" ]; then
  if [ "$STOPPED" != 0 ]; then
    exit 75  # PREEMPTED_EXIT_CODE of vitdense/engine/hooks/preemption.py
  fi
  exit 0
fi
exit "$STATUS"
