"""The one atomic file writer: every output goes to a temp name in its destination
folder and is renamed into place, so a reader never sees half a file and a failure
leaves nothing. Files get the usual mode (0666 less the umask), not mkstemp's 0600."""

import json
import os
import pathlib
import tempfile


def write_file(path, write) -> pathlib.Path:
    """Call ``write(tmp_path)`` to produce ``path``'s content, then rename it into place."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _plain(x):
    """JSON for numpy scalars/arrays and anything else (as text)."""
    if hasattr(x, "tolist"):
        return x.tolist()
    return str(x)


def write_json(path, obj, sort_keys: bool = False) -> pathlib.Path:
    def write(tmp):
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(obj, fh, indent=2, sort_keys=sort_keys, default=_plain)
            fh.write("\n")

    return write_file(path, write)


def write_text(path, text: str) -> pathlib.Path:
    return write_file(path, lambda tmp: pathlib.Path(tmp).write_text(text, encoding="utf-8"))


def save_npz(path, arrays: dict) -> pathlib.Path:
    import numpy as np

    def write(tmp):
        with open(tmp, "wb") as fh:
            np.savez_compressed(fh, **arrays)

    return write_file(path, write)


def save_figure(path, fig) -> pathlib.Path:
    """A matplotlib figure as PNG; the figure is closed."""
    import matplotlib.pyplot as plt

    try:
        return write_file(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight"))
    finally:
        plt.close(fig)
