#!/usr/bin/env bash
# Train one experiment of configs/ with fairseq-train and the T-Fixup plugin.
# Rerunning the same command resumes from OUT_DIR/checkpoints/checkpoint_last.pt.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/pipeline-lib.sh"

usage() {
  cat <<USAGE
usage: $0 [options] EXPERIMENT DATA_DIR OUT_DIR [-- extra fairseq-train args]

EXPERIMENT is a file name in configs/ without .sh (e.g. iwslt14_de_en_tfixup) or a path.
Every config value can be overridden by an environment variable of the same name
(e.g. MAX_UPDATE=300 MAX_TOKENS=2048 EMBED_DIM=64) or by --set KEY=VALUE.

Devices (default: every visible GPU on this machine, fp16 when the config says FP16=1):
  --cpu                 train on CPU
  --nproc N             processes on this machine: GPUs to use, or with --cpu N CPU
                        processes (gloo, legacy_ddp, one explicitly started process per rank)
  --nnodes N            multi-node through torchrun: run the same command on every node
  --node-rank R         with --nnodes (default \$NODE_RANK or 0)
  --master-addr HOST    with --nnodes (default \$MASTER_ADDR or 127.0.0.1)
  --master-port PORT    rendezvous port (default \$MASTER_PORT or 29500)
  --slurm               inside srun (one task per GPU): fairseq reads ranks from SLURM_*
  --bf16                bf16 instead of fp16 on GPU
  --per-process-batch   keep MAX_TOKENS per process and --update-freq 1 (the update grows
                        with the number of processes); default keeps the paper's effective
                        batch MAX_TOKENS x BATCH_SHARDS by setting --update-freq/--max-tokens
Other:
  --set KEY=VALUE       override a config value (repeatable)
  --dry-run             print the exact command(s) (one line per process) and exit
  -h, --help            this text
Outputs in OUT_DIR: checkpoints/, train.log, train_command.sh, train_runs.tsv (wall time per run).
USAGE
}

CPU=0; NPROC=""; NNODES=1; NODE_RANK=${NODE_RANK:-0}; MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-29500}; SLURM=0; BF16=0; PER_PROCESS_BATCH=0; DRY_RUN=0; POS=(); EXTRA=()
while [ $# -gt 0 ]; do
  case $1 in
    --cpu) CPU=1; shift;;
    --nproc) NPROC=$2; shift 2;;
    --nnodes) NNODES=$2; shift 2;;
    --node-rank) NODE_RANK=$2; shift 2;;
    --master-addr) MASTER_ADDR=$2; shift 2;;
    --master-port) MASTER_PORT=$2; shift 2;;
    --slurm) SLURM=1; shift;;
    --bf16) BF16=1; shift;;
    --per-process-batch) PER_PROCESS_BATCH=1; shift;;
    --set) apply_set "$2"; shift 2;;
    --dry-run) DRY_RUN=1; shift;;
    -h|--help) usage; exit 0;;
    --) shift; EXTRA=("$@"); break;;
    -*) usage >&2; die "unknown option: $1";;
    *) POS+=("$1"); shift;;
  esac
