#!/usr/bin/env bash
# The main job: from a fresh checkout to a T-Fixup model that translates.
# install -> prepare the corpus offline -> train -> evaluate -> report, then a summary:
# test BLEU, three example translations, the learning curve (PNG), where everything is.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
supervise "$@"  # SIGTERM/SIGINT stop every step's processes at once
. "$(dirname "$0")/pipeline-lib.sh"

GPU_EXPERIMENT=iwslt14_de_en_tfixup
CPU_EXPERIMENT=multi30k_de_en_cpu_tfixup

usage() {
  cat <<USAGE
usage: $0 [options] [-- train.sh options]

On a GPU (default): the paper's IWSLT'14 De-En recipe (configs/$GPU_EXPERIMENT.conf:
512-1024-4, 300 epochs) on every visible GPU, prepared offline from \$TFIXUP_SHARED_DATA
(default ../shared/data), whose training set is an 18.6K-pair sample of the 160K: expect
less than the paper's 35.5 (use --archive for the full set).
With --cpu: the CPU main job (configs/$CPU_EXPERIMENT.conf): a 128-256-4, 6+6-layer
T-Fixup model on the full Multi30k De-En (29K caption pairs), sized for about 20 minutes on 2 cores.
Without a GPU and without --cpu it stops at once.

  --cpu              train and evaluate on CPU (default experiment: $CPU_EXPERIMENT)
  --experiment NAME  config to run instead (an IWSLT'14 one or $CPU_EXPERIMENT)
  --work DIR         where everything goes (default \$WORK_DIR or work/quickstart-DEVICE-EXPERIMENT,
                     so that a CPU run and a GPU run never share data or checkpoints)
  --archive FILE     IWSLT'14: prepare from the release de-en.tgz instead of the shared sample
  --train-lines N    first N training pairs (default all; for a smoke run)
  --valid-lines N    first N valid sentences (default all)
  --test-lines N     first N test sentences (default all)
  --no-install       use the Python environment already active (skip scripts/install.sh)
  --dry-run          print every step's command (train.sh/evaluate.sh --dry-run), run nothing
  -- ARGS            passed to scripts/train.sh (e.g. --nproc 2)
Writes under DIR: data-bin/, runs/EXPERIMENT/ (checkpoints, train.log, eval/results.json,
eval/generate-test.txt), runs/EXPERIMENT/report.md, learning-curve.png, summary.txt (what it printed at
its end) and main-job.json: the job's record (commit, date, machine, each step's time, the results);
python3 -m harness.main_job publish RUN puts it into results/main-job/.
The summary ends with the model's files, the command that trains it longer, a Python snippet, and
the command that translates your own text (scripts/translate.sh RUN_DIR). Torch's thread count:
one per core shared with running trainings, not more than the cores free at the start (OMP_NUM_THREADS=N
chooses), printed, with a line when the machine is oversubscribed.
Rerunning the same command resumes. BPE_MERGES=N in the environment replaces the config's BPE
merges for prepare-corpus.sh corpora (a smoke run on --train-lines 1000 needs about 1000).
Any config key can be overridden through the environment,
e.g. the paper's IWSLT'14 job shrunk for a CPU (a pipeline check, not a translation model):
  MAX_EPOCH=0 MAX_UPDATE=300 MAX_TOKENS=2048 EMBED_DIM=128 FFN_DIM=256 HEADS=2 \\
  ENCODER_LAYERS=2 DECODER_LAYERS=2 AVG_CANDIDATES="1 2" SAVE_INTERVAL_UPDATES=100 \\
  bash scripts/quickstart.sh --cpu --experiment $GPU_EXPERIMENT --valid-lines 500 --test-lines 300
USAGE
}

