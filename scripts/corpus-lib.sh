# Data-preparation helpers shared by scripts/prepare-*.sh (sourced after lib.sh).
# pip tools only: sacremoses (tokenizer), subword-nmt (BPE), sacrebleu (test sets).

# subword-nmt learn-bpe draws a progress bar (tqdm, redrawn with carriage returns): on a terminal it
# is progress, in a log file one line of several KB. Off unless stderr is a terminal.
[ -t 2 ] || export TQDM_DISABLE=1

# harness/corpus.py (stdlib only; lib.sh puts the repo root on PYTHONPATH)
corpus_py() { python3 -m harness.corpus "$@"; }

# sha256 of a file must match; otherwise one line on stderr and failure.
verify_sha256() {  # FILE EXPECTED
  local got
  got=$(sha256sum "$1" | cut -d' ' -f1)
  [ "$got" = "$2" ] || { echo "error: checksum mismatch for $(basename "$1"): sha256 $got, expected $2" >&2; return 1; }
}

# Download archive NAME from URL into DIR, checked against SHA256: it goes to a
# temp name and is only moved into place once verified.
fetch_archive() {  # NAME URL SHA256 DIR
  local name=$1 url=$2 sha=$3 dir=$4
  [ -f "$dir/$name" ] && return 0
  log "download $url"
  curl -fL --retry 3 -o "$dir/$name.part" "$url" || { rm -f "$dir/$name.part"; echo "error: download failed: $url" >&2; return 1; }
  verify_sha256 "$dir/$name.part" "$sha" || { rm -f "$dir/$name.part"; return 1; }
  mv "$dir/$name.part" "$dir/$name"
}

# Moses-style tokenization as in fairseq's WMT recipes: normalize punctuation,
# remove non-printing characters, tokenize with aggressive dash splits (-a).
moses_tok() {  # LANG  (stdin -> stdout)
  sacremoses -q -l "$1" -j "${WORKERS:-2}" normalize \
    | corpus_py nonprint \
    | sacremoses -q -l "$1" -j "${WORKERS:-2}" tokenize -a
}

# A WMT test set as raw text, one sentence per line: from a local folder of
# newstestYYYY.PAIR.LANG(.gz) files, else from sacrebleu (which downloads).
test_raw() {  # TESTSET PAIR LANG SRC TGT TESTSETS_DIR
  local test=$1 pair=$2 lang=$3 src=$4 tgt=$5 dir=$6 f
  if [ -n "$dir" ]; then
    for f in "$dir/$test.$pair.$lang" "$dir/$test.$pair.$lang.gz"; do
      if [ -f "$f" ]; then
        case $f in *.gz) zcat "$f";; *) cat "$f";; esac
        return 0
      fi
    done
    echo "error: $test.$pair.$lang(.gz) not in --testsets $dir" >&2; return 1
  fi
  local side=src; [ "$lang" = "$src" ] || side=ref
  local t="wmt${test#newstest20}"; [ "$t" = wmt14 ] && t=wmt14/full  # full 3003 lines, as fairseq
  sacrebleu -t "$t" -l "$src-$tgt" --echo "$side"
}

# FILE(.gz|.xz|plain) -> stdout
read_text() {
  case $1 in *.gz) zcat -- "$1";; *.xz) xzcat -- "$1";; *) cat -- "$1";; esac
}

# Every FILE has N lines: a tool killed mid-way (the OOM killer) or a truncated
# input leaves fewer lines, sometimes without any error code on the way.
expect_lines() {  # N WHAT FILE...
  local n=$1 what=$2 f got; shift 2
  for f in "$@"; do
    got=$(wc -l < "$f")
    [ "$got" = "$n" ] || die "$what: $(basename "$f") has $got lines, expected $n (a truncated input or a step killed mid-way); nothing published"
  done
}

# A carriage return inside a line (not a CRLF line end) is a line break to Python's text readers
# (sacremoses, fairseq-preprocess) and to no one else: the two sides would no longer pair up.
no_lone_cr() {  # TEXT INPUT
  local n
  n=$(LC_ALL=C grep -n -m1 $'\r.' "$1" | cut -d: -f1 || true)
  [ -z "$n" ] || die "$2 line $n holds a carriage return (\\r) inside the line, which Python's tools read as a line break: remove it (e.g. sed 's/\\r//g'), then rerun; nothing published"
}