done
[ ${#POS[@]} -eq 3 ] || { usage >&2; die "expected EXPERIMENT DATA_DIR OUT_DIR, got ${#POS[@]} arguments"; }
for v in NPROC NNODES NODE_RANK MASTER_PORT; do
  flag=${v,,}; flag=--${flag//_/-}
  [ -z "${!v}" ] || [[ ${!v} =~ ^[0-9]+$ ]] || die "$flag must be a number, got '${!v}'"
done
load_experiment "${POS[0]}"
DATA=${POS[1]}; OUT=${POS[2]}
if [ "$DRY_RUN" = 0 ]; then  # a dry run may show the command before the data exists
  [ -d "$DATA" ] || die "data dir not found: $DATA (make it with scripts/$PREPARE)"
  [ -f "$DATA/dict.$SRC.txt" ] || die "not a fairseq data-bin for $SRC-$TGT (no dict.$SRC.txt): $DATA"
fi
[ "$DRY_RUN" = 1 ] || use_venv

# ---- processes and devices
if [ "$CPU" = 1 ]; then
  NPROC=${NPROC:-1}; DEVICE=cpu; WORLD=$NPROC
  [ "$NNODES" = 1 ] || die "--cpu runs on one machine (use --nproc N)"
elif [ "$SLURM" = 1 ]; then
  WORLD=${SLURM_NTASKS:?--slurm needs SLURM_NTASKS (run under srun)}; DEVICE=cuda
else
  NGPU=$(gpu_count)
  if [ "$NGPU" -eq 0 ] && [ "$DRY_RUN" = 1 ]; then
    NGPU=${NPROC:-1}; log "dry run: no GPU visible here; showing the command for $NGPU GPU(s) per node"
  fi
  [ "$NGPU" -gt 0 ] || die "no CUDA GPU visible: use --cpu (or set NGPUS)"
  NPROC=${NPROC:-$NGPU}; DEVICE=cuda
  WORLD=$((NNODES * NPROC))
fi
[ "$WORLD" -ge 1 ] || die "need at least one process"

# ---- batch: keep MAX_TOKENS x BATCH_SHARDS tokens per update on WORLD processes
if [ "$PER_PROCESS_BATCH" = 1 ]; then
  UPDATE_FREQ=1; TOKENS=$MAX_TOKENS
else
  UPDATE_FREQ=$(( (BATCH_SHARDS + WORLD - 1) / WORLD ))
  TOKENS=$(( MAX_TOKENS * BATCH_SHARDS / (WORLD * UPDATE_FREQ) ))
fi

# ---- the fairseq-train arguments, from the config
args=("$DATA" --user-dir "$TFIXUP_ROOT/fairseq_tfixup" --task translation
      --source-lang "$SRC" --target-lang "$TGT"
      --arch "$ARCH" --encoder-layers "$ENCODER_LAYERS" --decoder-layers "$DECODER_LAYERS")
[ -z "$EMBED_DIM" ] || args+=(--encoder-embed-dim "$EMBED_DIM" --decoder-embed-dim "$EMBED_DIM")
[ -z "$FFN_DIM" ] || args+=(--encoder-ffn-embed-dim "$FFN_DIM" --decoder-ffn-embed-dim "$FFN_DIM")
[ -z "$HEADS" ] || args+=(--encoder-attention-heads "$HEADS" --decoder-attention-heads "$HEADS")
case $SHARE_EMBED in
  decoder) args+=(--share-decoder-input-output-embed);;
  all) args+=(--share-all-embeddings);;
  none) ;;
  *) die "SHARE_EMBED must be decoder, all or none, got '$SHARE_EMBED'";;
esac
[ "$NORMALIZE_BEFORE" = 1 ] && args+=(--encoder-normalize-before --decoder-normalize-before)
args+=(--dropout "$DROPOUT" --attention-dropout "$ATTENTION_DROPOUT" --activation-dropout "$ACTIVATION_DROPOUT"
       --weight-decay "$WEIGHT_DECAY"
       --criterion label_smoothed_cross_entropy --label-smoothing "$LABEL_SMOOTHING"
       --optimizer "$OPTIMIZER" --adam-betas "$ADAM_BETAS" --clip-norm "$CLIP_NORM"
       --lr "$LR" --lr-scheduler "$LR_SCHEDULER")
[ -z "$DECAY_PERIOD" ] || args+=(--decay-period "$DECAY_PERIOD")
[ "${WARMUP_UPDATES:-0}" = 0 ] || args+=(--warmup-updates "$WARMUP_UPDATES")
[ -z "$WARMUP_INIT_LR" ] || args+=(--warmup-init-lr "$WARMUP_INIT_LR")
args+=(--max-tokens "$TOKENS" --update-freq "$UPDATE_FREQ" --seed "$SEED"
       --save-dir "$OUT/checkpoints" --keep-last-epochs "$KEEP_LAST"
       --log-format simple --log-interval "${LOG_INTERVAL:-100}")
[ "${MAX_EPOCH:-0}" = 0 ] || args+=(--max-epoch "$MAX_EPOCH")
[ "${MAX_UPDATE:-0}" = 0 ] || args+=(--max-update "$MAX_UPDATE")
[ "${MAX_EPOCH:-0}${MAX_UPDATE:-0}" != 00 ] || die "$EXPERIMENT: set MAX_EPOCH or MAX_UPDATE"
if [ "${SAVE_INTERVAL_UPDATES:-0}" != 0 ]; then
  args+=(--save-interval-updates "$SAVE_INTERVAL_UPDATES" --keep-interval-updates "$KEEP_LAST")
fi
if [ "$CPU" = 1 ]; then
  args+=(--cpu)
elif [ "$BF16" = 1 ]; then
  args+=(--bf16)
elif [ "$FP16" = 1 ]; then
  args+=(--fp16)
fi
# shellcheck disable=SC2206
[ -z "$EXTRA_TRAIN_ARGS" ] || args+=($EXTRA_TRAIN_ARGS)

