# Helpers shared by the reproduction scripts (train/evaluate/tables); sourced after lib.sh.

TFIXUP_CONFIGS=${TFIXUP_CONFIGS:-$TFIXUP_ROOT/configs}

# Source configs/NAME.sh; a variable already set in the environment (or by a
# --set flag) wins over the file, so every knob can be overridden for one run.
load_experiment() {
  local name=$1 file key
  case $name in */*|*.sh) file=$name;; *) file=$TFIXUP_CONFIGS/$name.sh;; esac
  [ -f "$file" ] || die "unknown experiment '$name' (no $file; see ls $TFIXUP_CONFIGS)"
  local -A keep=()
  for key in $(sed -n 's/^\([A-Z_][A-Z0-9_]*\)=.*/\1/p' "$file"); do
    if [ -n "${!key+x}" ]; then keep[$key]=${!key}; fi
  done
  # shellcheck disable=SC1090
  . "$file"
  for key in "${!keep[@]}"; do printf -v "$key" '%s' "${keep[$key]}"; done
  EXPERIMENT=$(basename "$file" .sh)
}

# --set KEY=VALUE: export KEY so that load_experiment keeps it.
apply_set() {
  case $1 in
    [A-Z_]*=*) export "${1%%=*}=${1#*=}";;
    *) die "--set expects KEY=VALUE, got '$1'";;
  esac
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

# All experiment names, one per line.
list_experiments() { (cd "$TFIXUP_CONFIGS" && ls -- *.sh | sed 's/\.sh$//'); }
