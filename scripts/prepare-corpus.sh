#!/usr/bin/env bash
# Prepare any raw parallel corpus for fairseq: Moses tokenization (sacremoses),
# optional lowercasing, joint BPE learnt on train (subword-nmt), fairseq-preprocess.
# Every output is checked (line counts, BPE merges, <unk> rate) before the
# data-bin is published, with a manifest of what made it.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
supervise "$@"
. "$(dirname "$0")/corpus-lib.sh"

usage() {
  cat <<USAGE
usage: $0 --src L --tgt L --train PREFIX --valid PREFIX --test PREFIX --out DIR [options]

PREFIX names two text files PREFIX.SRC and PREFIX.TGT, one sentence per line,
plain, .gz or .xz (e.g. ../shared/data/multi30k/train for train.de.gz/train.en.gz).

  --src L, --tgt L     language codes (file suffixes and Moses tokenizer language)
  --train/--valid/--test PREFIX   the three splits (raw, untokenized text)
  --out DIR            destination data-bin (published only when complete)
  --tokenizer moses|none   Moses tokenization with sacremoses, or text already tokenized
                       (default \$TOKENIZER or moses)
  --lowercase          lowercase after tokenizing (default: keep case; \$LOWERCASE=1)
  --bpe-merges N       joint BPE merges learnt on train (default \$BPE_MERGES or 8000; 0 = no BPE)
  --joined-dictionary  one dictionary for both sides (default: separate, as the paper)
  --train-lines N, --valid-lines N, --test-lines N   first N pairs of a split (0 = all)
  --max-unk-rate P     refuse the data when more than P % of valid/test tokens are <unk>
                       (default 2)
  --workers N          tokenizer/binarizer processes (default \$WORKERS or 2)
  -h, --help           this text

Besides fairseq's binary files, OUT holds test.raw.{SRC,TGT} (the untokenized test
text, for detokenized sacreBLEU), code (the BPE merges) and manifest.json (inputs
with sha256, parameters, line counts, <unk> rates). A rerun with the same inputs
and parameters skips; different parameters rebuild, and say so.

Example (the full Multi30k De-En, test_2016_flickr):
  D=../shared/data/multi30k
  bash scripts/prepare-corpus.sh --src de --tgt en --train \$D/train --valid \$D/val \\
    --test \$D/test_2016_flickr --lowercase --bpe-merges 8000 --out work/data-bin/multi30k.de-en
USAGE
}

SRC=""; TGT=""; TRAIN=""; VALID=""; TEST=""; OUT=""; TOKENIZER=${TOKENIZER:-moses}
LOWERCASE=${LOWERCASE:-0}; BPE_MERGES=${BPE_MERGES:-8000}; JOINED_DICTIONARY=0; MAX_UNK_RATE=2; WORKERS=${WORKERS:-2}
TRAIN_LINES=0; VALID_LINES=0; TEST_LINES=0
read_options "src tgt train valid test out tokenizer bpe-merges train-lines valid-lines test-lines max-unk-rate workers" \
  "lowercase joined-dictionary" -- "$@"
for v in SRC TGT TRAIN VALID TEST OUT; do
  flag=${v,,}; [ -n "${!v}" ] || { usage >&2; die "--$flag is required"; }
done
for v in BPE_MERGES TRAIN_LINES VALID_LINES TEST_LINES WORKERS; do
  [[ ${!v} =~ ^[0-9]+$ ]] || die "--$(echo "${v,,}" | tr _ -) must be a whole number, got '${!v}'"
done
case $TOKENIZER in moses|none) ;; *) die "--tokenizer must be moses or none, got '$TOKENIZER'";; esac
[ "$SRC" != "$TGT" ] || die "--src and --tgt must differ (both '$SRC')"

# The input file of PREFIX for language L: PREFIX.L, PREFIX.L.gz or PREFIX.L.xz.
input_file() {  # PREFIX L
  local f
  for f in "$1.$2" "$1.$2.gz" "$1.$2.xz"; do
    if [ -f "$f" ]; then echo "$f"; return 0; fi
  done
  die "no input file $1.$2 (.gz/.xz): check --${3:-train} and --src/--tgt"
}
declare -A FILES=()
for split in train valid test; do
  prefix=${split^^}; prefix=${!prefix}
  for l in "$SRC" "$TGT"; do FILES[$split.$l]=$(input_file "$prefix" "$l" "$split"); done
done

# Everything that decides the output; a data-bin made with other values is rebuilt.
PARAMS=$(manifest_params src "$SRC" tgt "$TGT" tokenizer "$TOKENIZER" lowercase "$LOWERCASE" \
  bpe_merges "$BPE_MERGES" joined_dictionary "$JOINED_DICTIONARY" train_lines "$TRAIN_LINES" \
  valid_lines "$VALID_LINES" test_lines "$TEST_LINES" \
  train "$(realpath "${FILES[train.$SRC]}")" valid "$(realpath "${FILES[valid.$SRC]}")" \
  test "$(realpath "${FILES[test.$SRC]}")")
skip_if_current "$OUT" "$PARAMS"
use_venv

TMP="$OUT.tmp.$$"
tmp_dir "$TMP"
mkdir -p "$TMP/text"

