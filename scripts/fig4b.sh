#!/usr/bin/env bash
# Paper Fig. 4b: IWSLT'14 De-En, T-Fixup 64-128-2 at 6 ... 200 layers, 50K updates.
TABLE_TITLE="Fig. 4b: IWSLT'14 De-En test BLEU, 64-128-2 T-Fixup models of varying depth (50K updates)"
TABLE_FILE=fig4b.md
EXPERIMENTS=(
  iwslt14_de_en_deep6_tfixup iwslt14_de_en_deep20_tfixup iwslt14_de_en_deep50_tfixup
  iwslt14_de_en_deep100_tfixup iwslt14_de_en_deep200_tfixup
)
. "$(dirname "$0")/table-lib.sh"
