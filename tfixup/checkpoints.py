"""Safe loading of fairseq checkpoints under torch >= 2.6 (torch and numpy only: the plugin registers these
types when imported; the harness loads checkpoints without importing fairseq).

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

Safe unpickling does not cover what fairseq does with the plain strings of a
checkpoint's config: some it ``eval()``s when it builds a model, others name files
and components it builds. ``load`` also refuses a checkpoint holding anything but a
literal in those fields (literals.py) or anything outside the allow-list of components
and settings, whose other fields it sets back to fairseq's defaults (allowlist.py), and
``verify`` tests the zip's CRCs, which torch does not: a bit flip in a tensor
loads without error and trains into NaN.

``install_atomic_saves`` (at plugin import) makes fairseq's checkpoint writes
atomic: fairseq 0.12 copies checkpoint_last.pt (and the best/epoch copies) with
``shutil.copyfile`` straight to its name, so a full disk left a truncated
checkpoint_last.pt, and a failed ``torch.save`` left its ``.pt.tmp``.
"""

import argparse
import os
import pickle
import re
import zipfile

import numpy as np
import torch

from tfixup import atomic, errors, literals


MIN_TORCH = (2, 6)  # the first torch whose torch.load defaults to weights_only=True
_TRUE = ("1", "y", "yes", "true")  # how torch reads its TORCH_FORCE_* switches


class UnsafeTorch(errors.Refused):
    """A torch that would unpickle code by default, in one line naming the fix."""


def require_safe_torch(version=None, environ=None) -> None:
    """``UnsafeTorch`` unless torch loads safely by default: torch >= 2.6 (``weights_only=True`` by
    default, ``add_safe_globals``) and safe loading not switched off (``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``).
    The plugin's loaders pass ``weights_only=True`` themselves; this covers fairseq's other ``torch.load``
    calls, which take torch's default. VERSION and ENVIRON stand in for torch's and the process's (tests)."""
    version = str(torch.__version__ if version is None else version)
    m = re.match(r"(\d+)\.(\d+)", version)
    if not m or tuple(map(int, m.groups())) < MIN_TORCH or not hasattr(torch.serialization, "add_safe_globals"):
        raise UnsafeTorch(f"torch {version} is too old for fairseq-tfixup: before 2.6 torch.load unpickles "
                          "arbitrary code by default (weights_only=False), so a crafted checkpoint could run "
                          "code; install torch >= 2.6 (pip install 'torch>=2.6')")
    environ = os.environ if environ is None else environ
    if environ.get("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "0").lower() in _TRUE:
        raise UnsafeTorch("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD is set: it makes torch.load unpickle arbitrary code "
                          "(weights_only=False), so a crafted checkpoint could run code; unset it "
                          "(unset TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD)")


class CorruptCheckpoint(ValueError):
    """A checkpoint that cannot be read, or fails its CRC check, in one line naming it."""

    def __init__(self, path, reason):
        super().__init__(f"{path} is corrupt ({reason})")
        self.path, self.reason = str(path), reason


class NotACheckpoint(CorruptCheckpoint):
    """A file that is no torch checkpoint at all (a text file, a device), in one line naming it."""

    def __init__(self, path, reason):
        ValueError.__init__(self, f"{path} is not a checkpoint ({reason})")
        self.path, self.reason = str(path), reason


ZIP_MAGIC = b"PK\x03\x04"  # torch.save's format since 1.6
PICKLE_MAGIC = b"\x80"  # the legacy format: a pickle (protocol 2+) of torch's magic number


def _check_format(path) -> None:
    """``NotACheckpoint`` unless PATH (followed if a link) is a regular file starting as torch's formats do."""
    if not os.path.isfile(path):
        if os.path.exists(path):
            raise NotACheckpoint(path, "not a regular file")
        return  # torch names the missing file
    with open(path, "rb") as f:
        head = f.read(4)
    if not (head.startswith(ZIP_MAGIC) or head.startswith(PICKLE_MAGIC)):
        text = all(32 <= b < 127 or b in b"\t\n\r" for b in head)
        raise NotACheckpoint(path, "empty" if not head else
                             f"{'text, ' if text else ''}not torch's zip format or its legacy pickle")


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
    """Allow fairseq's checkpoint types in ``torch.load(weights_only=True)`` (torch >= 2.4; before, none
    is added and such a checkpoint is refused)."""
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is not None:
        add(list(SAFE_GLOBALS))


def verify(path) -> None:
    """``CorruptCheckpoint`` unless every member of the checkpoint's zip has its recorded CRC-32
    (torch reads without checking them). Reads the whole file; a legacy (non-zip) file passes."""
    try:
        if not zipfile.is_zipfile(path):
            return
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except (zipfile.BadZipFile, EOFError, ValueError) as e:
        raise CorruptCheckpoint(path, f"not a readable zip: {e}") from None
    if bad is not None:
        raise CorruptCheckpoint(path, f"{bad} fails its CRC check: the file changed after it was written "
                                      "(a bad disk or copy)")


def load(path, mmap: bool = False, check_crc: bool = False) -> dict:
    """A checkpoint's state, safely (``weights_only=True``), on CPU. ``mmap=True`` maps
    the tensors instead of reading them: cheap when only the bookkeeping is needed.
    ``check_crc``: ``verify`` it first. Refused: pickled code (``pickle.UnpicklingError``),
    a non-literal in a field fairseq evaluates or a config outside the allow-list
    (``literals.UnsafeCheckpoint``); unreadable:
    ``CorruptCheckpoint`` (``NotACheckpoint`` for a file in neither of torch's formats); each in
    one line naming PATH."""
    register_safe_globals()
    _check_format(path)
    if check_crc:
        verify(path)
    try:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        except RuntimeError as e:  # mmap needs torch's zip format; older files are read whole
            if not (mmap and "mmap" in str(e)):
                raise
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # torch's message is many lines; keep the one naming the refused global
        cause = next((l.strip() for l in str(e).splitlines() if "GLOBAL" in l or "global" in l), "")
        raise pickle.UnpicklingError(f"{path}: refused by torch.load(weights_only=True): {cause} "
                                     "(not a checkpoint fairseq wrote, or not a checkpoint)") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, IndexError, KeyError) as e:  # truncated, or not torch's format
        text = str(e).strip()
        raise CorruptCheckpoint(path, f"cannot be read: {text.splitlines()[0] if text else type(e).__name__}") from None
    literals.check_state(state, path)
    return state