lower() { python -c 'import sys
for line in sys.stdin: sys.stdout.write(line.lower())'; }
tokenize() {  # L FILE -> stdout
  local jobs=$WORKERS
  # sacremoses' worker processes each import it again: below ~10k lines (valid, test, smoke
  # runs) one process is faster (docs/measurements.md, "Data preparation")
  [ "$(wc -l < "$2")" -ge 10000 ] || jobs=1
  if [ "$TOKENIZER" = moses ]; then sacremoses -q -l "$1" -j "$jobs" tokenize < "$2"; else cat "$2"; fi
}
maybe_lower() { if [ "$LOWERCASE" = 1 ]; then lower; else cat; fi; }

# 1. raw text (first N lines) and its tokenized form
for split in train valid test; do
  n=${split^^}_LINES
  for l in "$SRC" "$TGT"; do
    step "tokenize $split.$l (${FILES[$split.$l]})"
    read_text "${FILES[$split.$l]}" | head_n "${!n}" > "$TMP/text/$split.raw.$l"
    # an empty or blank file failed later, inside subword-nmt ("max() arg is an empty sequence")
    grep -q '[^[:space:]]' "$TMP/text/$split.raw.$l" \
      || die "${FILES[$split.$l]} has no text (no lines, or only blank ones): check --$split and --src/--tgt; nothing published"
    no_lone_cr "$TMP/text/$split.raw.$l" "${FILES[$split.$l]}"
    tokenize "$l" "$TMP/text/$split.raw.$l" | maybe_lower > "$TMP/text/$split.tok.$l"
  done
done

# 2. joint BPE, learnt on train only
if [ "$BPE_MERGES" -gt 0 ]; then
  step "learn $BPE_MERGES joint BPE merges on train"
  cat "$TMP/text/train.tok.$SRC" "$TMP/text/train.tok.$TGT" | subword-nmt learn-bpe -s "$BPE_MERGES" > "$TMP/text/code"
  for split in train valid test; do
    for l in "$SRC" "$TGT"; do
      step "apply BPE to $split.$l"
      subword-nmt apply-bpe -c "$TMP/text/code" < "$TMP/text/$split.tok.$l" > "$TMP/text/$split.$l"
    done
  done
else
  for split in train valid test; do
    for l in "$SRC" "$TGT"; do cp "$TMP/text/$split.tok.$l" "$TMP/text/$split.$l"; done
  done
fi

# 3. check what steps 1-2 made: every file of a split has the input's line count
#    (a tokenizer or BPE killed mid-way leaves fewer lines, never an error code alone)
STEP=""
declare -A COUNT=()
for split in train valid test; do
  n=${split^^}_LINES
  STEP="read ${FILES[$split.$SRC]}"; want=$(count_lines "${FILES[$split.$SRC]}" "${!n}")
  STEP="read ${FILES[$split.$TGT]}"; want_tgt=$(count_lines "${FILES[$split.$TGT]}" "${!n}")
  STEP=""
  [ "$want" = "$want_tgt" ] || die "$split: ${FILES[$split.$SRC]} has $want lines but ${FILES[$split.$TGT]} has $want_tgt: not a parallel corpus"
  [ "$want" -gt 0 ] || die "$split: no lines in ${FILES[$split.$SRC]}"
  for l in "$SRC" "$TGT"; do
    expect_lines "$want" "$split.$l" "$TMP/text/$split".{raw.,tok.,}"$l"
  done
  COUNT[$split]=$want
done
if [ "$BPE_MERGES" -gt 0 ]; then
  merges=$(grep -vc '^#' "$TMP/text/code" || true)
  # subword-nmt stops early only when no pair occurs twice: fine, but say it
  [ "$merges" -gt 0 ] || die "BPE learnt no merges from train: is the training text empty?"
  [ "$merges" = "$BPE_MERGES" ] || log "note: subword-nmt learnt $merges of $BPE_MERGES merges (no more frequent pairs)"
fi

# 4. binarize, check <unk> rates, write the manifest, publish
PREPROCESS_ARGS=(); [ "$JOINED_DICTIONARY" = 1 ] && PREPROCESS_ARGS+=(--joined-dictionary)
bpe=(bpe=none bpe_codes=); [ "$BPE_MERGES" = 0 ] || bpe=(bpe=subword_nmt bpe_codes=code)
TEXT_STEPS=(normalize_punctuation=0 remove_nonprinting=0 tokenizer="$TOKENIZER" aggressive_dash_splits=0
            lowercase="$LOWERCASE" "${bpe[@]}")
binarize_and_publish "$TMP" "$SRC" "$TGT" "$MAX_UNK_RATE" "$PARAMS" \
  "train=${COUNT[train]}" "valid=${COUNT[valid]}" "test=${COUNT[test]}" -- \
  "${FILES[train.$SRC]}" "${FILES[train.$TGT]}" "${FILES[valid.$SRC]}" "${FILES[valid.$TGT]}" \
  "${FILES[test.$SRC]}" "${FILES[test.$TGT]}"
log "ready: $OUT ($SRC -> $TGT: ${COUNT[train]} train, ${COUNT[valid]} valid, ${COUNT[test]} test pairs)"
