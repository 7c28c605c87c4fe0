#!/usr/bin/env bash
# Train one experiment of configs/ with fairseq-train and the T-Fixup plugin.
# Rerunning the same command resumes from OUT_DIR/checkpoints/checkpoint_last.pt.
. "$(dirname "$0")/step.sh"  # set -euo pipefail, helpers, signals forwarded to children

usage() {
  cat <<USAGE
usage: $0 [options] EXPERIMENT DATA_DIR OUT_DIR [-- extra fairseq-train args]

EXPERIMENT is a name in configs/ (e.g. iwslt14_de_en_tfixup; list: python3 -m harness.config list)
or a path to a .conf file. Any config key can be overridden by --set KEY=VALUE or an environment
variable of the same name (e.g. MAX_UPDATE=300 MAX_TOKENS=2048 EMBED_DIM=64; keys: configs/defaults.conf).

Devices (default: every visible GPU on this machine, fp16 when the config says FP16=1):
  --cpu                 train on CPU
  --nproc N             processes on this machine: GPUs to use, or with --cpu N CPU
                        processes (gloo, legacy_ddp, one explicitly started process per rank)
  --nnodes N            multi-node through torchrun: run the same command on every node
  --node-rank R         with --nnodes (default \$NODE_RANK or 0)
  --master-addr HOST    with --nnodes (default \$MASTER_ADDR or 127.0.0.1)
  --master-port PORT    rendezvous port (default \$MASTER_PORT or 29500)
  --slurm               inside srun (one task per GPU): fairseq reads ranks from SLURM_*
  --bf16                refused: fairseq 0.12's --bf16 means TPU (it sets --tpu); on a GPU
                        train in fp16 (FP16=1, the WMT configs) or fp32 (--set FP16=0)
  --per-process-batch   keep MAX_TOKENS per process and --update-freq 1 (the update grows
                        with the number of processes); default keeps the paper's effective
                        batch MAX_TOKENS x BATCH_SHARDS by setting --update-freq/--max-tokens
Other:
  --set KEY=VALUE       override a config value (repeatable); with --cpu, LOG_INTERVAL defaults
                        to \$CPU_LOG_INTERVAL or 10 updates (the configs log every 100, GPU rates);
                        each training line shown gets an ETA (from MAX_UPDATE, or MAX_EPOCH)
  --dry-run             print the exact command(s) (one line per process) and exit
  -h, --help            this text
Outputs in OUT_DIR: checkpoints/, config.resolved.json (the resolved config and the exact
command), train.log, train_command.sh, train_runs.tsv (wall time and outcome per run: 0, the
exit code of a failed run, "interrupted" for SIGTERM/SIGINT/SIGHUP, "killed" for a run that could not
book itself). On a failure the last line names the cause and the next command to run.
One train.sh at a time per OUT_DIR (a lock, OUT_DIR/.lock); OUT_DIR keeps its settings once it
holds a checkpoint (before that, a rerun may change them).
USAGE
}

CPU=0; NPROC=""; NNODES=1; NODE_RANK=${NODE_RANK:-0}; MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-29500}; SLURM=0; BF16=0; PER_PROCESS_BATCH=0; DRY_RUN=0
POS=(); EXTRA=(); SET=(); SETS=()

