#!/usr/bin/env bash
# WMT'17 En-De as in fairseq's examples/translation/prepare-wmt14en2de.sh (its
# default, non --icml17 mode): Europarl v7 + CommonCrawl + News Commentary v12,
# 40K joint BPE, valid = every 100th training pair, test newstest2014 (full).
# Paper Tables 1/2 ("WMT'17 En-De"); --test-set newstest2017 for the WMT'17 test.
DATASET=wmt17_en_de  # its settings and archives: scripts/wmt-datasets.tsv, scripts/wmt-archives.tsv
. "$(dirname "$0")/prepare-wmt-common.sh"
