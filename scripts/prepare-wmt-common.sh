# Body of scripts/prepare-wmt*.sh (sourced after the caller sets DATASET, a row of
# scripts/wmt-datasets.tsv; its archives are its rows of scripts/wmt-archives.tsv). fairseq's
# examples/translation/prepare-wmt14en2de.sh with pip tools:
#   raw corpora -> normalize + tokenize -a (sacremoses) -> valid split (every 100th
#   pair) or a newstest dev set -> joint BPE (subword-nmt) -> clean (ratio 1.5, 1-250
#   tokens) -> fairseq-preprocess --joined-dictionary; raw test text kept for sacreBLEU.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
supervise "$@"
. "$(dirname "${BASH_SOURCE[0]}")/corpus-lib.sh"

# DATASET's settings (NAME SRC TGT PAIR BPE_TOKENS TEST_SET VALID_SET DESCRIPTION) and archives
# (ARCHIVES_LIST: "name|url|sha256"; CORPORA: the corpus each holds) from the two tables.
load_dataset() {
  local dir row n u s c
  dir=$(dirname "${BASH_SOURCE[0]}")
  row=$(awk -F'\t' -v d="$1" '$1 == d' "$dir/wmt-datasets.tsv")
  [ -n "$row" ] || die "no dataset '$1' in $dir/wmt-datasets.tsv"
  IFS=$'\t' read -r NAME SRC TGT BPE_TOKENS TEST_SET VALID_SET DESCRIPTION <<< "$row"
  PAIR=$SRC-$TGT; ARCHIVES_LIST=(); CORPORA=()
  while IFS=$'\t' read -r _ n u s c; do
    ARCHIVES_LIST+=("$n|$u|$s"); CORPORA+=("$c")
  done < <(awk -F'\t' -v d="$1" '$1 == d' "$dir/wmt-archives.tsv")
  [ ${#ARCHIVES_LIST[@]} -gt 0 ] || die "no archives of '$1' in $dir/wmt-archives.tsv"
}
load_dataset "$DATASET"

usage() {
  cat <<USAGE
usage: $0 [options]

$DESCRIPTION

Input, one of:
  (default)            download the archives below from their official locations (sha256 checked)
  --archives DIR       a local folder holding the same archive files (sha256 checked)
  --train-src FILE --train-tgt FILE
                       already extracted parallel training text ($SRC side, $TGT side; .gz/.xz ok)
Test/dev sets: --testsets DIR with newstestYYYY.$PAIR.LANG(.gz) files, else sacrebleu downloads them.

  --out DIR            destination data-bin (default data-bin/$NAME)
  --work DIR           intermediate files (default OUT.work; kept, steps resume from it)
  --test-set NAME      test set (default $TEST_SET)
  --valid-set NAME     dev set, or 'split' for every 100th training pair (default $VALID_SET)
  --bpe-tokens N       joint BPE merges (default $BPE_TOKENS)
  --pretokenized       training text is already Moses-tokenized (skip normalize/tokenize)
  --train-lines N      first N training pairs only (0 = all; for smoke tests)
  --test-lines N       first N test (and dev) sentences only (0 = all)
  --workers N          tokenizer/binarizer processes (default \$WORKERS or 4)
  -h, --help           this text

Archives (name, sha256, url):
$(for a in "${ARCHIVES_LIST[@]}"; do IFS='|' read -r n u s <<< "$a"; echo "  $n $s"; echo "      $u"; done)
Every step writes to a temp dir, is checked (parallel line counts, all BPE merges)
and moved into place: a rerun skips finished steps and never trusts a half-written
one; steps made with other parameters (e.g. --train-lines) are redone, and OUT
holds manifest.json (inputs with sha256, parameters, counts, <unk> rates).
  --max-unk-rate P     refuse the data when more than P % of valid/test tokens are <unk>
                       (default \$MAX_UNK_RATE or 5)
USAGE
}

OUT=""; WORK=""; ARCHIVES=""; TRAIN_SRC=""; TRAIN_TGT=""; TESTSETS=""; PRETOKENIZED=0
TRAIN_LINES=${TRAIN_LINES:-0}; TEST_LINES=${TEST_LINES:-0}; WORKERS=${WORKERS:-4}; MAX_UNK_RATE=${MAX_UNK_RATE:-5}
read_options "out work archives train-src train-tgt testsets test-set valid-set bpe-tokens train-lines test-lines \
  workers max-unk-rate" "pretokenized" -- "$@"
export WORKERS
OUT=${OUT:-data-bin/$NAME}; WORK=${WORK:-$OUT.work}
[ -z "$ARCHIVES" ] || [ -d "$ARCHIVES" ] || die "--archives: not a directory: $ARCHIVES"
[ -z "$TESTSETS" ] || [ -d "$TESTSETS" ] || die "--testsets: not a directory: $TESTSETS"
if [ -n "$TRAIN_SRC$TRAIN_TGT" ] && { [ -z "$TRAIN_SRC" ] || [ -z "$TRAIN_TGT" ]; }; then
  die "--train-src and --train-tgt go together"
fi
for f in $TRAIN_SRC $TRAIN_TGT; do [ -f "$f" ] || die "training text not found: $f"; done
# Everything that decides each step's output: other values redo the step and those after
RAW_PARAMS=$(manifest_params name "$NAME" src "$SRC" tgt "$TGT" train_lines "$TRAIN_LINES" \
  train_src "${TRAIN_SRC:+$(realpath "$TRAIN_SRC")}" train_tgt "${TRAIN_TGT:+$(realpath "$TRAIN_TGT")}")
TOK_PARAMS=$(manifest_params --base "$RAW_PARAMS" pretokenized "$PRETOKENIZED" test_set "$TEST_SET" valid_set "$VALID_SET" \
  test_lines "$TEST_LINES" testsets "${TESTSETS:+$(realpath "$TESTSETS")}")
PARAMS=$(manifest_params --base "$TOK_PARAMS" bpe_tokens "$BPE_TOKENS")
skip_if_current "$OUT" "$PARAMS"
# an input's content changed at the same path: the steps made from it are stale too
if [ "${INPUTS_CHANGED:-0}" = 1 ]; then rm -rf "$WORK/raw" "$WORK/tok" "$WORK/bpe"; fi
use_venv

# 0. archives: all checked before anything is written (a local archive folder),
# each download kept only once its sha256 matches
if [ -z "$TRAIN_SRC" ] && [ ! -d "$WORK/raw" ]; then
  if [ -n "$ARCHIVES" ]; then
    for a in "${ARCHIVES_LIST[@]}"; do
      IFS='|' read -r n u s <<< "$a"
      [ -f "$ARCHIVES/$n" ] || die "$n not in --archives $ARCHIVES"
      verify_sha256 "$ARCHIVES/$n" "$s" || exit 1
    done
  fi
  mkdir -p "$WORK/archives"
  for a in "${ARCHIVES_LIST[@]}"; do
    IFS='|' read -r n u s <<< "$a"
    if [ -n "$ARCHIVES" ]; then
      [ -e "$WORK/archives/$n" ] || ln -s "$(cd "$ARCHIVES" && pwd)/$n" "$WORK/archives/$n"
    else
      fetch_archive "$n" "$u" "$s" "$WORK/archives" "" || { rmdir -p "$WORK/archives" 2>/dev/null || true; exit 1; }
    fi
  done
fi

# 1. raw parallel training text: train.SRC / train.TGT
raw_train() {  # $1 = temp dir
  local tmp=$1 a n u s l c
  if [ -n "$TRAIN_SRC" ]; then
    read_text "$TRAIN_SRC" | head_n "$TRAIN_LINES" > "$tmp/train.$SRC"
    read_text "$TRAIN_TGT" | head_n "$TRAIN_LINES" > "$tmp/train.$TGT"
    same_lines train "$tmp/train.$SRC" "$tmp/train.$TGT"
    return
  fi
  for a in "${ARCHIVES_LIST[@]}"; do
    IFS='|' read -r n u s <<< "$a"
    log "extract $n"
    tar -xzf "$WORK/archives/$n" -C "$tmp" || return 1
  done
  for l in "$SRC" "$TGT"; do
    for c in "${CORPORA[@]}"; do
      [ -f "$tmp/$c.$l" ] || { echo "error: $c.$l not found in the archives" >&2; return 1; }
      cat "$tmp/$c.$l"
    done | head_n "$TRAIN_LINES" > "$tmp/train.$l"
  done
  same_lines train "$tmp/train.$SRC" "$tmp/train.$TGT"
}

# 2. tokenized train/valid/test and raw test
tokenize() {  # $1 = temp dir
  local tmp=$1 l
  for l in "$SRC" "$TGT"; do
    log "tokenize train.$l"
    if [ "$PRETOKENIZED" = 1 ]; then cp "$WORK/raw/train.$l" "$tmp/all.$l"; else moses_tok "$l" < "$WORK/raw/train.$l" > "$tmp/all.$l"; fi
    test_raw "$TEST_SET" "$PAIR" "$l" "$SRC" "$TGT" "$TESTSETS" | head_n "$TEST_LINES" > "$tmp/test.raw.$l" || return 1
    moses_tok "$l" < "$tmp/test.raw.$l" > "$tmp/test.$l"
    if [ "$VALID_SET" = split ]; then
      awk 'NR % 100 == 0' "$tmp/all.$l" > "$tmp/valid.$l"
      awk 'NR % 100 != 0' "$tmp/all.$l" > "$tmp/train.$l"
    else
      test_raw "$VALID_SET" "$PAIR" "$l" "$SRC" "$TGT" "$TESTSETS" | head_n "$TEST_LINES" | moses_tok "$l" > "$tmp/valid.$l" || return 1
      mv "$tmp/all.$l" "$tmp/train.$l"
    fi
    rm -f "$tmp/all.$l"
  done
  # tokenizing keeps one line per line
  local raw; raw=$(wc -l < "$WORK/raw/train.$SRC")
  [ "$VALID_SET" != split ] || raw=$((raw - raw / 100))
  expect_lines "$raw" "tokenized train" "$tmp/train.$SRC" "$tmp/train.$TGT"
  same_lines valid "$tmp/valid.$SRC" "$tmp/valid.$TGT"
  same_lines test "$tmp/test.$SRC" "$tmp/test.$TGT" "$tmp/test.raw.$SRC" "$tmp/test.raw.$TGT"
}

# 3. joint BPE learnt on train, applied to all; clean train/valid after BPE (fairseq's order)
bpe() {  # $1 = temp dir
  local tmp=$1 l f
  log "learn $BPE_TOKENS joint BPE merges"
  cat "$WORK/tok/train.$SRC" "$WORK/tok/train.$TGT" | subword-nmt learn-bpe -s "$BPE_TOKENS" > "$tmp/code"
  # learn-bpe stops early only when no pair occurs twice (a small --train-lines)
  [ "$TRAIN_LINES" != 0 ] || expect_merges "$tmp/code" "$BPE_TOKENS" "the learnt code"
  for f in train valid test; do
    for l in "$SRC" "$TGT"; do subword-nmt apply-bpe -c "$tmp/code" < "$WORK/tok/$f.$l" > "$tmp/bpe.$f.$l"; done
    expect_lines "$(wc -l < "$WORK/tok/$f.$SRC")" "BPE $f" "$tmp/bpe.$f.$SRC" "$tmp/bpe.$f.$TGT"
  done
  for f in train valid; do
    corpus_py clean "$tmp/bpe.$f.$SRC" "$tmp/bpe.$f.$TGT" "$tmp/$f.$SRC" "$tmp/$f.$TGT" --min 1 --max 250 --ratio 1.5
  done
  for l in "$SRC" "$TGT"; do mv "$tmp/bpe.test.$l" "$tmp/test.$l"; cp "$WORK/tok/test.raw.$l" "$tmp/test.raw.$l"; done
  rm -f "$tmp"/bpe.*
  same_lines "cleaned train" "$tmp/train.$SRC" "$tmp/train.$TGT"
  same_lines "cleaned valid" "$tmp/valid.$SRC" "$tmp/valid.$TGT"
}

# Both sides of a split have the same number of lines (and at least one).
same_lines() {  # WHAT FILE...
  local n; n=$(wc -l < "$2")
  [ "$n" -gt 0 ] || die "$1: $(basename "$2") is empty; nothing published"
  expect_lines "$n" "$1" "${@:2}"
}

mkdir -p "$(dirname "$OUT")"
build_dir "$WORK/raw" "$RAW_PARAMS" raw_train
build_dir "$WORK/tok" "$TOK_PARAMS" tokenize
build_dir "$WORK/bpe" "$PARAMS" bpe
# 4. binarize (joined dictionary); the raw test text goes along for detokenized sacreBLEU
TMP=$OUT.tmp.$$
tmp_dir "$TMP"
ln -s "$(cd "$WORK/bpe" && pwd)" "$TMP/text"
INPUTS=()
if [ -n "$TRAIN_SRC" ]; then INPUTS=("$TRAIN_SRC" "$TRAIN_TGT"); else
  for a in "${ARCHIVES_LIST[@]}"; do IFS='|' read -r n u s <<< "$a"; INPUTS+=("$WORK/archives/$n"); done
fi
PREPROCESS_ARGS=(--joined-dictionary)
# moses_tok (corpus-lib.sh): normalize, non-printing characters out, tokenize -a; cased; joint BPE
# (a --pretokenized training text was made so; valid and test are made so here)
TEXT_STEPS=(normalize_punctuation=1 remove_nonprinting=1 tokenizer=moses aggressive_dash_splits=1 lowercase=0
            bpe=subword_nmt bpe_codes=code)
binarize_and_publish "$TMP" "$SRC" "$TGT" "$MAX_UNK_RATE" "$PARAMS" "train=$(wc -l < "$WORK/bpe/train.$SRC")" \
  "valid=$(wc -l < "$WORK/bpe/valid.$SRC")" "test=$(wc -l < "$WORK/bpe/test.$SRC")" -- "${INPUTS[@]}"
log "ready: $OUT ($SRC -> $TGT, test $TEST_SET)"
