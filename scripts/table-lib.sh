# run_table: prepare -> train -> evaluate every experiment of a paper table, then
# render its report. Sourced by scripts/table1.sh, table2.sh, table3.sh, fig4b.sh
# after they set TABLE_TITLE, TABLE_FILE and EXPERIMENTS.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
supervise "$@"  # SIGTERM/SIGINT stop every step's processes at once
KEPT="finished experiments and saved checkpoints are kept; rerun the same command to resume: $(quote bash "$0" "$@")"
. "$(dirname "${BASH_SOURCE[0]}")/pipeline-lib.sh"

usage() {
  cat <<USAGE
usage: $0 [options] [-- train.sh options]

$TABLE_TITLE. Experiments (configs/NAME.conf):
$(printf '  %s\n' "${EXPERIMENTS[@]}")
For each: prepare its data (once per dataset), train (resumes), evaluate; then
write the report to RUNS/$TABLE_FILE.

  --data-root DIR      data-bin folders (default \$DATA_ROOT or data-bin)
  --runs DIR           one output folder per experiment (default \$RUNS or work/runs)
  --only NAME          run only this experiment (repeatable)
  --prepare-args STR   extra arguments for the WMT prepare scripts (e.g. "--archives DIR --testsets DIR")
  --iwslt-args STR     extra arguments for prepare-iwslt14.sh (e.g. "--archive DIR/de-en.tgz")
  --eval-args STR      extra arguments for evaluate.sh (e.g. "--cpu")
  --report-only        skip the runs, only render the report
  --dry-run            print every command (train.sh --dry-run shows the exact fairseq-train line)
  -- ARGS              passed to scripts/train.sh (e.g. --cpu, --nproc 4, --nnodes 2 ...)
Config values can be overridden by environment variables (e.g. MAX_UPDATE=1000) or by
--set KEY=VALUE among the train.sh options.
USAGE
}

DATA_ROOT=${DATA_ROOT:-data-bin}; RUNS=${RUNS:-work/runs}; ONLY=(); PREPARE_ARGS=""; IWSLT_ARGS=""; EVAL_ARGS=""
REPORT_ONLY=0; DRY_RUN=0; TRAIN_ARGS=()
read_options "data-root runs only prepare-args iwslt-args eval-args" "report-only dry-run" TRAIN_ARGS -- "$@"
# NAME is one of the LIST's words. Not `printf | grep -q`: grep ends at the first match and, under pipefail,
# printf's SIGPIPE failed the test at random
in_list() {  # NAME LIST...
  local w; for w in "${@:2}"; do [ "$w" = "$1" ] && return 0; done; return 1
}
for n in "${ONLY[@]}"; do
  in_list "$n" "${EXPERIMENTS[@]}" || die "'$n' is not an experiment of this table"
done
S=$TFIXUP_ROOT/scripts

run_one() {  # NAME
  local v=()
  config_get v "$1" -- DATASET PREPARE TEST_SET TABLE ROW PAPER_BLEU
  local data=$DATA_ROOT/${v[0]} out=$RUNS/$1 test_set=${v[2]}
  # PREPARE is "script [args]" (harness/config.py allows only a scripts/prepare-*.sh and plain
  # words); the *_ARGS options are word lists by design (usage). Split on blanks, never globbed.
  local prep=() extra=() ev=()
  read -r -a prep <<< "${v[1]}"
  read -r -a extra <<< "$PREPARE_ARGS"
  read -r -a ev <<< "$EVAL_ARGS"
  [ "${prep[0]}" != prepare-iwslt14.sh ] || read -r -a extra <<< "$IWSLT_ARGS"
  local prepare_cmd=(bash "$S/${prep[0]}" "${prep[@]:1}" --out "$data")
  [ -z "$test_set" ] || prepare_cmd+=(--test-set "$test_set")
  prepare_cmd+=("${extra[@]}")
  local train_cmd=(bash "$S/train.sh" "${TRAIN_ARGS[@]}" "$1" "$data" "$out")
  local eval_cmd=(bash "$S/evaluate.sh" "${ev[@]}" "$1" "$data" "$out")
  if [ "$DRY_RUN" = 1 ]; then
    echo "# $1: ${v[3]}, ${v[4]} (paper BLEU ${v[5]:-n/a})"
    printf '%q ' "${prepare_cmd[@]}"; echo
    "${train_cmd[@]:0:2}" --dry-run "${train_cmd[@]:2}"
    printf '%q ' "${eval_cmd[@]}"; echo
    return
  fi
  # each step dies with this script, even on kill -9 (lib.sh PARENT_DEATH)
  [ -d "$data" ] || "${PARENT_DEATH[@]}" "${prepare_cmd[@]}"
  "${PARENT_DEATH[@]}" "${train_cmd[@]}"
  "${PARENT_DEATH[@]}" "${eval_cmd[@]}"
}

if [ "$REPORT_ONLY" = 0 ]; then
  for n in "${EXPERIMENTS[@]}"; do
    if [ ${#ONLY[@]} -gt 0 ] && ! in_list "$n" "${ONLY[@]}"; then continue; fi
    log "=== $n"
    run_one "$n"
  done
fi
if [ "$DRY_RUN" = 1 ]; then
  printf '%q ' bash "$S/report.sh" --runs "$RUNS" --title "$TABLE_TITLE" --out "$RUNS/$TABLE_FILE" "${EXPERIMENTS[@]}"; echo
  exit 0
fi
mkdir -p "$RUNS"
bash "$S/report.sh" --runs "$RUNS" --title "$TABLE_TITLE" --out "$RUNS/$TABLE_FILE" "${EXPERIMENTS[@]}"