class _Writer:
    """A file for torch.save that keeps the OSError of a failed write: torch's zip writer turns it
    into "unexpected pos N vs M", and a full disk would not be named."""

    def __init__(self, f):
        self.f, self.error = f, None

    def _keep(self, call, *args):
        try:
            return call(*args)
        except OSError as e:
            self.error = self.error or e
            raise

    def write(self, data):
        return self._keep(self.f.write, data)

    def flush(self):
        return self._keep(self.f.flush)


def save(obj, path) -> None:
    """``torch.save(obj, path)``; a write that fails raises its own OSError (ENOSPC: the disk is full)."""
    with open(path, "wb") as f:
        writer = _Writer(f)
        try:
            torch.save(obj, writer)
        except RuntimeError:
            if writer.error is not None:
                raise writer.error from None
            raise


def install_atomic_saves() -> None:
    """fairseq's checkpoint writes through the plugin's one atomic writer (atomic.py): the
    copies (checkpoint_last.pt, ...) and torch_persistent_save. A failed write (a full disk)
    leaves the previous file whole and no temp file. Idempotent."""
    from fairseq import checkpoint_utils
    from fairseq.file_io import PathManager

    if getattr(checkpoint_utils.torch_persistent_save, "tfixup_atomic", False):
        return
    fairseq_save, fairseq_copy = checkpoint_utils.torch_persistent_save, PathManager.copy

    def torch_persistent_save(obj, filename, async_write: bool = False):
        if async_write or not isinstance(filename, str) or PathManager.path_requires_pathmanager(filename):
            return fairseq_save(obj, filename, async_write)
        atomic.write_file(filename, lambda tmp: save(obj, tmp))

    def copy(src_path: str, dst_path: str, overwrite: bool = False) -> bool:
        if PathManager.path_requires_pathmanager(src_path) or PathManager.path_requires_pathmanager(dst_path):
            return fairseq_copy(src_path, dst_path, overwrite)
        import shutil

        atomic.write_file(dst_path, lambda tmp: shutil.copyfile(src_path, tmp))
        return True

    torch_persistent_save.tfixup_atomic = True
    checkpoint_utils.torch_persistent_save = torch_persistent_save
    PathManager.copy = staticmethod(copy)
