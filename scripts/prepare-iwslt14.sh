#!/usr/bin/env bash
# Prepare IWSLT'14 De-En (either direction) for fairseq, fairseq's recipe
# (examples/translation/prepare-iwslt14.sh): Moses-tokenised lowercased text,
# 10k joint BPE, valid = every 23rd training pair, test = dev2010 + TEDX.dev2012
# + tst2010-2012 (6750), then fairseq-preprocess with separate dictionaries.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
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

Besides fairseq's binary files, OUT holds test.raw.{de,en}: the untokenized
test text for detokenized sacreBLEU (from the release's XML files).
Steps are skipped when their output exists; a failed step leaves no output.
USAGE
}

SRC=de; OUT=""; SHARED=$TFIXUP_SHARED_DATA; ARCHIVE=""; DOWNLOAD=0; BPE_TOKENS=10000
TRAIN_LINES=${TRAIN_LINES:-0}; VALID_LINES=${VALID_LINES:-0}; TEST_LINES=${TEST_LINES:-0}; WORKERS=${WORKERS:-2}
while [ $# -gt 0 ]; do
  case $1 in
    --src) SRC=$2; shift 2;;
    --out) OUT=$2; shift 2;;
    --shared) SHARED=$2; shift 2;;
    --archive) ARCHIVE=$2; shift 2;;
    --download) DOWNLOAD=1; shift;;
    --train-lines) TRAIN_LINES=$2; shift 2;;
    --valid-lines) VALID_LINES=$2; shift 2;;
    --test-lines) TEST_LINES=$2; shift 2;;
    --bpe-tokens) BPE_TOKENS=$2; shift 2;;
    --workers) WORKERS=$2; shift 2;;
    -h|--help) usage; exit 0;;
    *) usage >&2; die "unknown option: $1";;
  esac
done
export WORKERS
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
if [ -e "$OUT" ]; then log "exists, skipping: $OUT"; exit 0; fi
use_venv

if [ "$MODE" = archive ] && [ ! -e "$OUT.text" ]; then
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
fi

# test.raw.L: the test sentences as released (untokenized, cased), fairseq's order
raw_test() {  # XML_DIR L OUT_FILE
  local parts=() p
  for p in "${TEST_PARTS[@]}"; do parts+=("$1/$p.de-en.$2.xml"); done
  corpus_py segs "${parts[@]}" | head_n "$TEST_LINES" > "$3"
}

bpe_text() {  # $1 = temp dir: BPE'd {train,valid,test}.{de,en}, test.raw.{de,en}
  local tmp=$1 l p
  xzcat "$IN/fairseq-prepared/code.xz" > "$tmp/code"
  mkdir -p "$tmp/xml"
  for l in de en; do
    log "apply BPE: train.$l"
    xzcat "$IN/train-sample/train.$l.xz" | head_n "$TRAIN_LINES" \
      | subword-nmt apply-bpe -c "$tmp/code" > "$tmp/train.$l"
    xzcat "$IN/fairseq-prepared/valid.$l.xz" | head_n "$VALID_LINES" > "$tmp/valid.$l"
    xzcat "$IN/fairseq-prepared/test.$l.xz" | head_n "$TEST_LINES" > "$tmp/test.$l"
    for p in "${TEST_PARTS[@]}"; do xzcat "$IN/orig/$p.de-en.$l.xml.xz" > "$tmp/xml/$p.de-en.$l.xml"; done
    raw_test "$tmp/xml" "$l" "$tmp/test.raw.$l"
  done
  rm -rf "$tmp/xml"
}

archive_text() {  # $1 = temp dir: fairseq's prepare-iwslt14.sh on the release archive
  local tmp=$1 l p
  tar -xzf "$ARCHIVE" -C "$tmp" || return 1
  local orig=$tmp/de-en
  for l in de en; do
    log "tokenize train.$l"
    corpus_py strip-talk-tags < "$orig/train.tags.de-en.$l" \
      | sacremoses -q -l "$l" -j "$WORKERS" tokenize > "$tmp/train.tags.tok.$l"
  done
  corpus_py clean "$tmp"/train.tags.tok.{de,en} "$tmp"/train.tags.clean.{de,en} --min 1 --max 175 --ratio 1.5
  for l in de en; do
    corpus_py lower < "$tmp/train.tags.clean.$l" > "$tmp/train.tags.$l"
    awk 'NR % 23 == 0' "$tmp/train.tags.$l" | head_n "$VALID_LINES" > "$tmp/tok.valid.$l"
    awk 'NR % 23 != 0' "$tmp/train.tags.$l" | head_n "$TRAIN_LINES" > "$tmp/tok.train.$l"
    raw_test "$orig" "$l" "$tmp/test.raw.$l"
    sacremoses -q -l "$l" tokenize < "$tmp/test.raw.$l" | corpus_py lower > "$tmp/tok.test.$l"
  done
  log "learn $BPE_TOKENS joint BPE merges"
  cat "$tmp/tok.train.de" "$tmp/tok.train.en" | subword-nmt learn-bpe -s "$BPE_TOKENS" > "$tmp/code"
  for p in train valid test; do
    for l in de en; do subword-nmt apply-bpe -c "$tmp/code" < "$tmp/tok.$p.$l" > "$tmp/$p.$l"; done
  done
  rm -rf "$orig" "$tmp"/train.tags.* "$tmp"/tok.*
}

binarize() {  # $1 = temp dir
  fairseq-preprocess --source-lang "$SRC" --target-lang "$TGT" \
    --trainpref "$OUT.text/train" --validpref "$OUT.text/valid" --testpref "$OUT.text/test" \
    --destdir "$1" --workers "$WORKERS" >&2 || return 1
  cp "$OUT.text/test.raw.de" "$OUT.text/test.raw.en" "$1/"
}

mkdir -p "$(dirname "$OUT")"
if [ "$MODE" = archive ]; then build_dir "$OUT.text" archive_text; else build_dir "$OUT.text" bpe_text; fi
build_dir "$OUT" binarize
log "ready: $OUT ($SRC -> $TGT)"
