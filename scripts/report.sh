#!/usr/bin/env bash
# Render the Markdown table: paper BLEU next to ours, for experiments evaluated by scripts/evaluate.sh.
. "$(dirname "$0")/step.sh"  # set -euo pipefail, helpers, signals forwarded to children

usage() {
  cat <<USAGE
usage: $0 [--runs DIR] [--title TEXT] [--out FILE] EXPERIMENT...

Reads DIR/EXPERIMENT/eval/results.json (rows without one are shown as "not run")
and prints the table (also written to FILE when given).
  --runs DIR     training/evaluation outputs, one folder per experiment (default \$RUNS or work/runs)
  --title TEXT   heading of the table
  --out FILE     also write the Markdown there (atomically)
USAGE
}
RUNS=${RUNS:-work/runs}; TITLE=""; OUTFILE=""; NAMES=()
while [ $# -gt 0 ]; do
  case $1 in
    --runs) RUNS=$2; shift 2;;
    --title) TITLE=$2; shift 2;;
    --out) OUTFILE=$2; shift 2;;
    -h|--help) usage; exit 0;;
    -*) usage >&2; die "unknown option: $1";;
    *) NAMES+=("$1"); shift;;
  esac
done
[ ${#NAMES[@]} -gt 0 ] || { usage >&2; die "name at least one experiment"; }
for n in "${NAMES[@]}"; do v=(); config_get v "$n" -- EXPERIMENT; done  # unknown names fail here
if [ -n "$OUTFILE" ]; then
  [ -d "$(dirname "$OUTFILE")" ] || die "--out $OUTFILE: no folder $(dirname "$OUTFILE") (create it first)"
fi
use_venv
results=(); for n in "${NAMES[@]}"; do results+=("$RUNS/$n/eval/results.json"); done
out=(); [ -z "$OUTFILE" ] || out=(--out "$OUTFILE")
python3 -m harness report --experiments "${NAMES[@]}" --results "${results[@]}" --title "$TITLE" "${out[@]}"
