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
# the one-line config dump (~15 KB), the model's structure (a line per module), fairseq's
# per-epoch data-loader notes, "Please install tensorboardX", Python warnings of fairseq's
# dependencies (hydra/omegaconf deprecations) and their source lines. Training progress
# (fairseq's train_inner lines, JSON or simple) is shown as one short line:
#   DATE TIME | epoch E | update N of TOTAL | loss L | lr LR | U updates/s | ETA M min
# and a JSON epoch summary (train, valid) as "epoch E done: ..." / "epoch E valid: ...".
# The ETA is at the mean rate since this run's first progress line (each line's "ups" is the rate of
# its interval alone, which other jobs on the machine swing many-fold): to MAX_UPDATE, or else to the end
# of epoch MAX_EPOCH (a json line's "update" is epochs done, e.g. 5.645, so the run's total is
# num_updates * MAX_EPOCH / update).
# QUIET=0 shows everything as fairseq wrote it.
quiet() {  # [MAX_UPDATE [MAX_EPOCH]]
  if [ "${QUIET:-1}" = 0 ]; then cat; return; fi
  stream_awk -v max="${1:-0}" -v maxep="${2:-0}" '
       # a field of a progress line: "key": "value" (json) or key=value (simple); "" when absent
       function val(k,   v) {
         if (!match($0, "[ ,{\"]" k "\"?(=|: )\"?[^,\"} ]+")) return ""
         v = substr($0, RSTART + 1, RLENGTH - 1); sub(/^[^=:]*(=|: )"?/, "", v); return v
       }
       function stamp() { return ($0 ~ /^[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] /) ? substr($0, 1, 19) " | " : "" }
       /\| \{.?_name.?: / || /Please install tensorboardX/ { next }
       / \| fairseq\.tasks\.fairseq_task \| / || / \| fairseq\.data\.iterators \| / { next }
       # start-up bookkeeping (train.log keeps it): data loaded, devices, the model'"'"'s parts
       / \| INFO \| fairseq\.(data\.data_utils|tasks\.[a-z_]+) \| / { next }
       / \| INFO \| fairseq_cli\.train \| (task|criterion|num\. expert model params|training on|max tokens per device|begin dry-run|Start iterating)/ { next }
       / \| INFO \| fairseq\.trainer \| (detected shared parameter|Preparing to load checkpoint|loading train data|begin training epoch)/ { next }
       # the model printed by fairseq_cli.train: "... | Name(" then indented lines, then ")"
       / \| fairseq_cli\.train \| [A-Za-z0-9_]+\($/ { dump = 1; next }
       dump { if ($0 == ")") dump = 0; next }
       # a dependency'"'"'s warning: "/.../site-packages/M.py:N: Category: text", more text lines,
       # then its source line (indented); "sys:1: ..." ones have none and end at a log line
       /^(\/[^ ]*site-packages\/[^ ]*|sys):[0-9]+: [A-Za-z]*Warning: / { skip = 1; next }
       skip && /^  / { skip = 0; next }
       skip && (/^[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] / || /^Traceback/ || /^\[/) { skip = 0 }
       skip { next }
       / \| train_inner \| / && val("num_updates") != "" {
         n = val("num_updates") + 0; ups = val("ups") + 0; ep = val("epoch")
         # mean rate: updates over time summed across intervals (the first interval as long as the second)
         if (ups > 0) {
           if (!seen) { seen = 1; first_ups = ups }
           else if (n > prev) {
             if (!sum_n) { sum_n = n - prev; sum_t = (n - prev) / first_ups }
             sum_n += n - prev; sum_t += (n - prev) / ups
           }
           prev = n
         }
         rate = sum_n > 0 ? sum_n / sum_t : ups
         if (ep == "" && match($0, /epoch 0*[0-9]+:/)) { ep = substr($0, RSTART + 6, RLENGTH - 7) + 0 }
         total = max
         if (total == 0 && maxep > 0 && (done = val("update") + 0) > 0) total = int(n * maxep / done + 0.5)
         line = stamp() "epoch " ep " | update " n (total > 0 ? " of " (max > 0 ? "" : "~") total : "")
         if (val("loss") != "") line = line " | loss " val("loss")
         if (val("lr") != "") line = line " | lr " val("lr")
         if (val("ups") != "") line = line " | " val("ups") " updates/s"
         if (total > 0 && rate > 0 && n < total) line = line sprintf(" | ETA %.0f min", (total - n) / rate / 60)
         print line; fflush(); next }
       / \| train \| \{/ {
         print stamp() "epoch " val("epoch") " done: train loss " val("train_loss") ", " val("train_num_updates") \
           " updates, " val("train_ups") " updates/s"; fflush(); next }
       / \| valid \| \{/ {
         line = stamp() "epoch " val("epoch") " valid: loss " val("valid_loss")
         if (val("valid_bleu") != "") line = line ", BLEU " val("valid_bleu")
         if (val("valid_best_loss") != "") line = line " (best loss " val("valid_best_loss") ")"
         print line; fflush(); next }
       { print; fflush() }'
}
# Python warnings of dependencies off in what the scripts run (the plugin's own errors stay)
export PYTHONWARNINGS=${PYTHONWARNINGS:-ignore::DeprecationWarning,ignore::FutureWarning}
