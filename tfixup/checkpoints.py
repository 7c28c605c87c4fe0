"""Safe loading of fairseq checkpoints under torch >= 2.6 (torch and numpy only: the plugin registers
these types when imported, the harness loads checkpoints without importing fairseq).

torch >= 2.6 loads with ``weights_only=True``: its unpickler accepts tensors,
containers and plain values, plus the types registered with
``torch.serialization.add_safe_globals``, and refuses every other global, so a
crafted checkpoint cannot run code. fairseq 0.12's checkpoints hold one other
type: the training arguments, an ``argparse.Namespace`` (``state["args"]``, and
``state["cfg"]["model"]`` for models configured from the command line). The
rest of ``state["cfg"]`` is stored as plain containers
(``OmegaConf.to_container``). A run with ``--eval-bleu`` also keeps its BLEU
meters' counts in ``extra_state["metrics"]`` as numpy arrays, which need numpy's
array reconstructor, ``ndarray`` and ``dtype`` (the types
``torch.serialization.get_unsafe_globals_in_checkpoint`` lists for such a
checkpoint). We register those and nothing else, and never switch safe loading
off (torch's environment switch or the per-call flag), which would unpickle
arbitrary code.
"""

import argparse
import pickle

import numpy as np
import torch


def _numpy_array_types() -> tuple:
    try:  # numpy >= 2
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy 1.x
        from numpy.core.multiarray import _reconstruct
    # numpy >= 1.25 pickles a dtype through its class (numpy.dtypes.Int64DType, ...)
    dtype_classes = {type(np.dtype(t)) for t in (np.float64, np.float32, np.int64, np.int32, np.bool_)}
    return (_reconstruct, np.ndarray, np.dtype, *sorted(dtype_classes, key=str))


SAFE_GLOBALS = (argparse.Namespace, *_numpy_array_types())


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