QUICKSTART_ARGS=("$@")  # for the summary's command that trains longer
# a signal: the last line says what was kept and the command that resumes (KEPT, scripts/lib.sh); train.sh,
# called here, says what it kept and leaves the command to this one (one "rerun" line, not two)
KEPT="finished steps and saved checkpoints are kept; rerun the same command to resume: $(quote bash "$0" "$@")"
export TFIXUP_RESUME_SAID_BY=quickstart.sh
EXPERIMENT=""; WORK=${WORK_DIR:-}; CPU=0; ARCHIVE=""; TRAIN_LINES=0; VALID_LINES=0; TEST_LINES=0; NO_INSTALL=0; DRY_RUN=0
TRAIN_ARGS=()
read_options "experiment work archive train-lines valid-lines test-lines" "cpu no-install dry-run" TRAIN_ARGS -- "$@"
for v in TRAIN_LINES VALID_LINES TEST_LINES; do
  [[ ${!v} =~ ^[0-9]+$ ]] || die "--$(echo "${v,,}" | tr _ -) must be a whole number, got '${!v}'"
done
# fail before installing and preparing, not after (a dry run may show the GPU job anywhere)
[ "$CPU" = 1 ] || [ "$DRY_RUN" = 1 ] || [ "$(gpu_count)" -gt 0 ] \
  || die "no CUDA GPU visible: rerun with --cpu (the CPU main job: a small model on Multi30k De-En)"
DEVICE=gpu; [ "$CPU" = 0 ] || DEVICE=cpu
[ -n "$EXPERIMENT" ] || { if [ "$CPU" = 1 ]; then EXPERIMENT=$CPU_EXPERIMENT; else EXPERIMENT=$GPU_EXPERIMENT; fi; }
cfg=()
config_get cfg "$EXPERIMENT" -- EXPERIMENT DATASET PREPARE
EXPERIMENT=${cfg[0]}; DATASET=${cfg[1]}  # the config's name (--experiment may be a path)
# PREPARE is "script [args]" (plain words: harness/config.py), split on blanks, never globbed
read -r -a PREP <<< "${cfg[2]}"
WORK=${WORK:-work/quickstart-$DEVICE-$EXPERIMENT}
# a data-bin of part of a split is another data-bin: its own name, never reused for the full one
DATA=$WORK/data-bin/$DATASET
[ "$TRAIN_LINES$VALID_LINES$TEST_LINES" = 000 ] || DATA=$DATA-n$TRAIN_LINES-v$VALID_LINES-t$TEST_LINES
RUN=$WORK/runs/$EXPERIMENT
S=$TFIXUP_ROOT/scripts
dev=(); [ "$CPU" = 1 ] && dev=(--cpu)

# The prepare command: the config's PREPARE plus this job's inputs and output.
prepare_command() {
  PREPARE_CMD=(bash "$S/${PREP[0]}" "${PREP[@]:1}" --out "$DATA"
               --train-lines "$TRAIN_LINES" --valid-lines "$VALID_LINES" --test-lines "$TEST_LINES")
  case ${PREP[0]} in
    prepare-iwslt14.sh) PREPARE_CMD+=(${ARCHIVE:+--archive "$ARCHIVE"});;
    prepare-corpus.sh)
      [ -z "$ARCHIVE" ] || die "--archive is for IWSLT'14 experiments, not $EXPERIMENT"
      case $DATASET in
        multi30k.*) local d=$TFIXUP_SHARED_DATA/multi30k
                    [ -d "$d" ] || die "Multi30k not found at $d (set TFIXUP_SHARED_DATA to the folder holding multi30k/)"
                    PREPARE_CMD+=(--train "$d/train" --valid "$d/val" --test "$d/test_2016_flickr")
                    # fewer merges for a smoke run on a few thousand pairs (8000 would leave unseen
                    # words without subwords to fall back on: <unk>)
                    PREPARE_CMD+=(${BPE_MERGES:+--bpe-merges "$BPE_MERGES"});;
        *) die "$EXPERIMENT: no offline inputs known for dataset $DATASET";;
      esac;;
    *) die "$EXPERIMENT is prepared by ${PREP[0]}: run it and scripts/train.sh yourself (docs/pipelines.md)";;
  esac
}
prepare_command

