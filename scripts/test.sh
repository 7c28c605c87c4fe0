#!/usr/bin/env bash
# Install (once) and run the test suite on every core. Extra arguments go to pytest
# (TEST_WORKERS=0: in one process).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
supervise "$@"  # SIGTERM/SIGINT stop every step's processes at once
bash "$TFIXUP_ROOT/scripts/install.sh"
# shellcheck disable=SC1091
. "${VENV:-$TFIXUP_ROOT/.venv}/bin/activate"
cd "$TFIXUP_ROOT"
# Every core (TEST_WORKERS, default auto), a test file per worker (its module fixtures are made once; a
# made-once fixture, such as the trained run, once for all workers), longest files first as timed in the last
# run (tests/conftest.py file_order; pytest's cache). One torch thread per process: most tests run
# fairseq-train or fairseq-generate in a subprocess, and two workers' multi-threaded processes on a small
# machine oversubscribe its cores, where busy-waiting threads run many times slower.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# Bytecode cached: the suite starts about a thousand Python processes (most of them the scripts' short
# steps), and with PYTHONDONTWRITEBYTECODE set each compiles the checkout's modules again; __pycache__ is
# git-ignored
unset PYTHONDONTWRITEBYTECODE
# the whole suite (no arguments) times itself into work/test-suite.json: README's suite time, published with
# the main job's record when measured at the same commit (harness/main_job.py); with its CPU time, user +
# system of pytest and every process it waited for (bash's `times` before and after: its second line, the
# shell's finished children), which bounds the wall time on this many cores from below
mkdir -p work
# and where that CPU time goes: each Python process of the suite accounts for itself at exit
# (tests/lean_fairseq/sitecustomize.py), summed into the record by kind (pytest, torch and fairseq, ...)
# (made before any test runs: a test that compares the checkout's ignored files before and after sees it in both)
processes=$TFIXUP_ROOT/work/.test-processes.jsonl
rm -f "$processes"
[ $# -gt 0 ] || { : > "$processes"; export TFIXUP_TEST_PROCESSES=$processes; }
T_START=$(date +%s.%N); rc=0
times > work/.test-cpu-before
python -m pytest -q -n "${TEST_WORKERS:-auto}" --dist loadfile --no-loadscope-reorder tests "$@" || rc=$?
times > work/.test-cpu-after
cpu_s=$(awk 'FNR == 2 { for (i = 1; i <= 2; i++) { split($i, t, "m"); s += (FILENAME ~ /after$/ ? 1 : -1) * (t[1] * 60 + t[2]) } }
             END { printf "%.1f", s }' work/.test-cpu-before work/.test-cpu-after)
rm -f work/.test-cpu-before work/.test-cpu-after
[ $# -gt 0 ] || python -m harness.main_job timing --processes "$processes" work/test-suite.json "$T_START" \
  what=scripts/test.sh passed="$([ "$rc" = 0 ] && echo true || echo false)" workers="${TEST_WORKERS:-auto}" \
  cpu_s="$cpu_s"
rm -f "$processes"
exit "$rc"
