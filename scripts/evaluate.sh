#!/usr/bin/env bash
# Evaluate one trained experiment: average the last K checkpoints (K chosen on
# the VALID set), translate the test set with the config's beam and length
# penalty, and score it (tokenized BLEU and detokenized sacreBLEU + signature).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/pipeline-lib.sh"

usage() {
  cat <<USAGE
usage: $0 [options] EXPERIMENT DATA_DIR OUT_DIR

OUT_DIR is the training output of scripts/train.sh (OUT_DIR/checkpoints). Writes
OUT_DIR/eval/: averaged.pt, averaging.json (valid loss of each K tried),
generate-SUBSET.txt (fairseq-generate output) and results.json.
Config values (BEAM, LENPEN, AVG_CANDIDATES, ...) can be overridden by env or --set.

  --cpu             run on CPU
  --subset NAME     subset to translate and score (default test)
  --max-tokens N    tokens per generation batch (default \$EVAL_MAX_TOKENS or 8000)
Hypotheses are capped at MAX_LEN_A * source length + MAX_LEN_B tokens (default 1.2 and 10,
as fairseq's translation example): an undertrained model would otherwise write 200
tokens per sentence and generation would take many times longer.
  --set KEY=VALUE   override a config value (repeatable)
  --dry-run         print the commands and exit
  -h, --help        this text
USAGE
}

CPU=0; SUBSET=test; EVAL_MAX_TOKENS=${EVAL_MAX_TOKENS:-8000}; DRY_RUN=0; POS=()
MAX_LEN_A=${MAX_LEN_A:-1.2}; MAX_LEN_B=${MAX_LEN_B:-10}
while [ $# -gt 0 ]; do
  case $1 in
    --cpu) CPU=1; shift;;
    --subset) SUBSET=$2; shift 2;;
    --max-tokens) EVAL_MAX_TOKENS=$2; shift 2;;
    --set) apply_set "$2"; shift 2;;
    --dry-run) DRY_RUN=1; shift;;
    -h|--help) usage; exit 0;;
    -*) usage >&2; die "unknown option: $1";;
    *) POS+=("$1"); shift;;
  esac
done
[ ${#POS[@]} -eq 3 ] || { usage >&2; die "expected EXPERIMENT DATA_DIR OUT_DIR, got ${#POS[@]} arguments"; }
load_experiment "${POS[0]}"
DATA=${POS[1]}; OUT=${POS[2]}; EVAL=$OUT/eval
# --required-batch-size-multiple 1: with fairseq's default of 8, batch_by_size (fairseq
# 0.12.x, data_utils_fast) silently drops the last sentences of a subset (measured: 4 of
# 100 IWSLT test sentences), and BLEU would be computed on part of the test set
common=(--user-dir "$TFIXUP_ROOT/fairseq_tfixup" --task translation --source-lang "$SRC" --target-lang "$TGT"
        --max-tokens "$EVAL_MAX_TOKENS" --required-batch-size-multiple 1)
[ "$CPU" = 1 ] && common+=(--cpu)
[ "$CPU" = 0 ] && [ "$FP16" = 1 ] && common+=(--fp16)
average_cmd=(python -m fairseq_tfixup.pipeline average --ckpt-dir "$OUT/checkpoints" --candidates "$AVG_CANDIDATES"
             --data "$DATA" --out "$EVAL/averaged.pt" --json "$EVAL/averaging.json" -- "${common[@]}")
generate_cmd=(fairseq-generate "$DATA" --path "$EVAL/averaged.pt" --gen-subset "$SUBSET"
              --beam "$BEAM" --lenpen "$LENPEN" --max-len-a "$MAX_LEN_A" --max-len-b "$MAX_LEN_B"
              --remove-bpe "${common[@]}")
results_cmd=(python -m fairseq_tfixup.pipeline results --experiment "$EXPERIMENT" --generate "$EVAL/generate-$SUBSET.txt"
             --checkpoint "$EVAL/averaged.pt" --train-dir "$OUT" --raw-refs "$DATA/$SUBSET.raw.$TGT"
             --average-json "$EVAL/averaging.json" --subset "$SUBSET" --out "$EVAL/results.json")
if [ "$DRY_RUN" = 1 ]; then
  for c in average_cmd generate_cmd results_cmd; do
    declare -n ref=$c; printf '%q ' "${ref[@]}" | sed 's/ $//'; echo
  done
  exit 0
fi
[ -d "$DATA" ] || die "data dir not found: $DATA"
[ -f "$OUT/checkpoints/checkpoint_last.pt" ] || die "no trained model: $OUT/checkpoints/checkpoint_last.pt (run scripts/train.sh first)"
use_venv
mkdir -p "$EVAL"
cd "$TFIXUP_ROOT"  # python -m fairseq_tfixup.pipeline from this checkout

# 1. average (skipped when newer than the last checkpoint)
# A step is redone unless its output is newer than its input and was made by the
# same command (recorded next to it): a changed beam, K or checkpoint redoes it.
same_cmd() {  # STAMP CMD...
  [ -f "$1" ] && [ "$(cat "$1")" = "$(printf '%q ' "${@:2}")" ]
}
stamp() { printf '%q ' "${@:2}" > "$1"; }
if ! { [ "$EVAL/averaged.pt" -nt "$OUT/checkpoints/checkpoint_last.pt" ] && [ -f "$EVAL/averaging.json" ] \
       && same_cmd "$EVAL/averaged.cmd" "${average_cmd[@]}"; }; then
  log "averaging: K in {$AVG_CANDIDATES}, chosen on $DATA valid"
  rm -f "$EVAL/averaged.cmd"
  "${average_cmd[@]}"
  stamp "$EVAL/averaged.cmd" "${average_cmd[@]}"
fi
# 2. translate (written to a temp name, moved into place when complete)
if ! { [ "$EVAL/generate-$SUBSET.txt" -nt "$EVAL/averaged.pt" ] \
       && same_cmd "$EVAL/generate-$SUBSET.cmd" "${generate_cmd[@]}"; }; then
  log "fairseq-generate $SUBSET: beam $BEAM, lenpen $LENPEN"
  rm -f "$EVAL/generate-$SUBSET.cmd"
  "${generate_cmd[@]}" > "$EVAL/generate-$SUBSET.txt.tmp" 2> "$EVAL/generate-$SUBSET.log" \
    || { rm -f "$EVAL/generate-$SUBSET.txt.tmp"; die "fairseq-generate failed; see $EVAL/generate-$SUBSET.log"; }
  mv "$EVAL/generate-$SUBSET.txt.tmp" "$EVAL/generate-$SUBSET.txt"
  stamp "$EVAL/generate-$SUBSET.cmd" "${generate_cmd[@]}"
fi
# 3. score -> results.json (atomic)
"${results_cmd[@]}"
