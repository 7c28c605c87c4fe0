#!/usr/bin/env bash
# Install (once) and run the test suite. Extra arguments go to pytest.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
bash "$TFIXUP_ROOT/scripts/install.sh"
# shellcheck disable=SC1091
. "${VENV:-$TFIXUP_ROOT/.venv}/bin/activate"
cd "$TFIXUP_ROOT"
python -m pytest -q tests "$@"