TRAIN_CMD=(bash "$S/train.sh" "${dev[@]}" "${TRAIN_ARGS[@]}" "$EXPERIMENT" "$DATA" "$RUN" -- --log-format json)
EVAL_CMD=(bash "$S/evaluate.sh" "${dev[@]}" "$EXPERIMENT" "$DATA" "$RUN")
REPORT_CMD=(bash "$S/report.sh" --runs "$WORK/runs" --out "$RUN/report.md" "$EXPERIMENT")
SUMMARY_CMD=(python3 -m harness.summary --run "$RUN" --png "$RUN/learning-curve.png" --report "$RUN/report.md"
             -- "${QUICKSTART_ARGS[@]}")
# the job's record, RUN/main-job.json (with the step marks and the machine's load, added when run)
RECORD_CMD=(python3 -m harness.main_job record "$RUN" --data "$DATA")

if [ "$DRY_RUN" = 1 ]; then
  show() { printf '%q ' "$@" | sed 's/ $//'; echo; }
  [ "$NO_INSTALL" = 1 ] || show bash "$S/install.sh"
  show "${PREPARE_CMD[@]}"
  # train.sh checks the config with every override and prints fairseq-train's command; evaluate.sh
  # reads the config a run recorded, so before training it can only be shown
  "${TRAIN_CMD[@]:0:2}" --dry-run "${TRAIN_CMD[@]:2}"
  show "${EVAL_CMD[@]}"
  show "${REPORT_CMD[@]}"
  show "${SUMMARY_CMD[@]}"
  show "${RECORD_CMD[@]}" --marks START INSTALLED PREPARED TRAINED -- "${QUICKSTART_ARGS[@]}"
  exit 0
fi
# the job's record (harness/main_job.py): when it started and when each step ended
now() { date +%s.%N; }
T_START=$(now)
# torch threads for training and evaluation: not more than the cores other trainings leave (set_threads),
# then not more than the cores free now (other work takes cores too), with a line when the machine is busy
USER_THREADS=${OMP_NUM_THREADS:-}
set_threads
if [ "$NO_INSTALL" = 0 ]; then
  log "1/6 install (skipped when already done)"
  bash "$S/install.sh"
  # shellcheck disable=SC1091
  . "${VENV:-$TFIXUP_ROOT/.venv}/bin/activate"
fi
use_venv
T_INSTALLED=$(now)
load=$(python3 -m harness.cpu_load threads "$OMP_NUM_THREADS" ${USER_THREADS:+--chosen-by-user})
read -r threads busy <<< "${load%%$'\n'*}"
[ "$load" = "${load%%$'\n'*}" ] || log "${load#*$'\n'}"
if [ "$threads" != "$OMP_NUM_THREADS" ]; then
  log "torch threads: $threads per process (fewer cores are free now than set_threads counted)"
  export OMP_NUM_THREADS=$threads TFIXUP_THREADS=$threads
fi
log "2/6 prepare $DATASET -> $DATA"
"${PREPARE_CMD[@]}"
T_PREPARED=$(now)
log "3/6 train $EXPERIMENT -> $RUN (rerun to resume)"
# JSON log lines: the summary reads the learning curve from train.log
"${TRAIN_CMD[@]}"
T_TRAINED=$(now)
log "4/6 evaluate"
"${EVAL_CMD[@]}"
log "5/6 report"
"${REPORT_CMD[@]}"
log "6/6 summary"
"${SUMMARY_CMD[@]}"
"${RECORD_CMD[@]}" --marks "$T_START" "$T_INSTALLED" "$T_PREPARED" "$T_TRAINED" --threads "$OMP_NUM_THREADS" \
  ${busy:+--busy "$busy"} -- "${QUICKSTART_ARGS[@]}"
