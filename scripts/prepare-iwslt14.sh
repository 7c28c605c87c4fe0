#!/usr/bin/env bash
# Prepare IWSLT'14 De-En (either direction) for fairseq, fairseq's recipe
# (examples/translation/prepare-iwslt14.sh): Moses-tokenised lowercased text,
# 10k joint BPE, valid = every 23rd training pair, test = dev2010 + TEDX.dev2012
# + tst2010-2012 (6750), then fairseq-preprocess with separate dictionaries.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
supervise "$@"
. "$(dirname "$0")/corpus-lib.sh"

# The release archive fairseq's script downloads; its published identity is its
# git blob id (../shared/data/iwslt14-de-en/SOURCE.md). Set IWSLT14_SHA256 to also
# pin its sha256.
IWSLT14_URL=${IWSLT14_URL:-http://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz}
IWSLT14_GIT_BLOB=aa8c3f40f8836f1d43701448f94fe7e230082b4c

usage() {
  cat <<USAGE
usage: $0 [--src de|en] [--out DIR] [--shared DIR | --archive FILE | --download]
          [--train-lines N] [--valid-lines N] [--test-lines N] [--bpe-tokens N] [--workers N]

Input, one of:
  (default)        \$TFIXUP_SHARED_DATA/iwslt14-de-en (default ../shared/data; offline):
                   tokenized+lowercased train text, fairseq's BPE'd valid/test and BPE codes
  --archive FILE   the IWSLT'14 release de-en.tgz from a local folder (checksum checked),
                   prepared from raw text with fairseq's full recipe
  --download       fetch de-en.tgz from \$IWSLT14_URL ($IWSLT14_URL) first

  --src L          source language, de (De-En, default) or en (En-De)
  --out DIR        destination (default data-bin/iwslt14.tokenized.SRC-TGT)
  --shared DIR     shared data folder (default: \$TFIXUP_SHARED_DATA)
  --train-lines N  keep the first N training pairs (0 = all; default \$TRAIN_LINES or 0)
  --valid-lines N  keep the first N valid pairs (0 = all; default \$VALID_LINES or 0)
  --test-lines N   keep the first N test pairs (0 = all; default \$TEST_LINES or 0)
  --bpe-tokens N   joint BPE merges learnt in --archive/--download mode (default 10000)
  --workers N      fairseq-preprocess/tokenizer workers (default \$WORKERS or 2)
  --max-unk-rate P refuse the data when more than P % of valid/test tokens are <unk>
                   (default \$MAX_UNK_RATE or 5)

Besides fairseq's binary files, OUT holds test.raw.{de,en}: the untokenized
test text for detokenized sacreBLEU (from the release's XML files), and
manifest.json (inputs with sha256, parameters, sentence counts, <unk> rates).
Every step's output is checked (parallel line counts against the inputs', all
BPE merges, <unk> rate) before OUT is published, at once; a failure leaves
nothing. A rerun with the same inputs and parameters skips; other parameters
(e.g. --test-lines) rebuild OUT, and say so.
USAGE
}

SRC=de; OUT=""; SHARED=$TFIXUP_SHARED_DATA; ARCHIVE=""; DOWNLOAD=0; BPE_TOKENS=10000
TRAIN_LINES=${TRAIN_LINES:-0}; VALID_LINES=${VALID_LINES:-0}; TEST_LINES=${TEST_LINES:-0}; WORKERS=${WORKERS:-2}
MAX_UNK_RATE=${MAX_UNK_RATE:-5}
read_options "src out shared archive train-lines valid-lines test-lines bpe-tokens workers max-unk-rate" \
  "download" -- "$@"
export WORKERS
for v in TRAIN_LINES VALID_LINES TEST_LINES BPE_TOKENS WORKERS; do
  [[ ${!v} =~ ^[0-9]+$ ]] || die "--$(echo "${v,,}" | tr _ -) must be a whole number, got '${!v}'"
done
case $SRC in de) TGT=en;; en) TGT=de;; *) die "--src must be de or en, got '$SRC'";; esac
OUT=${OUT:-data-bin/iwslt14.tokenized.$SRC-$TGT}
IN=$SHARED/iwslt14-de-en
# fairseq's test set: these five files, in this order
TEST_PARTS=(IWSLT14.TED.dev2010 IWSLT14.TEDX.dev2012 IWSLT14.TED.tst2010 IWSLT14.TED.tst2011 IWSLT14.TED.tst2012)
ORIG_PARTS=("${TEST_PARTS[@]/#/orig/}")
[ "$DOWNLOAD" = 0 ] || [ -z "$ARCHIVE" ] || die "--archive and --download exclude each other"

