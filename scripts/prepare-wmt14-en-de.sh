#!/usr/bin/env bash
# WMT'14 En-De as in fairseq's prepare-wmt14en2de.sh --icml17 (Europarl v7 +
# CommonCrawl + News Commentary v9, 40K joint BPE), with newstest2013 as the dev
# set and newstest2014 (full, 3003 lines) as test, the setting of Zhang et al.
# (2019a) that paper Table 3 follows.
DATASET=wmt14_en_de  # its settings and archives: scripts/wmt-datasets.tsv, scripts/wmt-archives.tsv
. "$(dirname "$0")/prepare-wmt-common.sh"
