#!/usr/bin/env bash
# WMT'14 En-De as in fairseq's prepare-wmt14en2de.sh --icml17 (Europarl v7 +
# CommonCrawl + News Commentary v9, 40K joint BPE), with newstest2013 as the dev
# set and newstest2014 (full, 3003 lines) as test, the setting of Zhang et al.
# (2019a) that paper Table 3 follows.
NAME=wmt14_en_de; SRC=en; TGT=de; PAIR=en-de
BPE_TOKENS=40000; TEST_SET=newstest2014; VALID_SET=newstest2013
DESCRIPTION="WMT'14 En-De (fairseq --icml17 recipe, newstest2013 dev) for paper Table 3."
# sha256 as published in tensorflow/datasets url_checksums/wmt14_translate.txt
ARCHIVES_LIST=(
  "training-parallel-europarl-v7.tgz|http://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz|0224c7c710c8a063dfd893b0cc0830202d61f4c75c17eb8e31836103d27d96e7"
  "training-parallel-commoncrawl.tgz|http://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz|c7a74e2ea01ac6c920123108627e35278d4ccb5701e15428ffa34de86fa3a9e5"
  "training-parallel-nc-v9.tgz|http://www.statmt.org/wmt14/training-parallel-nc-v9.tgz|cb8953f292298e6877ae433c98912b927cb0766b303f4540512ddd286c748485"
)
CORPORA=(training/europarl-v7.de-en commoncrawl.de-en training/news-commentary-v9.de-en)
. "$(dirname "$0")/prepare-wmt-common.sh"