check_archive() {  # FILE: git blob id (and sha256 when IWSLT14_SHA256 is set)
  local got
  got=$(corpus_py git-blob-sha1 "$1" 2>/dev/null)
  [ "$got" = "$IWSLT14_GIT_BLOB" ] \
    || die "checksum mismatch for $(basename "$1"): git blob $got, expected $IWSLT14_GIT_BLOB"
  [ -z "${IWSLT14_SHA256:-}" ] || verify_sha256 "$1" "$IWSLT14_SHA256" || exit 1
}

if [ -n "$ARCHIVE$DOWNLOAD" ] && [ "$ARCHIVE$DOWNLOAD" != 0 ]; then
  MODE=archive
else
  MODE=shared
  for f in train-sample/train.de.xz train-sample/train.en.xz fairseq-prepared/code.xz \
           fairseq-prepared/{valid,test}.{de,en}.xz "${ORIG_PARTS[@]/%/.de-en.de.xml.xz}" \
           "${ORIG_PARTS[@]/%/.de-en.en.xml.xz}"; do
    [ -f "$IN/$f" ] || die "missing input file: $IN/$f (set --shared or TFIXUP_SHARED_DATA)"
  done
fi

# Everything that decides the output: a data-bin made with other values is rebuilt.
if [ "$MODE" = shared ]; then
  INPUTS=("$IN"/train-sample/train.{de,en}.xz "$IN"/fairseq-prepared/{code,valid.de,valid.en,test.de,test.en}.xz)
  for p in "${ORIG_PARTS[@]}"; do INPUTS+=("$IN/$p.de-en.de.xml.xz" "$IN/$p.de-en.en.xml.xz"); done
  PARAMS=$(manifest_params mode shared src "$SRC" tgt "$TGT" train_lines "$TRAIN_LINES" valid_lines "$VALID_LINES" \
    test_lines "$TEST_LINES" input "$(realpath "$IN")")
else
  PARAMS=$(manifest_params mode archive src "$SRC" tgt "$TGT" train_lines "$TRAIN_LINES" valid_lines "$VALID_LINES" \
    test_lines "$TEST_LINES" bpe_tokens "$BPE_TOKENS")
fi
skip_if_current "$OUT" "$PARAMS"
use_venv

if [ "$MODE" = archive ]; then
  if [ "$DOWNLOAD" = 1 ]; then
    ARCHIVE=$OUT.orig/de-en.tgz
    if [ ! -f "$ARCHIVE" ]; then
      mkdir -p "$OUT.orig"; log "download $IWSLT14_URL"
      curl -fL --retry 3 -o "$ARCHIVE.part" "$IWSLT14_URL" || { rm -rf "$OUT.orig"; die "download failed: $IWSLT14_URL"; }
      (check_archive "$ARCHIVE.part") || { rm -rf "$OUT.orig"; exit 1; }
      mv "$ARCHIVE.part" "$ARCHIVE"
    fi
  fi
  [ -f "$ARCHIVE" ] || die "archive not found: $ARCHIVE"
  check_archive "$ARCHIVE"
  INPUTS=("$ARCHIVE")
fi

