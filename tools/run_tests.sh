#!/usr/bin/env bash
# Make sure the environment exists (tools/install.sh --deploy: idempotent, seconds when warm;
# with the deployment extras, so that the export parity tests run too), then run the test
# suite.  Extra arguments go to pytest.  Exits with pytest's status: non-zero when any test
# fails, and 5 when no test ran (nothing collected, or every test deselected), so a
# selection that matches nothing fails the run instead of passing it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VITDENSE_VENV:-$ROOT/.venv}"

bash "$ROOT/tools/install.sh" --deploy

cd "$ROOT"
printf '\n[vitdense tests %s] pytest\n' "$(date +%H:%M:%S)"
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider -rfEs tests "$@"
