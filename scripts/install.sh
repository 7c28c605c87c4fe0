#!/usr/bin/env bash
# Create .venv and install fairseq-tfixup with its test and hf extras (idempotent); with --hf-only,
# torch, transformers and this package's tfixup only (no fairseq, nothing compiled).
# CPU torch by default; set TORCH_SPEC (e.g. "torch==2.13.0") to choose another.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
supervise "$@"  # SIGTERM/SIGINT stop every step's processes at once

usage() {
  cat <<USAGE
usage: $0 [--venv DIR] [--hf-only]
  --venv DIR   virtual environment to create/use (default \$VENV or $TFIXUP_ROOT/.venv)
  --hf-only    torch, transformers (setup.py's hf extra) and tfixup, for apply_tfixup on
               HuggingFace models: no fairseq, no compile, no test tools
Environment: PYTHON (default python3), TORCH_SPEC (default torch==2.13.0),
  INSTALL_LOG (default DIR/install.log: pip's full log, kept).
fairseq builds from source and needs torch at build time, so torch is installed
first and pinned for pip's isolated build environment (see pin_build_env).
USAGE
}
VENV=${VENV:-$TFIXUP_ROOT/.venv}; PYTHON=${PYTHON:-python3}; TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
HF_ONLY=0
while [ $# -gt 0 ]; do
  case $1 in
    --venv) VENV=$2; shift 2;;
    --hf-only) HF_ONLY=1; shift;;
    -h|--help) usage; exit 0;;
    *) usage >&2; die "unknown option: $1";;
  esac
done
INSTALL_LOG=${INSTALL_LOG:-$VENV/install.log}

# pip with progress: every line goes to the log, the lines that say what pip is
# doing ("Collecting", "Building", "Installing", "Successfully") go to the screen.
pip_logged() {
  log "pip install $*"
  python -m pip install --progress-bar off --log "$INSTALL_LOG" "$@" 2>&1 \
    | stream_awk '/^ *(Collecting|Building wheel|Installing collected|Successfully|ERROR|error)/ { sub(/^ +/, ""); print "    " $0; fflush() }'
}

# pip's log names every file it downloaded; a CUDA wheel there means some
# resolution (the build env's, usually) escaped the pin: multi-GB and a torch
# the venv does not have. Refuse to call that install good.
check_no_cuda() {
  # what pip fetched: "Collecting X", "Downloading X-...whl", "Using cached X-...whl"
  local fetched
  fetched=$(grep -Eio '(collecting|downloading|using cached) +[^ ]+' "$INSTALL_LOG" | awk '{print $NF}' | sort -u)
  if grep -Eiq '^(https?://[^ ]*/)?(nvidia|cuda)[-_]' <<< "$fetched" || grep -Eiq '(^|/)torch-[0-9.]+-' <<< "$fetched"; then
    grep -Ei '(nvidia|cuda)[-_]|(^|/)torch-[0-9.]+-' <<< "$fetched" | head -5 >&2
    die "pip fetched CUDA packages or a second torch (see $INSTALL_LOG): the torch pin did not reach fairseq's build; set TORCH_SPEC to your torch and rerun"
  fi
  log "pip fetched no CUDA package and no second torch (checked $INSTALL_LOG)"
}

# fairseq-fixed requires torchaudio but imports it only in its speech tasks; transformers imports it
# whenever it is installed (transformers.audio_utils, on the way to any model). PyPI's newest torchaudio
# (2.11) has no build for torch 2.13: its library fails to load at import, and every model of
# transformers with it. A torchaudio that does not import against this torch is removed.
drop_broken_torchaudio() {
  local state
  state=$(python - <<'PY' 2>/dev/null
import importlib.util
if importlib.util.find_spec("torchaudio") is None:
    print("absent")
else:
    try:
        import torchaudio  # noqa: F401
        print("loads")
    except Exception:
        print("broken")
PY
)
  if [ "$state" = broken ]; then
    log "removing torchaudio $(python -c 'from importlib.metadata import version; print(version("torchaudio"))'): it does not load against torch $(python -c 'import torch; print(torch.__version__)') (fairseq needs it only for speech tasks)"
    python -m pip uninstall -y -q torchaudio
  fi
}

