#!/usr/bin/env bash
# WMT'18 Fi-En (fairseq has no recipe for it: we apply its WMT recipe to the
# WMT'18 constrained Fi-En corpora): Europarl v8 + ParaCrawl v1 + Rapid 2016,
# 40K joint BPE (our choice), valid = every 100th training pair, test newstest2018.
# The WMT'15 wiki-titles corpus is left out (a different, one-file format).
# Corpus paths inside the archives follow the WMT'18 release; they could not be
# checked here (no internet): the script stops with a clear error if one differs.
DATASET=wmt18_fi_en  # its settings and archives: scripts/wmt-datasets.tsv, scripts/wmt-archives.tsv
. "$(dirname "$0")/prepare-wmt-common.sh"
