# The start of a pipeline step (scripts/train.sh, evaluate.sh, report.sh), sourced as its first command:
# strict mode, the shared helpers, SIGTERM/SIGINT forwarded to the step's whole process tree (lib.sh's
# supervise, which reruns the script as its child: a sourced file sees the script's "$0" and "$@"), and
# the config helpers.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
supervise "$@"
. "$(dirname "${BASH_SOURCE[0]}")/pipeline-lib.sh"