install_deps() {
  [ -d "$VENV" ] || "$PYTHON" -m venv "$VENV"
  # shellcheck disable=SC1091
  . "$VENV/bin/activate"
  : > "$INSTALL_LOG"
  log "installing into $VENV ($(python --version)); full log: $INSTALL_LOG"
  # fairseq 0.12.2 (Python <= 3.10) needs omegaconf 2.0.x, whose metadata pip >= 24.1 rejects
  local pip_spec=pip
  python -c 'import sys; sys.exit(sys.version_info < (3, 11))' || pip_spec="pip<24.1"
  pip_logged --upgrade "$pip_spec" wheel setuptools
  pip_logged "$TORCH_SPEC" cython numpy
  local pin; pin=$(mktemp); trap 'rm -f "$pin"' RETURN
  echo "$TORCH_SPEC" > "$pin"
  log "building fairseq from source against $TORCH_SPEC (the install's longest step: many minutes on a small machine)"
  # The torch pin must reach pip's *isolated build environment*, where fairseq's
  # build-system requirement "torch" is resolved. pip < 26.2 reads PIP_CONSTRAINT
  # there; pip >= 26.2 ignores it for builds and reads PIP_BUILD_CONSTRAINT
  # (--build-constraint) instead. Both, for this one call: pip refuses a build
  # constraint together with --no-build-isolation, which the last step uses.
  PIP_CONSTRAINT=$pin PIP_BUILD_CONSTRAINT=$pin pip_logged "$TFIXUP_ROOT[test,hf]"
  # a CPU torch must stay the only torch, with no CUDA libraries beside it
  # (with a CUDA torch chosen in TORCH_SPEC, nvidia-* wheels are expected)
  if [ -z "$(python -c 'import torch; print(torch.version.cuda or "")')" ]; then check_no_cuda; fi
  drop_broken_torchaudio
  touch "$VENV/.tfixup-deps-installed"
}

# --hf-only: torch first (so nothing resolves another), then setup.py's hf extra (requirements-hf.txt), then
# this package without its dependencies (fairseq).
install_hf_only() {
  unset PYTHONPATH  # lib.sh puts the checkout there, where pip would take a build's egg-info for an install
  [ -d "$VENV" ] || "$PYTHON" -m venv "$VENV"
  # shellcheck disable=SC1091
  . "$VENV/bin/activate"
  : > "$INSTALL_LOG"
  log "installing torch, transformers and tfixup into $VENV ($(python --version)); full log: $INSTALL_LOG"
  pip_logged "$TORCH_SPEC"
  pip_logged -r "$TFIXUP_ROOT/requirements-hf.txt"
  pip_logged --no-deps "$TFIXUP_ROOT"
  rm -rf "$TFIXUP_ROOT/build"
  if [ -z "$(python -c 'import torch; print(torch.version.cuda or "")')" ]; then check_no_cuda; fi
  python -c "import tfixup.hf, torch, transformers; print('tfixup with torch', torch.__version__, 'transformers', transformers.__version__)"
}

if [ "$HF_ONLY" = 1 ]; then
  install_hf_only
  exit 0
fi

# the first install (no VENV yet) times itself into VENV/install-time.json (README's install time: the main
# job's record reads it, harness/main_job.py)
T_START=$(date +%s.%N); first=0; [ -d "$VENV" ] || first=1
marker=$VENV/.tfixup-deps-installed; fresh=1
if [ -f "$marker" ] && [ "$marker" -nt "$TFIXUP_ROOT/setup.py" ]; then
  fresh=0
  # shellcheck disable=SC1091
  . "$VENV/bin/activate"
  log "dependencies already installed in $VENV"
else
  install_deps
fi
# The project itself, every time (seconds): a regular, non-editable install puts
# fairseq_tfixup next to fairseq, where `--user-dir fairseq_tfixup` finds it from any directory.
python -m pip install -q --no-deps --no-build-isolation --force-reinstall "$TFIXUP_ROOT"
rm -rf "$TFIXUP_ROOT/build"
if [ "$fresh" = 1 ]; then
  # fairseq's import logs "Please install tensorboardX" (optional, unused here): keep the check's answer only
  python -c "import fairseq, fairseq_tfixup, torch; print('fairseq', fairseq.__version__, 'torch', torch.__version__)" 2>&1 \
    | grep -v 'Please install tensorboardX'
else
  # already checked when installed; importing fairseq again costs ~5 s on every scripts/test.sh
  python -c "import sys; from importlib.metadata import version as v
print('fairseq', v('fairseq-fixed' if sys.version_info >= (3, 11) else 'fairseq'), 'torch', v('torch'))"
fi
# the first install's time, and whether pip built fairseq or took a wheel of an earlier build from its cache
if [ "$first" = 1 ]; then
  wheel=cached; grep -q "Building wheel for fairseq[-_]fixed\|Building wheel for fairseq " "$INSTALL_LOG" 2>/dev/null && wheel=built
  python -m harness.main_job timing "$VENV/install-time.json" "$T_START" what=scripts/install.sh fairseq_wheel=$wheel
fi
