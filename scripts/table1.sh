#!/usr/bin/env bash
# Paper Table 1: test BLEU of T-Fixup and the Post-LN / Pre-LN baselines on
# IWSLT'14 De-En and En-De (small), WMT'18 Fi-En (base), WMT'17 En-De (base, big);
# the paper's R-Fixup and RAdam (no warmup) cells; and, beyond the paper, DeepNorm
# and Admin on WMT'17 En-De base (rows without a paper number, like Pre-LN's '–').
TABLE_TITLE="Table 1: test BLEU, 6-layer models"
TABLE_FILE=table1.md
EXPERIMENTS=(
  iwslt14_de_en_tfixup iwslt14_de_en_postln iwslt14_de_en_preln iwslt14_de_en_rfixup iwslt14_de_en_radam
  iwslt14_en_de_tfixup iwslt14_en_de_postln iwslt14_en_de_preln iwslt14_en_de_radam
  wmt18_fi_en_base_tfixup wmt18_fi_en_base_postln wmt18_fi_en_base_preln
  wmt17_en_de_base_tfixup wmt17_en_de_base_postln wmt17_en_de_base_preln
  wmt17_en_de_base_deepnorm wmt17_en_de_base_admin
  wmt17_en_de_big_tfixup wmt17_en_de_big_postln wmt17_en_de_big_preln wmt17_en_de_big_rfixup
)
. "$(dirname "$0")/table-lib.sh"
