# Shared helpers for scripts/*.sh (sourced, not run).

# Repo root and the shared data folder (real corpora; never copied into the project).
TFIXUP_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
: "${TFIXUP_SHARED_DATA:=$TFIXUP_ROOT/../shared/data}"

# The scripts run this checkout's code: its plugin (--user-dir $TFIXUP_ROOT/fairseq_tfixup)
# and its experiment code (python -m harness ...), whatever is installed.
export PYTHONPATH=$TFIXUP_ROOT${PYTHONPATH:+:$PYTHONPATH}

# a failure inside $(...) fails the command that uses it (bash >= 4.4)
shopt -s inherit_errexit

die() { STEP=""; echo "error: $*" >&2; exit 1; }
log() { echo "[$(date +%H:%M:%S)] $*" >&2; }
quote() { printf '%q ' "$@" | sed 's/ $//'; }  # a command line as one shell-quoted string

# A script's options: --NAME VALUE, for each NAME in VALUES, sets the variable NAME in upper case with
# _ for - (--train-lines N sets TRAIN_LINES; an array gets VALUE appended: a repeatable option);
# --NAME, for each NAME in SWITCHES, sets it to 1; -h/--help prints usage; after "--" the rest goes
# to the array REST_ARRAY (where the script takes one); a word not starting with "-" is appended to
# the array POS_ARRAY (where the script takes one; REST_ARRAY "" for none). Anything else: usage and
# one line naming it.
read_options() {  # "VALUES" "SWITCHES" [REST_ARRAY [POS_ARRAY]] -- ARGS...
  local values=" $1 " switches=" $2 " rest="" pos="" name; shift 2
  [ "$1" = -- ] || { rest=$1; shift; }
  [ "$1" = -- ] || { pos=$1; shift; }
  shift
  while [ $# -gt 0 ]; do
    name=${1#--}; name=${name^^}; name=${name//-/_}
    if [ "$1" = -h ] || [ "$1" = --help ]; then
      usage; exit 0
    elif [ "$1" = -- ] && [ -n "$rest" ]; then
      local -n _rest=$rest; _rest=("${@:2}"); return 0
    elif [[ $1 == --?* && $values == *" ${1#--} "* ]]; then
      [ $# -ge 2 ] || { usage >&2; die "$1 needs a value"; }
      if [[ $(declare -p "$name" 2>/dev/null) == "declare -a"* ]]; then
        local -n _list=$name; _list+=("$2"); unset -n _list
      else
        printf -v "$name" '%s' "$2"
      fi
      shift 2
    elif [[ $1 == --?* && $switches == *" ${1#--} "* ]]; then
      printf -v "$name" 1; shift
    elif [ -n "$pos" ] && [[ $1 != -* ]]; then
      local -n _pos=$pos; _pos+=("$1"); unset -n _pos; shift
    else
      usage >&2; die "unknown option: $1"
    fi
  done
}

# awk over a live stream (install.sh: pip's output): line by line. mawk (Debian's default awk)
# reads a pipe in large blocks, so without -W interactive progress lines arrive minutes late.
stream_awk() {
  if grep -q mawk <<< "$(awk -W version 2>/dev/null)"; then awk -W interactive "$@"; else awk "$@"; fi
}

# fairseq-train processes running on this machine (other jobs', on a shared machine): a process whose
# program (first word, or the script its interpreter runs) is fairseq-train, or python -m fairseq_cli.train;
# stopped (state T) and ended (Z) ones use no core.
fairseq_train_count() {
  ps -e -o stat=,args= 2>/dev/null | awk '$1 ~ /^[TZ]/ { next }
    { for (i = 2; i <= 4 && i <= NF; i++)
      if ($i ~ /(^|\/)fairseq-train$/ || ($i == "fairseq_cli.train" && $(i - 1) == "-m")) { n++; break } }
    END { print n + 0 }'
}

# Torch's threads per process (OMP_NUM_THREADS, exported): as the user set it, else one per core shared
# with the fairseq-train processes already running and the PROCS this job starts (default 1), at least 1.
# More threads than cores (two trainings each taking every core) ran 10x slower than one training alone.
# One line says the choice; a script called by one that chose (quickstart.sh -> train.sh) says nothing.
set_threads() {  # [PROCS]
  [ -z "${TFIXUP_THREADS:-}" ] || [ "${OMP_NUM_THREADS:-}" != "$TFIXUP_THREADS" ] || return 0
  local n why
  if [ -n "${OMP_NUM_THREADS:-}" ]; then
    n=$OMP_NUM_THREADS; why="OMP_NUM_THREADS as set"
    [[ $n =~ ^[1-9][0-9]*$ ]] || die "OMP_NUM_THREADS must be a whole number of threads (1 or more), got '$n'"
  else
    local cores others
    cores=$(nproc 2>/dev/null || echo 1); others=$(fairseq_train_count)
    n=$((cores / (others + ${1:-1}))); [ "$n" -ge 1 ] || n=1
    why="$cores cores, $others other fairseq-train process(es) running; OMP_NUM_THREADS=N to choose"
  fi
  export OMP_NUM_THREADS=$n TFIXUP_THREADS=$n
  log "torch threads: $n per process ($why)"
}

# Activate the project's virtual environment if there is one and no fairseq is on PATH.
use_venv() {
  if ! command -v fairseq-train >/dev/null 2>&1 && [ -f "$TFIXUP_ROOT/.venv/bin/activate" ]; then
    # shellcheck disable=SC1091
    . "$TFIXUP_ROOT/.venv/bin/activate"
  fi
  command -v fairseq-train >/dev/null 2>&1 || die "fairseq is not installed: run 'bash scripts/install.sh' first"
}

# "${PARENT_DEATH[@]}" CMD...: CMD is killed when the process that started it dies, even by
# kill -9, which no trap sees (Linux's parent-death signal, set by util-linux setpriv, or else
# by prctl from Python). train.sh's fairseq-train and evaluate.sh's harness step use it (a script's
# worker is stopped by its supervisor's guard instead: supervise, below).
# (a here-string, not a pipe: grep -q ends at its match, and under pipefail the writer's SIGPIPE failed the test)
if grep -q -- --pdeathsig <<< "$(setpriv --help 2>/dev/null)"; then
  PARENT_DEATH=(setpriv --pdeathsig KILL)
elif [ "$(uname -s)" = Linux ]; then
  PARENT_DEATH=(python3 -c 'import ctypes, os, sys
ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL
os.execvp(sys.argv[1], sys.argv[1:])')
else
  PARENT_DEATH=()
fi

# Signals. bash runs a trap only after the foreground command ends, so a script
# busy in `fairseq-train | tee` or `xzcat | subword-nmt` would ignore SIGTERM for
# minutes. `supervise "$@"` (first line of a script) turns the script's process into
# harness/proc.py's supervisor, which reruns the script as its child and waits for it:
# a SIGTERM/SIGINT to the script's PID goes at once, as SIGTERM, to the child's whole
# process tree (same process group: a kill of the group by a caller still reaches
# everything). The child's own traps book and clean up; whatever is left after
# TFIXUP_STOP_SECONDS (default 10) is killed. The supervisor killed outright
# (kill -9) takes the tree with it (its guard).
supervise() {
  [ "${TFIXUP_SUPERVISOR:-}" = "$PPID" ] && return 0  # we are the child: do the work
  exec python3 -m harness.proc supervise -- bash "$0" "$@"
}

# Temp paths removed on any exit; STEP names what is running, so that a step that
# fails under set -e (a pipeline included, by pipefail) ends with one line naming it.
TMP_PATHS=(); STEP=""
on_exit() {  # [EXIT_CODE] (default $?: a trap that runs commands before on_exit passes the script's)
  local rc=${1:-$?}
  [ ${#TMP_PATHS[@]} -eq 0 ] || rm -rf "${TMP_PATHS[@]}"
  if [ "$rc" != 0 ] && [ -n "$STEP" ]; then
    echo "error: $STEP failed (exit $rc); nothing published" >&2
  fi
}
trap on_exit EXIT
# SIGTERM/SIGINT/SIGHUP (a closed terminal): one line saying what was kept (KEPT: a script that keeps
# finished steps says so)
KEPT="nothing published"
on_signal() {  # EXIT_CODE
  trap '' TERM INT HUP  # Ctrl-C sends SIGINT to the script and its supervisor's SIGTERM follows: one line
  STEP=""; log "interrupted: $KEPT"; exit "$1"
}
trap 'on_signal 143' TERM
trap 'on_signal 130' INT
trap 'on_signal 129' HUP
step() { STEP=$*; log "$*"; }

# DIR (or, while it does not exist, the folder it would be made in) takes new files: else one line
# naming it, before anything is written (a read-only file system failed later, at a lock or inside
# a Python step's traceback). Makes nothing.
need_writable() {  # DIR WHAT
  local d=$1 t
  while [ ! -e "$d" ]; do d=$(dirname "$d"); done
  t=$(mktemp -p "$d" .write-test.XXXXXX 2>/dev/null) \
    || die "$2 $1 is not writable (read-only file system or no permission): make it writable or choose another folder, then rerun"
  rm -f "$t"
}

# DIR becomes an empty temp folder, removed on exit unless published.
tmp_dir() {  # DIR
  remove_stale_tmp "$1"
  rm -rf "$1"; mkdir -p "$1"
  TMP_PATHS+=("$1")
}

# DEST.tmp.PID folders of runs killed outright (kill -9: no trap ran), once that PID has ended.
remove_stale_tmp() {  # DEST.tmp.PID
  local base=${1%.tmp.*} f pid
  [ "$base" != "$1" ] || return 0
  for f in "$base".tmp.*; do
    pid=${f##*.tmp.}
    [[ $pid =~ ^[0-9]+$ ]] && [ -d "$f" ] || continue
    # a killed run's process may linger as a zombie until PID 1 reaps it: ended all the same
    [[ $(ps -o stat= -p "$pid" 2>/dev/null || true) != [!Z]* ]] || continue
    log "removing $f (left by a run that was killed; its PID $pid has ended)"
    rm -rf "$f"
  done
}

# Move a finished temp dir into place; an older DEST is replaced only at this point.
publish_dir() {  # TMP DEST
  mkdir -p "$(dirname "$2")"
  if [ -e "$2" ]; then rm -rf "$2.old.$$"; mv "$2" "$2.old.$$"; TMP_PATHS+=("$2.old.$$"); fi
  mv "$1" "$2"
}

# Run CMD to produce directory DEST's content in a temp sibling, then move it into place.
# A step whose output exists and was made with the same PARAMS (DEST/.params) is skipped;
# other PARAMS redo it. The step runs under set -e (never inside an `if`, which would
# switch set -e off): its first failing command ends the script with STEP named, and
# the temp dir is removed on exit.
# usage: build_dir DEST PARAMS CMD...   (CMD gets the temp dir as its last argument)
build_dir() {
  local dest=$1 params=$2; shift 2
  if [ -e "$dest" ]; then
    if [ -f "$dest/.params" ] && [ "$(cat "$dest/.params")" = "$params" ]; then
      log "exists, skipping: $dest"; return 0
    fi
    log "made with other parameters, redoing: $dest"
    rm -rf "$dest"
  fi
  local tmp="$dest.tmp.$$"
  tmp_dir "$tmp"
  STEP="$1 -> $dest"
  "$@" "$tmp"
  STEP=""
  printf '%s\n' "$params" > "$tmp/.params"
  publish_dir "$tmp" "$dest"
}

# First N lines of stdin (all when N is 0). Reads to the end, so that the
# writer of a pipe never dies of SIGPIPE under pipefail.
head_n() { awk -v n="$1" 'n == 0 || NR <= n'; }
