#!/usr/bin/env bash
# Kept for existing users: the main job (scripts/quickstart.sh) with the paper's IWSLT'14 De-En
# recipe, on GPU or, with --cpu, on CPU. Same options.
set -euo pipefail
exec bash "$(dirname "$0")/quickstart.sh" --experiment iwslt14_de_en_tfixup "$@"
