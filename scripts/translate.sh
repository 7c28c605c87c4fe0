#!/usr/bin/env bash
# Translate your own text with a trained run: one translation per input line.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

usage() {
  cat <<USAGE
usage: $0 [--show] [--verbose] RUN_DIR [FILE]

Translates FILE (or stdin: a pipe, or sentences typed one per line) with the final model of
RUN_DIR, a run of scripts/train.sh: RUN_DIR/eval/averaged.pt (scripts/evaluate.sh), else
checkpoints/checkpoint_best.pt, else checkpoint_last.pt. The text gets exactly the
preprocessing of the data-bin the run trained on, as its manifest.json records it (Moses
tokenizer, lowercasing, BPE codes); the output is detokenized, and sentence-cased when the
training text was lowercased (first letter and the pronoun "I" upper-case; names stay lowercase).
Beam and length penalty: the run's config (BEAM, LENPEN).
  --show      print the model, data-bin, dictionaries, BPE codes and preprocessing (JSON)
  --verbose   also print each sentence's tokens in (S:) and out (T:) on stderr
Example:
  echo "Zwei Männer spielen Fußball im Park." | bash $0 work/quickstart-cpu-multi30k_de_en_cpu_tfixup/runs/multi30k_de_en_cpu_tfixup
USAGE
}

for a in "$@"; do case $a in -h|--help) usage; exit 0;; esac; done
[ $# -ge 1 ] || { usage >&2; die "name a run folder (scripts/train.sh OUT_DIR)"; }
use_venv
exec python3 -m harness.translate "$@"
