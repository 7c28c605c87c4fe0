#!/usr/bin/env bash
# WMT'18 Fi-En (fairseq has no recipe for it: we apply its WMT recipe to the
# WMT'18 constrained Fi-En corpora): Europarl v8 + ParaCrawl v1 + Rapid 2016,
# 40K joint BPE (our choice), valid = every 100th training pair, test newstest2018.
# The WMT'15 wiki-titles corpus is left out (a different, one-file format).
# Corpus paths inside the archives follow the WMT'18 release; they could not be
# checked here (no internet): the script stops with a clear error if one differs.
NAME=wmt18_fi_en; SRC=fi; TGT=en; PAIR=fi-en
BPE_TOKENS=40000; TEST_SET=newstest2018; VALID_SET=split
DESCRIPTION="WMT'18 Fi-En for paper Table 1."
# sha256 as published in tensorflow/datasets url_checksums/wmt18_translate.txt
ARCHIVES_LIST=(
  "training-parallel-ep-v8.tgz|http://data.statmt.org/wmt18/translation-task/training-parallel-ep-v8.tgz|953eaf7f24dcfc87eff6845d13ec6ca8acbee0ccf7edf4063b8b94e943933a96"
  "paracrawl-release1.en-fi.zipporah0-dedup-clean.tgz|https://s3.amazonaws.com/web-language-models/paracrawl/release1/paracrawl-release1.en-fi.zipporah0-dedup-clean.tgz|ce3b46e928d37ae02ab8ce7e0ae0e1f89d1aed5e60271056913e35ff742e65ff"
  "rapid2016.tgz|http://data.statmt.org/wmt18/translation-task/rapid2016.tgz|41557dd5d8f0ed3a6d98bce3b798b1a9d3b68361eb99d902329ddbb943a6b55a"
)
CORPORA=(training/europarl-v8.fi-en paracrawl-release1.en-fi.zipporah0-dedup-clean rapid2016.en-fi)
. "$(dirname "$0")/prepare-wmt-common.sh"