# test.raw.L: the test sentences as released (untokenized, cased), fairseq's order:
# all of them (to be counted against the tokenized test set), then the first TEST_LINES
raw_test_all() {  # XML_DIR L OUT_FILE
  local parts=() p
  for p in "${TEST_PARTS[@]}"; do parts+=("$1/$p.de-en.$2.xml"); done
  corpus_py segs "${parts[@]}" > "$3"
}

# Both sides of a split have the same count, read from the inputs to their end
# (a truncated .xz fails here, naming the file).
pair_count() {  # VAR FILE_DE FILE_EN MAX
  local -n _count=$1
  local a b
  STEP="read $2"; a=$(count_lines "$2" "$4")
  STEP="read $3"; b=$(count_lines "$3" "$4")
  STEP=""
  [ "$a" = "$b" ] || die "$2 has $a lines but $3 has $b: not a parallel corpus (a truncated input?); nothing published"
  [ "$a" -gt 0 ] || die "no lines in $2"
  _count=$a
}

declare -A COUNT=()
shared_text() {  # $1 = temp dir: BPE'd {train,valid,test}.{de,en}, test.raw.{de,en}
  local tmp=$1 l p
  local all_test
  pair_count 'COUNT[train]' "$IN"/train-sample/train.{de,en}.xz "$TRAIN_LINES"
  pair_count 'COUNT[valid]' "$IN"/fairseq-prepared/valid.{de,en}.xz "$VALID_LINES"
  pair_count all_test "$IN"/fairseq-prepared/test.{de,en}.xz 0
  COUNT[test]=$all_test; [ "$TEST_LINES" = 0 ] || [ "$TEST_LINES" -ge "$all_test" ] || COUNT[test]=$TEST_LINES
  STEP="read BPE codes $IN/fairseq-prepared/code.xz"
  xzcat "$IN/fairseq-prepared/code.xz" > "$tmp/code"
  # fairseq's recipe learns 10000 merges: fewer means a truncated code file
  expect_merges "$tmp/code" "$BPE_TOKENS" "$IN/fairseq-prepared/code.xz"
  mkdir -p "$tmp/xml"
  for l in de en; do
    step "apply BPE to $IN/train-sample/train.$l.xz"
    xzcat "$IN/train-sample/train.$l.xz" | head_n "$TRAIN_LINES" \
      | subword-nmt apply-bpe -c "$tmp/code" > "$tmp/train.$l"
    STEP="read $IN/fairseq-prepared/valid.$l.xz"
    xzcat "$IN/fairseq-prepared/valid.$l.xz" | head_n "$VALID_LINES" > "$tmp/valid.$l"
    STEP="read $IN/fairseq-prepared/test.$l.xz"
    xzcat "$IN/fairseq-prepared/test.$l.xz" | head_n "$TEST_LINES" > "$tmp/test.$l"
    for p in "${TEST_PARTS[@]}"; do
      STEP="read $IN/orig/$p.de-en.$l.xml.xz"
      xzcat "$IN/orig/$p.de-en.$l.xml.xz" > "$tmp/xml/$p.de-en.$l.xml"
    done
    step "extract the test sentences of $IN/orig/*.$l.xml.xz"
    raw_test_all "$tmp/xml" "$l" "$tmp/test.all.$l"
    STEP=""
    # the release's XML must hold exactly the sentences of fairseq's test set
    expect_lines "$all_test" "test.raw.$l (from $IN/orig/IWSLT14.*.$l.xml.xz)" "$tmp/test.all.$l"
    head_n "$TEST_LINES" < "$tmp/test.all.$l" > "$tmp/test.raw.$l"
  done
  rm -rf "$tmp/xml" "$tmp"/test.all.*
}

