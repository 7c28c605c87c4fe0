# Helpers shared by the reproduction scripts (train/evaluate/tables); sourced after lib.sh.
# Configs are read by harness/config.py only; the scripts ask it for values and argument
# lists, NUL-separated so that any value (spaces, quotes) arrives as one word.

# config_get ARRAY EXPERIMENT|--run OUT_DIR [--set K=V ...] -- KEY...: fill ARRAY with the values
config_get() {
  local -n _into=$1; shift
  local args=() keys=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do args+=("$1"); shift; done
  shift; keys=("$@")
  local tmp; tmp=$(mktemp)
  python3 -m harness.config get "${args[@]}" --keys "${keys[@]}" > "$tmp" || { rm -f "$tmp"; exit 1; }
  mapfile -d '' -t _into < "$tmp"; rm -f "$tmp"
}

# Number of visible CUDA GPUs; NGPUS overrides. CUDA_VISIBLE_DEVICES is honoured.
gpu_count() {
  if [ -n "${NGPUS:-}" ]; then echo "$NGPUS"; return; fi
  if ! command -v nvidia-smi >/dev/null 2>&1; then echo 0; return; fi
  if [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then
    local ids=${CUDA_VISIBLE_DEVICES//[^,0-9a-zA-Z-]/}
    [ -z "$ids" ] && { echo 0; return; }
    echo "$ids" | tr ',' '\n' | grep -c .
    return
  fi
  nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true
}

# What the terminal shows of fairseq's output; the log file keeps everything. Dropped:
# the one-line config dump (~15 KB), "Please install tensorboardX", Python warnings
# of fairseq's dependencies (hydra/omegaconf deprecations) and their source lines.
# QUIET=0 shows everything.
# A training line also gets the ETA at its rate (ups): to MAX_UPDATE, or else to the end of
# epoch MAX_EPOCH (a json line's "update" is epochs done, e.g. 5.645, so the run's total is
# num_updates * MAX_EPOCH / update).
quiet() {  # [MAX_UPDATE [MAX_EPOCH]]
  if [ "${QUIET:-1}" = 0 ]; then cat; return; fi
  stream_awk -v max="${1:-0}" -v maxep="${2:-0}" '/\| \{.?_name.?: / || /Please install tensorboardX/ { next }
       # a dependency'"'"'s warning: "/.../site-packages/M.py:N: Category: text", more text lines,
       # then its source line (indented); "sys:1: ..." ones have none and end at a log line
       /^(\/[^ ]*site-packages\/[^ ]*|sys):[0-9]+: [A-Za-z]*Warning: / { skip = 1; next }
       skip && /^  / { skip = 0; next }
       skip && (/^[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] / || /^Traceback/ || /^\[/) { skip = 0 }
       skip { next }
       { line = $0
         # num_updates=N / ups=R (--log-format simple) or "num_updates": "N" (json)
         if ((max > 0 || maxep > 0) && match($0, /[ ,{"]num_updates"?[=:] ?"?[0-9]+/)) {
           n = substr($0, RSTART, RLENGTH); gsub(/[^0-9]/, "", n); n += 0
           total = max
           if (total == 0 && match($0, /"update": "?[0-9.]+/)) {
             ep = substr($0, RSTART, RLENGTH); gsub(/[^0-9.]/, "", ep); ep += 0
             if (ep > 0) total = int(n * maxep / ep + 0.5)
           }
           if (total > 0 && match($0, /[ ,{"]ups"?[=:] ?"?[0-9.]+/)) {
             ups = substr($0, RSTART, RLENGTH); gsub(/[^0-9.]/, "", ups); ups += 0
             if (ups > 0 && n < total)
               line = line sprintf(" | update %d of %s%d, ETA %.0f min", n, max > 0 ? "" : "~", total, (total - n) / ups / 60)
           }
         }
         print line; fflush() }'
}
# Python warnings of dependencies off in what the scripts run (the plugin's own errors stay)
export PYTHONWARNINGS=${PYTHONWARNINGS:-ignore::DeprecationWarning,ignore::FutureWarning}