parse_options() {
  read_options "nproc nnodes node-rank master-addr master-port set" "cpu slurm bf16 per-process-batch dry-run" \
    EXTRA POS -- "$@"
  # fairseq 0.12 (options.py) turns --bf16 into --tpu: it cannot train in bf16 on a GPU
  [ "$BF16" = 0 ] || die "--bf16: fairseq 0.12 trains bf16 only on TPUs (its --bf16 sets --tpu); on a GPU use fp16 (--set FP16=1) or fp32 (--set FP16=0)"
  local s; for s in "${SET[@]}"; do SETS+=(--set "$s"); done
  [ ${#POS[@]} -eq 3 ] || { usage >&2; die "expected EXPERIMENT DATA_DIR OUT_DIR, got ${#POS[@]} arguments"; }
  local v flag
  for v in NPROC NNODES NODE_RANK MASTER_PORT; do
    flag=${v,,}; flag=--${flag//_/-}
    [ -z "${!v}" ] || [[ ${!v} =~ ^[0-9]+$ ]] || die "$flag must be a number, got '${!v}'"
  done
}

# DEVICE (cpu/cuda), DEVICE_KIND (for the config: cpu or cuda), NPROC and WORLD
choose_devices() {
  if [ "$CPU" = 1 ]; then
    NPROC=${NPROC:-1}; DEVICE=cpu; DEVICE_KIND=cpu; WORLD=$NPROC
    [ "$NNODES" = 1 ] || die "--cpu runs on one machine (use --nproc N)"
    return
  fi
  DEVICE=cuda; DEVICE_KIND=cuda
  if [ "$SLURM" = 1 ]; then
    WORLD=${SLURM_NTASKS:?--slurm needs SLURM_NTASKS (run under srun)}
    return
  fi
  local ngpu; ngpu=$(gpu_count)
  if [ "$ngpu" -eq 0 ] && [ "$DRY_RUN" = 1 ]; then
    ngpu=${NPROC:-1}; log "dry run: no GPU visible here; showing the command for $ngpu GPU(s) per node"
  fi
  [ "$ngpu" -gt 0 ] || die "no CUDA GPU visible: use --cpu (or set NGPUS)"
  NPROC=${NPROC:-$ngpu}
  WORLD=$((NNODES * NPROC))
  [ "$WORLD" -ge 1 ] || die "need at least one process"
}

# The config's --log-format and its value are dropped when an extra argument after "--" sets it again
# (quickstart.sh's --log-format json): fairseq takes the last, but the command showed both.
drop_overridden() {  # ARRAY (the config's fairseq-train arguments)
  local -n _args=$1
  local kept=() i opt
  for ((i = 0; i < ${#_args[@]}; i++)); do
    opt=${_args[$i]}
    if [[ $opt == --log-format ]] && [[ " ${EXTRA[*]} " == *" $opt "* || " ${EXTRA[*]} " == *" $opt="* ]]; then
      i=$((i + 1)); continue  # the option and its value
    fi
    kept+=("$opt")
  done
  _args=("${kept[@]}")
}

# CMDS: one shell-quoted command line per process to start on this machine
build_commands() {
  local args=() tmp
  tmp=$(mktemp)
  local bpp=(); [ "$PER_PROCESS_BATCH" = 0 ] || bpp=(--per-process-batch)
  python3 -m harness.config train-args "$EXPERIMENT" "$DATA" "$OUT" --world "$WORLD" --device "$DEVICE_KIND" \
    "${bpp[@]}" "${SETS[@]}" > "$tmp" || { rm -f "$tmp"; exit 1; }
  mapfile -d '' -t args < "$tmp"; rm -f "$tmp"
  drop_overridden args
  CMDS=()
  if [ "$CPU" = 1 ] && [ "$NPROC" -gt 1 ]; then
    # fairseq only spawns per GPU: on CPU each rank is its own process
    local r
    for ((r = 0; r < NPROC; r++)); do
      CMDS+=("$(quote fairseq-train "${args[@]}" --distributed-world-size "$NPROC" --distributed-rank "$r" \
        --distributed-init-method "tcp://127.0.0.1:$MASTER_PORT" --distributed-backend gloo \
        --ddp-backend legacy_ddp --distributed-no-spawn "${EXTRA[@]}")")
    done
  elif [ "$SLURM" = 1 ]; then
    # one srun task per GPU: fairseq reads rank and device from SLURM_PROCID/SLURM_LOCALID
    CMDS+=("$(quote fairseq-train "${args[@]}" --distributed-world-size "$WORLD" --distributed-port "$MASTER_PORT" "${EXTRA[@]}")")
  elif [ "$NNODES" -gt 1 ]; then
    CMDS+=("$(quote torchrun --nnodes "$NNODES" --nproc-per-node "$NPROC" --node-rank "$NODE_RANK" \
      --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" "$(command -v fairseq-train || echo fairseq-train)" \
      "${args[@]}" --distributed-world-size "$WORLD" "${EXTRA[@]}")")
  else
    # one node: fairseq spawns one process per GPU itself. The world size is always
    # given, since fairseq's default (every visible GPU) would not match --update-freq.
    CMDS+=("$(quote fairseq-train "${args[@]}" --distributed-world-size "$WORLD" "${EXTRA[@]}")")
  fi
}

device_name() {
  local name=cpu
  if [ "$DEVICE" = cuda ]; then
    name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1 | tr -s ' ' '_' || true)
  fi
  echo "${name:-cuda}"
}

# The config and the exact commands, recorded before training (a resumed run must keep its config)
record_config() {
  mkdir -p "$OUT"
  printf '%s\n' "${CMDS[@]}" > "$OUT/train_command.sh.tmp"
  mv "$OUT/train_command.sh.tmp" "$OUT/train_command.sh"
  python3 -m harness.config record "$EXPERIMENT" "${SETS[@]}" --commands "$OUT/train_command.sh" \
    --out "$OUT/config.resolved.json" --data "$DATA"
}

# One train.sh per OUT_DIR: two at once interleaved train.log and raced on the checkpoints. The
# lock (flock on OUT_DIR/.lock, which names the holder's PID) is held until this script and every
# process it started (they inherit it) have ended.
lock_run_dir() {
  need_writable "$OUT" OUT_DIR
  mkdir -p "$OUT"
  if ! command -v flock >/dev/null 2>&1; then log "warning: no flock on this machine: $OUT is not locked"; return 0; fi
  exec {LOCK_FD}>>"$OUT/.lock"
  if ! flock -n "$LOCK_FD"; then
    local holder; holder=$(head -c 32 "$OUT/.lock" 2>/dev/null | tr -cd 0-9 || true)
    die "$OUT is in use by another scripts/train.sh (PID ${holder:-?}; lock $OUT/.lock): wait for it to end, or stop it (kill ${holder:-PID}), then rerun"
  fi
  echo "${TFIXUP_SUPERVISOR:-$$}" > "$OUT/.lock" 2>/dev/null || true
}

# Exit 0 when checkpoint_last.pt already has MAX_UPDATE updates: fairseq would take one more
# update before it checks --max-update. The checkpoint is read safely (weights_only) and
# cheaply (tensors memory-mapped); one that cannot be read stops the script here.
check_resume() {
  local last=$OUT/checkpoints/checkpoint_last.pt done_updates
  [ -f "$last" ] || return 0
  # a corrupt checkpoint_last.pt: name the newest intact checkpoint and the commands
  # (its CRCs too: a bit flip loads without error and trains into NaN) and another run's model
  # (architecture and sizes against this run's command)
  done_updates=$(python3 -m harness updates "$last" --check-crc --expect "$OUT/train_command.sh" \
    --advise "$(quote bash "$0" "${ARGS[@]}")") || exit 1
  if [ "$MAX_UPDATE" != 0 ] && [ "$done_updates" -ge "$MAX_UPDATE" ]; then
    log "already trained: $done_updates >= MAX_UPDATE $MAX_UPDATE updates in $last"
    exit 0
  fi
  log "resuming from $last (update $done_updates)"
}

# Runs earlier calls could not book (killed outright, or a full disk): booked now, and a killed one
# said (harness/run_ledger.py keeps train_runs.tsv)
book_killed_run() {
  local note
  note=$(python3 -m harness.run_ledger book-killed "$OUT")
  [ -z "$note" ] || log "$note"
}

run_training() {
  local rc=0 device_name
  device_name=$(device_name)
  log "train $EXPERIMENT on $WORLD x $device_name -> $OUT"
  # fairseq logs to stdout: unbuffered, so train.log is current while it runs
  export PYTHONUNBUFFERED=1
  # each run's wall time and device count, for the report's device-hours; a run stopped
  # by SIGTERM/SIGINT (e.g. SLURM preemption) still books its time
  python3 -m harness.run_ledger open "$OUT" "$WORLD" "$device_name"
  # SIGTERM/SIGINT/SIGHUP (scripts/lib.sh's supervise sends SIGTERM to fairseq-train too; closing the
  # terminal sends SIGHUP to its whole process group): book the run as interrupted, whatever
  # fairseq-train's exit code was, and say what was kept
  stopped() {  # EXIT_CODE
    trap '' TERM INT HUP
    python3 -m harness.run_ledger close "$OUT" interrupted
    local rerun="; rerun the same command to resume: $(quote bash "$0" "${ARGS[@]}")"
    [ -z "${TFIXUP_RESUME_SAID_BY:-}" ] || rerun=" ($TFIXUP_RESUME_SAID_BY says how to resume)"
    STEP=""; log "interrupted: $(python3 -m harness.run_ledger saved "$OUT")$rerun"
    exit "$1"
  }
  trap 'stopped 143' TERM
  trap 'stopped 130' INT
  trap 'stopped 129' HUP
  if [ ${#CMDS[@]} -gt 1 ]; then
    local pids=() r pid
    # on any exit the ranks are stopped as supervise stops a tree (harness/proc.py): SIGTERM to each
    # rank's tree, SIGKILL to what is left after TFIXUP_STOP_SECONDS; on_exit then sees the exit status
    trap 'exit_rc=$?; python3 -m harness.proc stop "${pids[@]}" || true; on_exit "$exit_rc"' EXIT
    for ((r = 0; r < ${#CMDS[@]}; r++)); do
      if [ "$r" = 0 ]; then
        "${PARENT_DEATH[@]}" bash -c "exec ${CMDS[$r]}" > >(tee -a "$OUT/train.log" | quiet "$MAX_UPDATE" "$MAX_EPOCH") 2>&1 & pids+=($!)
      else
        "${PARENT_DEATH[@]}" bash -c "exec ${CMDS[$r]}" >> "$OUT/train.rank$r.log" 2>&1 & pids+=($!)
      fi
    done
    for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
    trap on_exit EXIT
  else
    # fairseq-train dies with this script, even on kill -9 (lib.sh PARENT_DEATH)
    "${PARENT_DEATH[@]}" bash -c "exec ${CMDS[0]}" 2>&1 | tee -a "$OUT/train.log" | quiet "$MAX_UPDATE" "$MAX_EPOCH" || rc=$?
  fi
  trap - TERM INT HUP
  python3 -m harness.run_ledger close "$OUT" "$rc"
  # the cause and the next command, in one line (NaN, bad data, a corrupt checkpoint, ...)
  [ "$rc" = 0 ] || die "$(python3 -m harness train-failure --log "$OUT/train.log" --exit "$rc" \
    --run "$OUT" -- bash "$0" "${ARGS[@]}")"
  log "done: $OUT/checkpoints"
}

main() {
  ARGS=("$@")
  parse_options "$@"
  # configs log every 100 updates (GPU rates); on CPU that is minutes of silence: log every
  # CPU_LOG_INTERVAL (default 10) updates unless LOG_INTERVAL is given (environment or --set)
  if [ "$CPU" = 1 ] && [ -z "${LOG_INTERVAL:-}" ] && [[ " ${SETS[*]} " != *" LOG_INTERVAL="* ]]; then
    SETS+=(--set "LOG_INTERVAL=${CPU_LOG_INTERVAL:-10}")
  fi
  # on CPU, no data-loader process: beside fairseq-train's torch threads it oversubscribes a small
  # machine's cores, and busy-waiting threads then run at a fraction of their speed
  if [ "$CPU" = 1 ] && [[ " ${EXTRA[*]} " != *" --num-workers "* ]]; then
    EXTRA=(--num-workers 0 "${EXTRA[@]}")
  fi
  DATA=${POS[1]}; OUT=${POS[2]}; EXPERIMENT=${POS[0]}
  if [ "$DRY_RUN" = 0 ]; then  # a dry run may show the command before the data exists
    # (and needs no values but the command's: build_commands reads and checks the config)
    local values=()
    config_get values "$EXPERIMENT" "${SETS[@]}" -- EXPERIMENT SRC PREPARE MAX_UPDATE MAX_EPOCH
    local name=${values[0]} src=${values[1]} prepare=${values[2]}; MAX_UPDATE=${values[3]} MAX_EPOCH=${values[4]}
    [ -d "$DATA" ] || die "data dir not found: $DATA (make it with scripts/$prepare)"
    [ -f "$DATA/dict.$src.txt" ] || die "not a fairseq data-bin for $name (no dict.$src.txt): $DATA"
    python3 -m harness.manifest check "$DATA" || exit 1  # incomplete data refused (one line)
    use_venv
  fi
  choose_devices
  build_commands
  if [ "$DRY_RUN" = 1 ]; then
    printf '%s\n' "${CMDS[@]}"
    exit 0
  fi
  set_threads "$NPROC"  # torch threads per process, for the NPROC processes started here
  lock_run_dir
  record_config
  book_killed_run  # and says so
  check_resume
  run_training
}

main "$@"
