#!/usr/bin/env bash
# Make sure the environment exists (tools/install.sh --deploy: idempotent, seconds when warm;
# with the deployment extras, so that the export parity tests run too), then run the test
# suite.  Extra arguments go to pytest.  Exits non-zero when any test fails; pytest's "no
# tests collected" (exit 5) counts as success so an empty selection is not an error.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VITDENSE_VENV:-$ROOT/.venv}"

bash "$ROOT/tools/install.sh" --deploy

cd "$ROOT"
printf '\n[vitdense tests %s] pytest\n' "$(date +%H:%M:%S)"
set +e
"$VENV/bin/python" -m pytest -q -p no:cacheprovider -rfEs tests "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo '[vitdense tests] pytest collected no tests (exit 5): nothing failed'
  exit 0
fi
exit "$rc"