archive_text() {  # $1 = temp dir: fairseq's prepare-iwslt14.sh on the release archive
  local tmp=$1 l p
  step "extract $ARCHIVE"
  tar -xzf "$ARCHIVE" -C "$tmp"
  local orig=$tmp/de-en
  for l in de en; do
    step "tokenize train.$l"
    corpus_py strip-talk-tags < "$orig/train.tags.de-en.$l" \
      | sacremoses -q -l "$l" -j "$WORKERS" tokenize > "$tmp/train.tags.tok.$l"
  done
  step "clean train"
  corpus_py clean "$tmp"/train.tags.tok.{de,en} "$tmp"/train.tags.clean.{de,en} --min 1 --max 175 --ratio 1.5
  for l in de en; do
    step "split and lowercase $l"
    corpus_py lower < "$tmp/train.tags.clean.$l" > "$tmp/train.tags.$l"
    awk 'NR % 23 == 0' "$tmp/train.tags.$l" | head_n "$VALID_LINES" > "$tmp/tok.valid.$l"
    awk 'NR % 23 != 0' "$tmp/train.tags.$l" | head_n "$TRAIN_LINES" > "$tmp/tok.train.$l"
    step "tokenize test.$l"
    raw_test_all "$orig" "$l" "$tmp/test.all.$l"
    head_n "$TEST_LINES" < "$tmp/test.all.$l" > "$tmp/test.raw.$l"
    sacremoses -q -l "$l" tokenize < "$tmp/test.raw.$l" | corpus_py lower > "$tmp/tok.test.$l"
  done
  STEP=""
  COUNT[train]=$(wc -l < "$tmp/tok.train.de"); COUNT[valid]=$(wc -l < "$tmp/tok.valid.de")
  COUNT[test]=$(wc -l < "$tmp/test.raw.de")
  expect_lines "${COUNT[train]}" "train (cleaned)" "$tmp"/tok.train.{de,en}
  expect_lines "${COUNT[valid]}" "valid" "$tmp"/tok.valid.{de,en}
  expect_lines "${COUNT[test]}" "test" "$tmp"/test.raw.{de,en} "$tmp"/tok.test.{de,en}
  step "learn $BPE_TOKENS joint BPE merges"
  cat "$tmp/tok.train.de" "$tmp/tok.train.en" | subword-nmt learn-bpe -s "$BPE_TOKENS" > "$tmp/code"
  STEP=""
  # learn-bpe stops early only when no pair occurs twice (a small --train-lines)
  [ "$TRAIN_LINES" != 0 ] || expect_merges "$tmp/code" "$BPE_TOKENS" "the learnt code"
  for p in train valid test; do
    for l in de en; do
      step "apply BPE to $p.$l"
      subword-nmt apply-bpe -c "$tmp/code" < "$tmp/tok.$p.$l" > "$tmp/$p.$l"
    done
  done
  STEP=""
  rm -rf "$orig" "$tmp"/train.tags.* "$tmp"/tok.* "$tmp"/test.all.*
}

TMP=$OUT.tmp.$$
tmp_dir "$TMP"
mkdir -p "$TMP/text"
if [ "$MODE" = archive ]; then archive_text "$TMP/text"; else shared_text "$TMP/text"; fi
# what the text steps made: every file of a split has the split's count
for split in train valid test; do
  expect_lines "${COUNT[$split]}" "$split" "$TMP/text/$split".{de,en}
done
expect_lines "${COUNT[test]}" "test" "$TMP/text"/test.raw.{de,en}

# fairseq's recipe (both modes): Moses tokenizer without -a, lowercased, joint BPE
TEXT_STEPS=(normalize_punctuation=0 remove_nonprinting=0 tokenizer=moses aggressive_dash_splits=0 lowercase=1
            bpe=subword_nmt bpe_codes=code)
binarize_and_publish "$TMP" "$SRC" "$TGT" "$MAX_UNK_RATE" "$PARAMS" \
  "train=${COUNT[train]}" "valid=${COUNT[valid]}" "test=${COUNT[test]}" -- "${INPUTS[@]}"
log "ready: $OUT ($SRC -> $TGT: ${COUNT[train]} train, ${COUNT[valid]} valid, ${COUNT[test]} test pairs)"
