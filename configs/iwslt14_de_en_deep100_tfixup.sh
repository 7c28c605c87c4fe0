# Paper Fig. 4b, T-Fixup 64-128-2, IWSLT'14 De-En, 100 layers, 50K updates.
# Fig. 4b: validation curves for the first 50K updates; its test BLEU values are only in the figure legend,
# which our copy of the paper does not carry, so PAPER_BLEU is empty. Dropout is not given: 0.3 (fairseq's
# transformer_iwslt_de_en value; 0.5 is the small model's and is heavy for 64-dim layers).
TABLE="Fig. 4b"
ROW="IWSLT'14 De-En 64-128-2, T-Fixup, 100 layers"
PAPER_BLEU=
# --- method: T-Fixup (no LayerNorm, no warmup)
ARCH=transformer_tfixup_deep_narrow
NORMALIZE_BEFORE=0
LR=5e-4
LR_SCHEDULER=inverse_sqrt_nowarmup
DECAY_PERIOD=4000
WARMUP_UPDATES=0
WARMUP_INIT_LR=
EXTRA_TRAIN_ARGS=""
# --- data: IWSLT'14 (fairseq examples/translation/prepare-iwslt14.sh: tokenized, lowercased, 10k joint BPE)
PREPARE="prepare-iwslt14.sh --src de"
DATASET=iwslt14.tokenized.de-en
SRC=de
TGT=en
# --- model: 64-128-2, 100+100 layers (paper Fig. 4b)
ENCODER_LAYERS=100
DECODER_LAYERS=100
EMBED_DIM=
FFN_DIM=
HEADS=
SHARE_EMBED=decoder
# --- optimisation: the authors' IWSLT recipe
OPTIMIZER=adam
ADAM_BETAS="(0.9,0.98)"
CLIP_NORM=0
DROPOUT=0.3
ATTENTION_DROPOUT=0
ACTIVATION_DROPOUT=0
WEIGHT_DECAY=1e-4
LABEL_SMOOTHING=0.1
# tokens per GPU batch; BATCH_SHARDS batches of MAX_TOKENS make one update (the
# effective batch train.sh keeps on any number of GPUs): 4000 tokens, 1 GPU
MAX_TOKENS=4000
BATCH_SHARDS=1
MAX_EPOCH=0
MAX_UPDATE=50000
SAVE_INTERVAL_UPDATES=0
KEEP_LAST=10
# IWSLT small models train in fp32 in the paper (mixed precision only for WMT base/big)
FP16=0
SEED=1
# --- evaluation: the authors' eval args; K of "average the last K" is chosen on VALID loss
AVG_CANDIDATES="1 5 10"
BEAM=4
LENPEN=0.3
# tokenized BLEU on lowercased text, as fairseq-generate reports for IWSLT'14
PAPER_METRIC=tok
COMPOUND_SPLIT=0
LOWERCASE=1
