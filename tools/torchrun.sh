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
# stopped peer.
# Exit status: 75 when torchrun failed and every worker of this node saved its stop
# checkpoint (each leaves a file in VITDENSE_STOPPED_DIR, a directory made here and removed
# on exit; torchrun itself exits 1 on a stop), torchrun's own status otherwise.
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
STOPPED=$(find "$VITDENSE_STOPPED_DIR" -mindepth 1 -maxdepth 1 | wc -l | tr -d " ")
if [ "$STATUS" != 0 ] && [ "$STOPPED" = "$NPROC" ]; then
  exit 75  # PREEMPTED_EXIT_CODE of vitdense/engine/hooks/preemption.py
fi
exit "$STATUS"
