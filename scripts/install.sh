#!/usr/bin/env bash
# Create .venv and install fairseq-tfixup with its test extra (idempotent).
# CPU torch by default; set TORCH_SPEC (e.g. "torch==2.13.0") to choose another.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

usage() {
  cat <<USAGE
usage: $0 [--venv DIR]
  --venv DIR   virtual environment to create/use (default \$VENV or $TFIXUP_ROOT/.venv)
Environment: PYTHON (default python3), TORCH_SPEC (default torch==2.13.0).
fairseq needs torch at build time, so torch is installed first and pinned for
pip's isolated build with PIP_CONSTRAINT (.ci/constraints.txt).
USAGE
}
VENV=${VENV:-$TFIXUP_ROOT/.venv}; PYTHON=${PYTHON:-python3}; TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
while [ $# -gt 0 ]; do
  case $1 in
    --venv) VENV=$2; shift 2;;
    -h|--help) usage; exit 0;;
    *) usage >&2; die "unknown option: $1";;
  esac
done

marker=$VENV/.tfixup-deps-installed
if [ -f "$marker" ] && [ "$marker" -nt "$TFIXUP_ROOT/setup.py" ]; then
  # shellcheck disable=SC1091
  . "$VENV/bin/activate"
  log "dependencies already installed in $VENV"
else
  [ -d "$VENV" ] || "$PYTHON" -m venv "$VENV"
  # shellcheck disable=SC1091
  . "$VENV/bin/activate"
  log "installing into $VENV ($(python --version))"
  # fairseq 0.12.2 (Python <= 3.10) needs omegaconf 2.0.x, whose metadata pip >= 24.1 rejects
  if python -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then pip_spec=pip; else pip_spec="pip<24.1"; fi
  python -m pip install -q --upgrade "$pip_spec" wheel setuptools
  python -m pip install -q "$TORCH_SPEC" cython numpy
  constraints=$(mktemp); trap 'rm -f "$constraints"' EXIT
  echo "$TORCH_SPEC" > "$constraints"
  PIP_CONSTRAINT=$constraints python -m pip install -q "$TFIXUP_ROOT[test]"
  touch "$marker"
fi
# The project itself, every time (seconds): a regular, non-editable install puts
# fairseq_tfixup next to fairseq, where `--user-dir fairseq_tfixup` finds it from any directory.
python -m pip install -q --no-deps --no-build-isolation --force-reinstall "$TFIXUP_ROOT"
rm -rf "$TFIXUP_ROOT/build"
python -c "import fairseq, fairseq_tfixup, torch; print('fairseq', fairseq.__version__, 'torch', torch.__version__)"
