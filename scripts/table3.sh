#!/usr/bin/env bash
# Paper Table 3: WMT'14 En-De base at 12 / 20 / 30 layers (T-Fixup, settings of
# Zhang et al. 2019a) against the 6-layer Post-LN baseline, a 12-layer Pre-LN,
# DS-Init at 12 / 20 layers and LRI at 12 / 24 layers.
TABLE_TITLE="Table 3: WMT'14 En-De test BLEU, base models of varying depth"
TABLE_FILE=table3.md
EXPERIMENTS=(
  wmt14_en_de_base_postln wmt14_en_de_base_12l_preln
  wmt14_en_de_base_12l_dsinit wmt14_en_de_base_20l_dsinit
  wmt14_en_de_base_12l_lri wmt14_en_de_base_24l_lri
  wmt14_en_de_base_12l_tfixup wmt14_en_de_base_20l_tfixup wmt14_en_de_base_30l_tfixup
)
. "$(dirname "$0")/table-lib.sh"
