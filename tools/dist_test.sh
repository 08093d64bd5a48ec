#!/usr/bin/env bash
# Multi-process evaluation: dist_test.sh CONFIG CHECKPOINT NPROC [test.py args...]
# (see torchrun.sh).
set -euo pipefail
exec bash "$(dirname "$0")/torchrun.sh" "$3" "$(dirname "$0")/test.py" "$1" "$2" "${@:4}"
