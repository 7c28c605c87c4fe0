#!/usr/bin/env bash
# WMT'17 En-De as in fairseq's examples/translation/prepare-wmt14en2de.sh (its
# default, non --icml17 mode): Europarl v7 + CommonCrawl + News Commentary v12,
# 40K joint BPE, valid = every 100th training pair, test newstest2014 (full).
# Paper Tables 1/2 ("WMT'17 En-De"); --test-set newstest2017 for the WMT'17 test.
NAME=wmt17_en_de; SRC=en; TGT=de; PAIR=en-de
BPE_TOKENS=40000; TEST_SET=newstest2014; VALID_SET=split
DESCRIPTION="WMT'17 En-De (fairseq prepare-wmt14en2de.sh recipe) for paper Tables 1 and 2."
# name|url|sha256 (sha256 as published in tensorflow/datasets url_checksums/wmt17_translate.txt)
ARCHIVES_LIST=(
  "training-parallel-europarl-v7.tgz|http://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz|0224c7c710c8a063dfd893b0cc0830202d61f4c75c17eb8e31836103d27d96e7"
  "training-parallel-commoncrawl.tgz|http://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz|c7a74e2ea01ac6c920123108627e35278d4ccb5701e15428ffa34de86fa3a9e5"
  "training-parallel-nc-v12.tgz|http://data.statmt.org/wmt17/translation-task/training-parallel-nc-v12.tgz|2b45f30ef1d550d302fd17dd3a5cbe19134ccc4c2cf50c2dae534aee600101a2"
)
CORPORA=(training/europarl-v7.de-en commoncrawl.de-en training/news-commentary-v12.de-en)
. "$(dirname "$0")/prepare-wmt-common.sh"
