"""Average the parameters of the last K checkpoints, K chosen on the valid set: what fairseq's
``scripts/average_checkpoints.py`` (not in the pip package) computes, element-wise mean of every model tensor and
the rest of the state taken from the newest checkpoint, on top of ``fairseq.checkpoint_utils``."""

import collections
import errno
import functools
import os
import re
import shutil
from typing import Dict, List, Sequence

from fairseq import checkpoint_utils

from tfixup import atomic, checkpoints
from harness import fairseq_log, recover

UPDATE_PATTERN = r"checkpoint_\d+_(\d+)\.pt"


def _updates(path: str) -> int:
    m = re.fullmatch(UPDATE_PATTERN, os.path.basename(path))
    return int(m.group(1)) if m else recover.num_updates(path)


def last_checkpoints(ckpt_dir: str) -> List[str]:
    """The checkpoints, newest first: numbered by update (checkpoint_E_U.pt) when training saved them, else by
    epoch (checkpointE.pt). checkpoint_last.pt counts as the newest when training stopped between two numbered
    saves (e.g. at a --max-update that is no multiple of --save-interval-updates)."""
    last = os.path.join(ckpt_dir, "checkpoint_last.pt")
    for pattern in (UPDATE_PATTERN, r"checkpoint(\d+)\.pt"):
        paths = checkpoint_utils.checkpoint_paths(ckpt_dir, pattern=pattern)
        if paths:
            return [last] + paths if os.path.exists(last) and recover.num_updates(last) > _updates(paths[0]) else paths
    # training that stopped before the first epoch end / save interval has only checkpoint_last.pt
    if os.path.exists(last):
        return [last]
    raise FileNotFoundError(f"no checkpoints in {ckpt_dir}")


def average_checkpoints(paths: Sequence[str]) -> Dict:
    """fairseq state of the newest checkpoint with its model replaced by the mean over ``paths``."""
    if not paths:
        raise ValueError("nothing to average")
    summed, newest = collections.OrderedDict(), None
    for path in paths:
        # as saved (weights_only): fairseq's loader would turn the config into omegaconf
        # objects, which averaged.pt would then need torch to unpickle
        state = checkpoints.load(path, check_crc=True)
        newest = newest or state
        if summed and set(state["model"]) != set(summed):
            raise ValueError(f"{path} has other parameters than {paths[0]}")
        for name, tensor in state["model"].items():
            # sum in float32/64 (fp16 checkpoints would lose precision)
            value = tensor.double() if tensor.is_floating_point() else tensor.clone()
            summed[name] = summed[name] + value if name in summed else value
    model = newest["model"]
    newest["model"] = collections.OrderedDict(
        (name, (total / len(paths)).to(model[name].dtype) if model[name].is_floating_point() else model[name])
        for name, total in summed.items())
    return newest


class DiskFull(RuntimeError):
    """A save that found the disk full, in one line naming the file, the space free and the fix."""


def save_state(state: Dict, out: str, shown: str = None) -> None:
    """STATE written to OUT through the one atomic writer (fairseq's own writer left OUT.tmp on a full
    disk); a full disk is ``DiskFull``, naming SHOWN (default OUT): the checkpoint a candidate is for."""
    try:
        atomic.write_file(out, lambda tmp: checkpoints.save(state, tmp))
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        folder = os.path.dirname(os.path.abspath(out))
        need = sum(t.numel() * t.element_size() for t in state["model"].values())
        free = shutil.disk_usage(folder).free
        raise DiskFull(f"disk full (ENOSPC) writing the averaged checkpoint {shown or out}: {free / 2 ** 20:.0f} "
                       f"MiB free on the disk of {folder}, the model needs about {need / 2 ** 20:.0f} MiB; free "
                       "some space, then rerun the same command") from None


@functools.lru_cache(maxsize=4)
def _validate_config(argv: tuple):
    """fairseq-validate's config and overrides for ``argv``, made once: every candidate K is
    validated from the same temp path, and hydra's compose takes ~1.7 s a call."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_validation_parser(), list(argv))
    # as fairseq-validate: only the flags given override the checkpoint's own settings
    override = options.parse_args_and_arch(options.get_validation_parser(), list(argv), suppress_defaults=True)
    return convert_namespace_to_omegaconf(args), override


def valid_loss(checkpoint: str, data: str, validate_args: Sequence[str]) -> float:
    """Label-smoothed loss of CHECKPOINT on the valid subset: ``fairseq-validate DATA --path CHECKPOINT
    --valid-subset valid VALIDATE_ARGS``'s own code in this process (fairseq is imported here already; a process
    per candidate K paid its ~5 s import again), its log on stdout, the loss read from it."""
    from fairseq_cli import validate

    from tfixup import literals

    literals.install()  # validate's own eval() of --model-overrides, imported only now
    argv = (data, "--path", checkpoint, "--valid-subset", "valid", *validate_args)
    try:
        with fairseq_log.captured() as log:  # validate.main logs to the root logger and prints
            validate.main(*_validate_config(argv))
    except Exception as e:  # one line naming the checkpoint, as the fairseq-validate process gave
        raise RuntimeError(f"fairseq-validate failed on {checkpoint}: {type(e).__name__}: {e}") from e
    valid = fairseq_log.records(log.getvalue(), "valid")
    if valid and isinstance(valid[-1].get("valid_loss"), float):
        return valid[-1]["valid_loss"]
    raise RuntimeError(f"no valid loss in fairseq-validate's output for {checkpoint}")


def choose_and_average(ckpt_dir: str, candidates: Sequence[int], data: str, out: str,
                       validate_args: Sequence[str]) -> Dict:
    """Average the last K checkpoints for each K in ``candidates`` and keep the one with the lowest VALID loss
    (the test set is never looked at)."""
    tried, best, kept = [], None, None
    every = last_checkpoints(ckpt_dir)  # once (it may load checkpoint_last.pt); each K averages the first K
    with atomic.temp_file(out) as tmp:  # each candidate validated from here; a failure leaves nothing
        for k in sorted({min(int(c), len(every)) for c in candidates}):
            state = average_checkpoints(every[:k])
            save_state(state, tmp, shown=out)
            loss = valid_loss(tmp, data, validate_args)
            tried.append({"k": k, "checkpoints": [os.path.basename(p) for p in every[:k]], "valid_loss": loss})
            if best is None or loss < best["valid_loss"]:
                best, kept = tried[-1], state
    save_state(kept, out)
    # the newest's update count, in every average: the averaged model's
    return {"chosen": best, "tried": tried, "num_updates": _updates(every[0])}