# Lines of FILE's text (decompressed), at most MAX (0 = all): what a step reading
# it must produce. Fails (set -e) when the file cannot be read to its end.
count_lines() {  # FILE [MAX]
  local n; n=$(read_text "$1" | wc -l)
  if [ "${2:-0}" != 0 ] && [ "$n" -gt "$2" ]; then n=$2; fi
  echo "$n"
}

# BPE codes complete: N merges after the "#version" header.
expect_merges() {  # CODE N WHERE
  local got; got=$(grep -vc '^#' "$1" || true)
  [ "$got" = "$2" ] || die "BPE codes incomplete: $3 has $got merges, expected $2 (a truncated or wrong code file); nothing published"
}

# Parameters (KEY VALUE ...) as JSON, and what to do with OUT: exits 0 when OUT's
# manifest says it was made with the same parameters; says when it rebuilds; refuses
# a folder without a complete manifest (half-made, or made by other means).
manifest_params() { python3 -m harness.manifest params "$@"; }
skip_if_current() {  # OUT PARAMS_JSON
  local status; status=$(python3 -m harness.manifest status "$1" "$2")
  case $status in
    current) log "up to date, skipping: $1 (manifest.json matches: parameters and inputs' sha256)"; exit 0;;
    differs) log "parameters differ from $1/manifest.json: rebuilding $1";;
    changed\ *) INPUTS_CHANGED=1
               log "an input changed since $1 was made (${status#changed }: sha256 differs from manifest.json): rebuilding $1";;
    foreign) die "$1 exists but has no complete manifest.json (half-made, or made before manifests): remove it, then rerun";;
  esac
}

PREPROCESS_ARGS=()
# How the script made text into tokens (KEY=VALUE words, harness/manifest.py PREPROCESS_KEYS):
# recorded in the manifest, so that scripts/translate.sh makes new text into the same tokens.
TEXT_STEPS=()
# fairseq-preprocess TMP/text/{train,valid,test}.{SRC,TGT} into TMP/bin (extra arguments
# in PREPROCESS_ARGS), check its counts and <unk> rates, write the manifest (with TEXT_STEPS),
# publish TMP/bin as OUT. TMP/text/test.raw.* and TMP/text/code go along.
binarize_and_publish() {  # TMP SRC TGT MAX_UNK PARAMS SPLIT=N... -- INPUT...
  local tmp=$1 src=$2 tgt=$3 max_unk=$4 params=$5 counts=() merges=(); shift 5
  while [ "$1" != -- ]; do counts+=("$1"); shift; done; shift
  step "fairseq-preprocess ($src -> $tgt), log $OUT/preprocess.log"
  fairseq-preprocess --source-lang "$src" --target-lang "$tgt" "${PREPROCESS_ARGS[@]}" \
    --trainpref "$tmp/text/train" --validpref "$tmp/text/valid" --testpref "$tmp/text/test" \
    --destdir "$tmp/bin" --workers "$WORKERS" > "$tmp/bin.log" 2>&1 \
    || { tail -n 3 "$tmp/bin.log" >&2; die "fairseq-preprocess failed on $tmp/text (see above); nothing published"; }
  STEP=""
  mv "$tmp/bin.log" "$tmp/bin/preprocess.log"
  cp "$tmp/text/test.raw.$src" "$tmp/text/test.raw.$tgt" "$tmp/bin/"
  if [ -f "$tmp/text/code" ]; then
    cp "$tmp/text/code" "$tmp/bin/code"
    merges=(--bpe-merges "$(grep -vc '^#' "$tmp/text/code" || true)")
  fi
  # refused data: its log is kept beside OUT (the temp folder goes)
  python3 -m harness.manifest write "$tmp/bin/manifest.json" --made-by "scripts/$(basename "$0")" \
    --params "$params" --counts "${counts[@]}" --inputs "$@" --preprocess-log "$tmp/bin/preprocess.log" \
    --max-unk "$max_unk" "${merges[@]}" --keep-log "$OUT.preprocess.log" --preprocess "${TEXT_STEPS[@]}"
  rm -f "$OUT.preprocess.log"
  publish_dir "$tmp/bin" "$OUT"
}
