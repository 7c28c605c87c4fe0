"""Writing results: every file goes to a temp name in the destination folder and is renamed into place."""

import json
import os
import pathlib
import tempfile

import numpy as np


def _atomic(path: pathlib.Path, write) -> pathlib.Path:
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; results are ordinary files
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def save_npz(path, arrays: dict) -> pathlib.Path:
    def write(tmp):
        with open(tmp, "wb") as fh:
            np.savez_compressed(fh, **arrays)

    return _atomic(path, write)


def save_json(path, obj) -> pathlib.Path:
    def write(tmp):
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(obj, fh, indent=2, sort_keys=True, default=_plain)
            fh.write("\n")

    return _atomic(path, write)


def save_text(path, text: str) -> pathlib.Path:
    return _atomic(path, lambda tmp: pathlib.Path(tmp).write_text(text, encoding="utf-8"))


def save_figure(path, fig) -> pathlib.Path:
    import matplotlib.pyplot as plt

    try:
        return _atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight"))
    finally:
        plt.close(fig)


def _plain(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)
