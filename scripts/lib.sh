# Shared helpers for scripts/*.sh (sourced, not run).

# Repo root and the shared data folder (real corpora; never copied into the project).
TFIXUP_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
: "${TFIXUP_SHARED_DATA:=$TFIXUP_ROOT/../shared/data}"

# The scripts run this checkout's code: its plugin (--user-dir $TFIXUP_ROOT/fairseq_tfixup)
# and its experiment code (python -m pipeline ...), whatever is installed.
export PYTHONPATH=$TFIXUP_ROOT${PYTHONPATH:+:$PYTHONPATH}

die() { echo "error: $*" >&2; exit 1; }
log() { echo "[$(date +%H:%M:%S)] $*" >&2; }

# Activate the project's virtual environment if there is one and no fairseq is on PATH.
use_venv() {
  if ! command -v fairseq-train >/dev/null 2>&1 && [ -f "$TFIXUP_ROOT/.venv/bin/activate" ]; then
    # shellcheck disable=SC1091
    . "$TFIXUP_ROOT/.venv/bin/activate"
  fi
  command -v fairseq-train >/dev/null 2>&1 || die "fairseq is not installed: run 'bash scripts/install.sh' first"
}

# Run "$@" to produce directory $1's content in a temp sibling, then move it into place.
# A step whose output exists is skipped; a failed step leaves nothing behind.
# usage: build_dir DEST CMD...   (CMD gets the temp dir as its last argument)
build_dir() {
  local dest=$1; shift
  if [ -e "$dest" ]; then log "exists, skipping: $dest"; return 0; fi
  local tmp="$dest.tmp.$$"
  rm -rf "$tmp"; mkdir -p "$tmp"
  if "$@" "$tmp"; then
    mv "$tmp" "$dest"
  else
    local rc=$?; rm -rf "$tmp"; die "step failed ($rc): $* -> $dest"
  fi
}

# First N lines of stdin (all when N is 0). Reads to the end, so that the
# writer of a pipe never dies of SIGPIPE under pipefail.
head_n() { awk -v n="$1" 'n == 0 || NR <= n'; }
