# Data-preparation helpers shared by scripts/prepare-*.sh (sourced after lib.sh).
# pip tools only: sacremoses (tokenizer), subword-nmt (BPE), sacrebleu (test sets).

# pipeline/corpus.py (stdlib only; lib.sh puts the repo root on PYTHONPATH)
corpus_py() { python3 -m pipeline.corpus "$@"; }

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
