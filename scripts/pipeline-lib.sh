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

# What the terminal shows of fairseq's output (harness/fairseq_log.py's quiet: short progress lines
# with an ETA, fairseq's noise dropped); the log file keeps everything. QUIET=0 shows everything.
quiet() {  # [MAX_UPDATE [MAX_EPOCH]]
  if [ "${QUIET:-1}" = 0 ]; then cat; return; fi
  python3 -m harness.fairseq_log quiet --max-update "${1:-0}" --max-epoch "${2:-0}"
}
# Python warnings of dependencies off in what the scripts run (the plugin's own errors stay)
export PYTHONWARNINGS=${PYTHONWARNINGS:-ignore::DeprecationWarning,ignore::FutureWarning}
