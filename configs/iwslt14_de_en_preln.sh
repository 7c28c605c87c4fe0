# Pre-LN baseline for IWSLT'14 De-En small (paper Table 1 has no number: '–').
TABLE="Table 1"
ROW="IWSLT'14 De-En small, Pre-LN baseline"
PAPER_BLEU=
# --- method: Pre-LN baseline, stock fairseq Transformer with warmup
# (4000 warmup updates from 1e-7, then inverse square root), same peak lr as T-Fixup
ARCH=transformer_iwslt_de_en
NORMALIZE_BEFORE=1
LR=5e-4
LR_SCHEDULER=inverse_sqrt
DECAY_PERIOD=
WARMUP_UPDATES=4000
WARMUP_INIT_LR=1e-7
EXTRA_TRAIN_ARGS=""
# --- data: IWSLT'14 (fairseq examples/translation/prepare-iwslt14.sh: tokenized, lowercased, 10k joint BPE)
PREPARE="prepare-iwslt14.sh --src de"
DATASET=iwslt14.tokenized.de-en
SRC=de
TGT=en
# --- model: small 512-1024-4, 6+6 layers (paper §4)
ENCODER_LAYERS=6
DECODER_LAYERS=6
EMBED_DIM=
FFN_DIM=
HEADS=
SHARE_EMBED=decoder
# --- optimisation: the authors' IWSLT recipe
OPTIMIZER=adam
ADAM_BETAS="(0.9,0.98)"
CLIP_NORM=0
DROPOUT=0.5
ATTENTION_DROPOUT=0
ACTIVATION_DROPOUT=0
WEIGHT_DECAY=1e-4
LABEL_SMOOTHING=0.1
# tokens per GPU batch; BATCH_SHARDS batches of MAX_TOKENS make one update (the
# effective batch train.sh keeps on any number of GPUs): 4000 tokens, 1 GPU
MAX_TOKENS=4000
BATCH_SHARDS=1
MAX_EPOCH=300
MAX_UPDATE=0
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
