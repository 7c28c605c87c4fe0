"""What to do after a failed training run: the cause, in one line, and the next command.

* a corrupt ``checkpoint_last.pt``: the newest checkpoint that loads (safely, tensors
  memory-mapped) and the commands that resume from it;
* NaN/Inf (fairseq's "gradients are Nan/Inf", whose NanDetector then crashes on its
  own, or fp16's "Minimum loss scale reached"): update, loss and lr of the last logged
  line and what to change;
* bad data: rebuild it (rerunning would fail the same way);
* anything else: the last error line, and rerunning resumes from checkpoint_last.pt.
"""

import glob
import os
import pickle
import re
import shlex

from harness.fairseq_log import last_value

# what a checkpoint that cannot be read raises (torch's zip reader, the unpickler, a missing key)
LOAD_ERRORS = (OSError, RuntimeError, KeyError, EOFError, ValueError, pickle.UnpicklingError)


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def num_updates(path) -> int:
    """The update count a checkpoint was saved at, read safely, without reading its tensors."""
    from tfixup import checkpoints

    return int(checkpoints.load(path, mmap=True)["optimizer_history"][-1]["num_updates"])


def newest_intact(ckpt_dir: str, exclude=("checkpoint_last.pt",)):
    """(path, updates) of the checkpoint with the most updates that loads, or None; among
    equals, a numbered checkpoint_E_U.pt before checkpoint_best.pt."""
    found = []
    for path in glob.glob(os.path.join(ckpt_dir, "checkpoint*.pt")):
        if os.path.basename(path) in exclude:
            continue
        try:
            found.append((num_updates(path), "best" not in os.path.basename(path), path))
        except LOAD_ERRORS:
            continue
    if not found:
        return None
    updates, _, path = max(found)
    return path, updates


def corrupt_last_advice(last: str, reason: str, command: str) -> str:
    intact = newest_intact(os.path.dirname(last))
    q = shlex.quote
    head = f"{last} is corrupt (cannot be read: {reason})"
    if intact is None:
        return (f"{head} and no other checkpoint loads: start over with: "
                f"mv {q(last)} {q(last + '.corrupt')} && {command}")
    path, updates = intact
    return (f"{head}; the newest intact checkpoint is {os.path.basename(path)} ({updates} updates): "
            f"resume from it with: mv {q(last)} {q(last + '.corrupt')} && cp {q(path)} {q(last)} && {command}")


_NAN = re.compile(r"gradients are Nan/Inf|Minimum loss scale reached|NaN or Inf found in input tensor|"
                  r"loss is nan|FloatingPointError")
_DATA = re.compile(r"Dataset not found|Unable to infer|size mismatch for .*embed_tokens|"
                   r"index out of range in self|Tried to load .* but found|No such file or directory: .*\.(idx|bin)")
_CKPT = re.compile(r"Cannot load model parameters from checkpoint|PytorchStreamReader failed|"
                   r"Weights only load failed|UnpicklingError|failed finding central directory")


def train_failure(log_text: str, rc: int, ckpt_dir: str, command: str) -> str:
    run = text = log_text
    # the failed run only: train.log is appended to by every run
    starts = [m.start() for m in re.finditer(r"fairseq_cli\.train \| \{|fairseq_cli.train\].*\{'_name'", text)]
    if starts:
        run = text[starts[-1]:]
    if _NAN.search(run):
        m = re.search(r"gradients are Nan/Inf|Minimum loss scale reached", run)
        what = m.group(0) if m else "NaN/Inf"
        return (f"training diverged ({what}) after update {last_value(run, 'num_updates')} (last logged: loss "
                f"{last_value(run, 'loss')}, lr {last_value(run, 'lr')}): rerunning will diverge again; lower LR (--set LR=...), use a longer "
                "DECAY_PERIOD (T-Fixup) or WARMUP_UPDATES (baselines), and train deep models in fp32 "
                "(--set FP16=0) instead of fp16")
    last = os.path.join(ckpt_dir, "checkpoint_last.pt")
    if _CKPT.search(run) and os.path.exists(last):
        try:
            num_updates(last)
        except LOAD_ERRORS as e:
            return corrupt_last_advice(last, first_line(e), command)
    m = _DATA.search(run)
    if m:
        return (f"fairseq-train could not use the data ({m.group(0)}): rebuild the data-bin with "
                "scripts/prepare-*.sh (rerunning the same command will fail the same way)")
    errors = [line.strip() for line in run.splitlines() if re.match(r"\s*\w*(Error|Exception)\b.*:", line)]
    cause = errors[-1] if errors else f"exit {rc}"
    if rc in (137, -9):
        cause = "killed (SIGKILL: out of memory?)"
    return (f"fairseq-train failed: {cause[:300]}; see the log. If it was killed or preempted, "
            f"rerun the same command to resume from checkpoint_last.pt: {command}")