# ---- one command line per process to start here
cmds=()
quote() { printf '%q ' "$@" | sed 's/ $//'; }
if [ "$CPU" = 1 ] && [ "$NPROC" -gt 1 ]; then
  # fairseq only spawns per GPU: on CPU each rank is its own process
  for ((r = 0; r < NPROC; r++)); do
    cmds+=("$(quote fairseq-train "${args[@]}" --distributed-world-size "$NPROC" --distributed-rank "$r" \
      --distributed-init-method "tcp://127.0.0.1:$MASTER_PORT" --distributed-backend gloo \
      --ddp-backend legacy_ddp --distributed-no-spawn "${EXTRA[@]}")")
  done
elif [ "$SLURM" = 1 ]; then
  # one srun task per GPU: fairseq reads rank and device from SLURM_PROCID/SLURM_LOCALID
  cmds+=("$(quote fairseq-train "${args[@]}" --distributed-world-size "$WORLD" --distributed-port "$MASTER_PORT" "${EXTRA[@]}")")
elif [ "$NNODES" -gt 1 ]; then
  cmds+=("$(quote torchrun --nnodes "$NNODES" --nproc-per-node "$NPROC" --node-rank "$NODE_RANK" \
    --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" "$(command -v fairseq-train || echo fairseq-train)" \
    "${args[@]}" --distributed-world-size "$WORLD" "${EXTRA[@]}")")
else
  # one node: fairseq spawns one process per GPU itself. The world size is always
  # given, since fairseq's default (every visible GPU) would not match --update-freq.
  cmds+=("$(quote fairseq-train "${args[@]}" --distributed-world-size "$WORLD" "${EXTRA[@]}")")
fi

if [ "$DRY_RUN" = 1 ]; then
  printf '%s\n' "${cmds[@]}"
  exit 0
fi

mkdir -p "$OUT"
printf '%s\n' "${cmds[@]}" > "$OUT/train_command.sh.tmp" && mv "$OUT/train_command.sh.tmp" "$OUT/train_command.sh"
if [ "$DEVICE" = cuda ]; then
  DEVICE_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1 | tr -s ' ' '_' || true)
  DEVICE_NAME=${DEVICE_NAME:-cuda}
else
  DEVICE_NAME=cpu
fi
log "train $EXPERIMENT on $WORLD x $DEVICE_NAME (update-freq $UPDATE_FREQ, max-tokens $TOKENS) -> $OUT"
if [ -f "$OUT/checkpoints/checkpoint_last.pt" ]; then
  # fairseq takes one more update before it checks --max-update: a finished run is left alone
  # read safely (weights_only): a checkpoint that cannot be read stops the script here
  done_updates=$(python -c 'import sys; from fairseq_tfixup.checkpoints import num_updates
try:
    print(num_updates(sys.argv[1]))
except Exception as e:
    sys.exit(f"error: cannot resume: {str(e).splitlines()[0]}; move it away to resume from an older checkpoint")
' "$OUT/checkpoints/checkpoint_last.pt") || exit 1
  if [ "${MAX_UPDATE:-0}" != 0 ] && [ "$done_updates" -ge "$MAX_UPDATE" ]; then
    log "already trained: $done_updates >= MAX_UPDATE $MAX_UPDATE updates in $OUT/checkpoints/checkpoint_last.pt"
    exit 0
  fi
  log "resuming from $OUT/checkpoints/checkpoint_last.pt ($done_updates updates)"
fi

# fairseq logs to stdout: unbuffered, so train.log is current while it runs
export PYTHONUNBUFFERED=1
start=$(date +%s); rc=0
# a run stopped by SIGTERM/SIGINT (e.g. SLURM preemption) still books its time
record_run() { printf '%s\t%s\t%s\t%s\t%s\n' "$start" "$(date +%s)" "$WORLD" "$DEVICE_NAME" "$1" >> "$OUT/train_runs.tsv"; }
trap 'record_run 143; exit 143' TERM
trap 'record_run 130; exit 130' INT
if [ ${#cmds[@]} -gt 1 ]; then
  pids=()
  trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
  for ((r = 0; r < ${#cmds[@]}; r++)); do
    if [ "$r" = 0 ]; then
      bash -c "${cmds[$r]}" > >(tee -a "$OUT/train.log") 2>&1 & pids+=($!)
    else
      bash -c "${cmds[$r]}" >> "$OUT/train.rank$r.log" 2>&1 & pids+=($!)
    fi
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
  trap - EXIT
else
  bash -c "${cmds[0]}" 2>&1 | tee -a "$OUT/train.log" || rc=$?
fi
# each run's wall time and device count, for the report's device-hours
trap - TERM INT
record_run "$rc"
[ "$rc" = 0 ] || die "fairseq-train failed (exit $rc); see $OUT/train.log; rerun the same command to resume"
log "done: $OUT/checkpoints"
