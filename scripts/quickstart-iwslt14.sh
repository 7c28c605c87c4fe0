#!/usr/bin/env bash
# Quick start: IWSLT'14 De-En with T-Fixup, from a fresh checkout to a BLEU score
# next to the paper's (Table 1: 35.5). install -> prepare -> train -> evaluate -> report.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/pipeline-lib.sh"

usage() {
  cat <<USAGE
usage: $0 [options] [-- train.sh options]

Defaults are the paper recipe (configs/iwslt14_de_en_tfixup.sh): small model, 300
epochs, on every visible GPU. The data is the offline IWSLT'14 copy in
\$TFIXUP_SHARED_DATA (default ../shared/data), whose training set is an 18.6K-pair
sample of the 160K: expect a lower BLEU than the paper's (use --archive for the full set).

  --experiment NAME  config to run (default iwslt14_de_en_tfixup)
  --work DIR         where data-bin and the run go (default \$WORK_DIR or work/quickstart)
  --cpu              train and evaluate on CPU
  --archive FILE     prepare from the IWSLT'14 release de-en.tgz instead of the shared sample
  --valid-lines N    first N valid sentences (default all)
  --test-lines N     first N test sentences (default all)
  --no-install       use the Python environment already active (skip scripts/install.sh)
  -- ARGS            passed to scripts/train.sh (e.g. --nproc 2)
Shrink the run with config overrides in the environment, e.g. on a laptop CPU:
  MAX_EPOCH=0 MAX_UPDATE=300 MAX_TOKENS=2048 EMBED_DIM=128 FFN_DIM=256 HEADS=2 \\
  ENCODER_LAYERS=2 DECODER_LAYERS=2 AVG_CANDIDATES="1 2" SAVE_INTERVAL_UPDATES=100 \\
  bash $0 --cpu --test-lines 300
USAGE
}

NAME=iwslt14_de_en_tfixup; WORK_DIR=${WORK_DIR:-work/quickstart}; CPU=0; ARCHIVE=""
VALID_LINES=0; TEST_LINES=0; INSTALL=1; TRAIN_ARGS=()
while [ $# -gt 0 ]; do
  case $1 in
    --experiment) NAME=$2; shift 2;;
    --work) WORK_DIR=$2; shift 2;;
    --cpu) CPU=1; shift;;
    --archive) ARCHIVE=$2; shift 2;;
    --valid-lines) VALID_LINES=$2; shift 2;;
    --test-lines) TEST_LINES=$2; shift 2;;
    --no-install) INSTALL=0; shift;;
    -h|--help) usage; exit 0;;
    --) shift; TRAIN_ARGS=("$@"); break;;
    *) usage >&2; die "unknown option: $1";;
  esac
done
cfg=()
config_get cfg "$NAME" -- EXPERIMENT DATASET PREPARE
EXPERIMENT=${cfg[0]}; DATASET=${cfg[1]}
[[ ${cfg[2]} == prepare-iwslt14.sh* ]] || die "$NAME is not an IWSLT'14 experiment"
S=$TFIXUP_ROOT/scripts
# fail before installing and preparing, not after
[ "$CPU" = 1 ] || [ "$(gpu_count)" -gt 0 ] \
  || die "no CUDA GPU visible: rerun with --cpu, and shrink the model for a CPU (see --help)"

if [ "$INSTALL" = 1 ]; then
  log "1/5 install (skipped when already done)"
  bash "$S/install.sh"
  # shellcheck disable=SC1091
  . "${VENV:-$TFIXUP_ROOT/.venv}/bin/activate"
fi
use_venv
DATA=$WORK_DIR/data-bin/$DATASET; RUN=$WORK_DIR/runs/$EXPERIMENT
dev=(); [ "$CPU" = 1 ] && dev=(--cpu)
# PREPARE is "script [args]"
# shellcheck disable=SC2206
prep=(${cfg[2]})

log "2/5 prepare $DATASET -> $DATA"
bash "$S/${prep[0]}" "${prep[@]:1}" --out "$DATA" --valid-lines "$VALID_LINES" --test-lines "$TEST_LINES" \
  ${ARCHIVE:+--archive "$ARCHIVE"}
log "3/5 train $EXPERIMENT -> $RUN (rerun to resume)"
bash "$S/train.sh" "${dev[@]}" "${TRAIN_ARGS[@]}" "$EXPERIMENT" "$DATA" "$RUN"
log "4/5 evaluate"
bash "$S/evaluate.sh" "${dev[@]}" "$EXPERIMENT" "$DATA" "$RUN"
log "5/5 report"
bash "$S/report.sh" --runs "$WORK_DIR/runs" --out "$RUN/report.md" "$EXPERIMENT"
