"""Safe loading of fairseq checkpoints under torch >= 2.6.

torch >= 2.6 loads with ``weights_only=True``: its unpickler accepts tensors,
containers and plain values, plus the types registered with
``torch.serialization.add_safe_globals``, and refuses every other global, so a
crafted checkpoint cannot run code. fairseq 0.12's checkpoints hold one other
type: the training arguments, an ``argparse.Namespace`` (``state["args"]``, and
``state["cfg"]["model"]`` for models configured from the command line). The
rest of ``state["cfg"]`` is stored as plain containers
(``OmegaConf.to_container``). We register ``argparse.Namespace`` and nothing
else; never set ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` or pass
``weights_only=False``, which would unpickle arbitrary code.
"""

import argparse
import pickle

import torch

SAFE_GLOBALS = (argparse.Namespace,)


def register_safe_globals() -> None:
    """Allow fairseq's checkpoint types in ``torch.load(weights_only=True)`` (no-op before torch 2.4)."""
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is not None:
        add(list(SAFE_GLOBALS))


def load(path, mmap: bool = False) -> dict:
    """A checkpoint's state, safely (``weights_only=True``), on CPU. ``mmap=True`` maps
    the tensors instead of reading them: cheap when only the bookkeeping is needed."""
    register_safe_globals()
    try:
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        except RuntimeError as e:  # mmap needs torch's zip format; older files are read whole
            if not (mmap and "mmap" in str(e)):
                raise
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # torch's message is many lines; keep the one naming the refused global
        cause = next((l.strip() for l in str(e).splitlines() if "GLOBAL" in l or "global" in l), "")
        raise pickle.UnpicklingError(f"{path}: refused by torch.load(weights_only=True): {cause} "
                                     "(not a checkpoint fairseq wrote, or not a checkpoint)") from None


def num_updates(path) -> int:
    """The update count a checkpoint was saved at, without reading its tensors."""
    state = load(path, mmap=True)
    return int(state["optimizer_history"][-1]["num_updates"])
