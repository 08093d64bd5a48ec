#!/usr/bin/env bash
# Multi-process training: dist_train.sh CONFIG NPROC [train.py args...] (see torchrun.sh).
set -euo pipefail
exec bash "$(dirname "$0")/torchrun.sh" "$2" "$(dirname "$0")/train.py" "$1" "${@:3}"
