#!/usr/bin/env bash
# Paper Table 2: WMT'17 En-De base at 6 / 20 / 30 layers (T-Fixup) against the
# 6-layer Post-LN baseline, 20-layer Pre-LN, 25-layer DLCL and 30-layer DLCL-Pre-LN.
TABLE_TITLE="Table 2: WMT'17 En-De test BLEU, base models of varying depth"
TABLE_FILE=table2.md
EXPERIMENTS=(
  wmt17_en_de_base_postln wmt17_en_de_base_20l_preln
  wmt17_en_de_base_25l_dlcl wmt17_en_de_base_30l_dlcl_preln
  wmt17_en_de_base_tfixup wmt17_en_de_base_20l_tfixup wmt17_en_de_base_30l_tfixup
)
. "$(dirname "$0")/table-lib.sh"
