# Paper Table 1, T-Fixup, WMT'18 Fi-En base: 25.7 BLEU.
TABLE="Table 1"
ROW="WMT'18 Fi-En base, T-Fixup"
PAPER_BLEU=25.7
# --- method: T-Fixup (no LayerNorm, no warmup)
ARCH=transformer_tfixup_wmt_en_de
NORMALIZE_BEFORE=0
LR=5e-4
LR_SCHEDULER=inverse_sqrt_nowarmup
DECAY_PERIOD=4000
WARMUP_UPDATES=0
WARMUP_INIT_LR=
EXTRA_TRAIN_ARGS=""
# --- data: prepare-wmt18-fi-en.sh (fairseq examples/translation recipe with pip tools; joint BPE, joined dictionary)
PREPARE="prepare-wmt18-fi-en.sh"
DATASET=wmt18_fi_en
SRC=fi
TGT=en
TEST_SET=newstest2018
# --- model: base 512-2048-8 (paper §4)
ENCODER_LAYERS=6
DECODER_LAYERS=6
EMBED_DIM=
FFN_DIM=
HEADS=
SHARE_EMBED=all
# --- optimisation. Not in the paper (its Appendix D is unavailable): fairseq's
# Vaswani et al. recipe, Adam (0.9,0.98), peak lr 5e-4 (the value §4.2 quotes
# for T-Fixup), dropout 0.1, label smoothing 0.1, ~25K target tokens
# per update (paper Fig. 4c: "8x has 200K tokens") = 8 x 3125.
OPTIMIZER=adam
ADAM_BETAS="(0.9,0.98)"
CLIP_NORM=0
DROPOUT=0.1
ATTENTION_DROPOUT=0
ACTIVATION_DROPOUT=0
WEIGHT_DECAY=0
LABEL_SMOOTHING=0.1
MAX_TOKENS=3125
BATCH_SHARDS=8
MAX_EPOCH=0
# not in the paper: 300K updates (Vaswani et al. big / our choice)
MAX_UPDATE=300000
SAVE_INTERVAL_UPDATES=5000
KEEP_LAST=10
# the paper trains WMT base/big with mixed precision
FP16=1
SEED=1
# --- evaluation (fairseq's WMT setting: beam 4, lenpen 0.6; K chosen on VALID loss)
AVG_CANDIDATES="1 5 10"
BEAM=4
LENPEN=0.6
# Fi-En: detokenized cased sacreBLEU, the WMT'18 official metric of the cited baseline (Rikters, 2018)
PAPER_METRIC=detok
COMPOUND_SPLIT=0
LOWERCASE=0
