#!/usr/bin/env bash
# Evaluate one trained experiment: average the last K checkpoints (K chosen on
# the VALID set), translate the test set with the run's beam and length penalty,
# and score it (tokenized BLEU and detokenized sacreBLEU + signature). Everything
# comes from the config the run trained with (OUT_DIR/config.resolved.json).
. "$(dirname "$0")/step.sh"  # set -euo pipefail, helpers, signals forwarded to children

usage() {
  cat <<USAGE
usage: $0 [options] EXPERIMENT DATA_DIR OUT_DIR

OUT_DIR is the training output of scripts/train.sh (OUT_DIR/checkpoints and
OUT_DIR/config.resolved.json, the config the run trained with; EXPERIMENT must be
the one it trained). Writes OUT_DIR/eval/: averaged.pt, averaging.json (valid loss
of each K tried), generate-SUBSET.txt (fairseq-generate output) and results.json
(the scores and the resolved config). Evaluation keys (BEAM, LENPEN, AVG_CANDIDATES,
COMPOUND_SPLIT, LOWERCASE, ...) can be overridden by --set or the environment.

  --cpu             run on CPU
  --subset NAME     subset to translate and score (default test)
  --max-tokens N    tokens per generation batch (default \$EVAL_MAX_TOKENS or 8000)
  --set KEY=VALUE   override an evaluation value (repeatable)
  --dry-run         print the commands and exit
  -h, --help        this text
Hypotheses are capped at MAX_LEN_A x source length + MAX_LEN_B tokens (environment;
default 1.2 and 10, as fairseq's translation example): an undertrained model would
otherwise write 200 tokens per sentence and generation would take many times longer.
While translating, a progress line (sentences so far / total) every PROGRESS_SECONDS
(environment; default 30).
USAGE
}

CPU=0; SUBSET=test; DRY_RUN=0; POS=(); SET=(); SETS=()
MAX_LEN_A=${MAX_LEN_A:-1.2}; MAX_LEN_B=${MAX_LEN_B:-10}

parse_options() {
  local MAX_TOKENS=${EVAL_MAX_TOKENS:-8000}  # --max-tokens; MAX_TOKENS is training's config key
  read_options "subset max-tokens set" "cpu dry-run" "" POS -- "$@"
  EVAL_MAX_TOKENS=$MAX_TOKENS
  local s; for s in "${SET[@]}"; do SETS+=(--set "$s"); done
  [ ${#POS[@]} -eq 3 ] || { usage >&2; die "expected EXPERIMENT DATA_DIR OUT_DIR, got ${#POS[@]} arguments"; }
}

build_commands() {
  local v=()
  config_get v "${POS[0]}" --run "$OUT" "${SETS[@]}" -- SRC TGT FP16 AVG_CANDIDATES BEAM LENPEN
  local src=${v[0]} tgt=${v[1]} fp16=${v[2]} candidates=${v[3]}
  SRC_LANG=$src; TGT_LANG=$tgt
  BEAM=${v[4]}; LENPEN=${v[5]}
  # --required-batch-size-multiple 1: with fairseq's default of 8, batch_by_size (fairseq
  # 0.12.x, data_utils_fast) silently drops the last sentences of a subset, and BLEU would be
  # computed on part of the test set (docs/measurements.md, "Evaluation")
  # --num-workers 0: no data-loader process. Validating and translating share one process, and the
  # validation's loader process made the next step wait for it to stop; a batch is made in far less
  # time than beam search takes to translate it.
  local common=(--user-dir "$TFIXUP_ROOT/fairseq_tfixup" --task translation --source-lang "$src" --target-lang "$tgt"
                --max-tokens "$EVAL_MAX_TOKENS" --required-batch-size-multiple 1 --num-workers 0)
  if [ "$CPU" = 1 ]; then common+=(--cpu); elif [ "$fp16" = 1 ]; then common+=(--fp16); fi
  AVERAGE_CMD=(python3 -m harness average --ckpt-dir "$OUT/checkpoints" --candidates "$candidates"
               --data "$DATA" --out "$EVAL/averaged.pt" --json "$EVAL/averaging.json" -- "${common[@]}")
  GENERATE_CMD=(fairseq-generate "$DATA" --path "$EVAL/averaged.pt" --gen-subset "$SUBSET"
                --beam "$BEAM" --lenpen "$LENPEN" --max-len-a "$MAX_LEN_A" --max-len-b "$MAX_LEN_B"
                --remove-bpe "${common[@]}")
  RESULTS_CMD=(python3 -m harness results --run "$OUT" "${SETS[@]}" --data "$DATA" --generate "$EVAL/generate-$SUBSET.txt"
               --checkpoint "$EVAL/averaged.pt" --raw-refs "$DATA/$SUBSET.raw.$tgt"
               --average-json "$EVAL/averaging.json" --subset "$SUBSET" --out "$EVAL/results.json")
}

# A step is redone unless its output is newer than its input and was made by the
# same command (recorded next to it): a changed beam, K or checkpoint redoes it.
same_cmd() {  # STAMP CMD...
  [ -f "$1" ] && [ "$(cat "$1")" = "$(quote "${@:2}")" ]
}
stamp() { quote "${@:2}" > "$1"; }

# Averaging and translating run in one Python process (python -m harness STEP ::: STEP): a
# fairseq-generate process of its own paid fairseq's import again. GENERATE_CMD is what runs,
# fairseq-generate's own code, and what --dry-run prints.
average_and_translate() {
  local steps=() out=$EVAL/generate-$SUBSET.txt average=1 translate=1
  if [ "$EVAL/averaged.pt" -nt "$OUT/checkpoints/checkpoint_last.pt" ] && [ -f "$EVAL/averaging.json" ] \
     && same_cmd "$EVAL/averaged.cmd" "${AVERAGE_CMD[@]}"; then
    average=0
  fi
  if [ "$average" = 0 ] && [ "$out" -nt "$EVAL/averaged.pt" ] \
     && same_cmd "$EVAL/generate-$SUBSET.cmd" "${GENERATE_CMD[@]}"; then
    translate=0
  fi
  if [ "$average" = 1 ]; then
    log "averaging, K chosen on $DATA valid"
    rm -f "$EVAL/averaged.cmd"
    steps+=("${AVERAGE_CMD[@]:3}" :::)
  fi
  if [ "$translate" = 1 ]; then
    rm -f "$EVAL/generate-$SUBSET.cmd"
    TMP_PATHS+=("$out.tmp")
    steps+=(generate --out "$out.tmp" --log "$EVAL/generate-$SUBSET.log"
            --message "fairseq-generate $SUBSET: beam $BEAM, lenpen $LENPEN" -- "${GENERATE_CMD[@]:1}")
  fi
  [ ${#steps[@]} -gt 0 ] || return 0
  # the harness step writes the progress lines itself (harness/generate.py): no loop here that a
  # killed evaluate.sh could leave running
  "${PARENT_DEATH[@]}" python3 -m harness "${steps[@]}" 2>&1 | quiet >&2
  [ "$average" = 0 ] || stamp "$EVAL/averaged.cmd" "${AVERAGE_CMD[@]}"
  if [ "$translate" = 1 ]; then
    mv "$out.tmp" "$out"
    stamp "$EVAL/generate-$SUBSET.cmd" "${GENERATE_CMD[@]}"
  fi
}

# Before fairseq is imported: the data has the dictionaries the run trained with and is whole
# (its manifest), and checkpoint_last.pt is intact (CRCs), safe (literals) and this run's model.
check_inputs() {
  python3 -m harness.config check-data --run "$OUT" "$DATA"
  python3 -m harness.manifest check "$DATA" || exit 1
  local expect=(); [ ! -f "$OUT/train_command.sh" ] || expect=(--expect "$OUT/train_command.sh")
  python3 -m harness updates "$OUT/checkpoints/checkpoint_last.pt" --check-crc "${expect[@]}" \
    --advise "$(quote bash "$0" "${ARGS[@]}")" > /dev/null
}

main() {
  ARGS=("$@")
  parse_options "$@"
  DATA=${POS[1]}; OUT=${POS[2]}; EVAL=$OUT/eval
  local name=()
  config_get name "${POS[0]}" -- EXPERIMENT  # an unknown experiment is named first
  if [ "$DRY_RUN" = 0 ]; then
    [ -d "$DATA" ] || die "data dir not found: $DATA"
    [ -f "$OUT/checkpoints/checkpoint_last.pt" ] \
      || die "no trained model: $OUT/checkpoints/checkpoint_last.pt (run scripts/train.sh first)"
  fi
  build_commands
  if [ "$DRY_RUN" = 1 ]; then
    local c
    for c in AVERAGE_CMD GENERATE_CMD RESULTS_CMD; do
      declare -n ref=$c; quote "${ref[@]}"; echo
    done
    exit 0
  fi
  use_venv
  need_writable "$EVAL" "the evaluation folder"  # before any step writes there
  check_inputs
  mkdir -p "$EVAL"
  average_and_translate
  "${RESULTS_CMD[@]}"  # score -> results.json (atomic)
}

main "$@"
