"""The one atomic file writer: every output goes to a temp name in its destination
folder and is renamed into place, so a reader never sees half a file and a failure
leaves nothing (a writer killed outright leaves its temp file, removed by the next write
to that folder). Files get the usual mode (0666 less the umask), not mkstemp's 0600;
folders (``write_folder``) 0777 less the umask, not mkdtemp's 0700."""

import contextlib
import json
import os
import pathlib
import re
import shutil
import tempfile


def write_file(path, write) -> pathlib.Path:
    """Call ``write(tmp_path)`` to produce ``path``'s content, then rename it into place. The temp name
    holds the writer's PID: the temp files of writers that died (kill -9 mid-save) are removed first."""
    path = pathlib.Path(path)
    with temp_file(path) as tmp:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    return path


@contextlib.contextmanager
def temp_file(path):
    """A temp file beside PATH, named as write_file names its own (so that a writer killed outright leaves
    it to the next write into that folder), removed on leaving unless renamed away: for a caller that
    writes candidates to read back (harness/average.py)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield tmp
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_folder(path, write) -> pathlib.Path:
    """Call ``write(tmp_folder)`` to fill a new folder, then rename it to ``path`` (a folder there is
    replaced): a reader sees the old folder or the whole new one, and a failure leaves neither the
    temp folder nor a half-made ``path``. The temp folder is named as write_file names its temp files,
    so a writer killed outright leaves it to the next write into that parent folder."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(path.parent)
    tmp = tempfile.mkdtemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
    old = None
    try:
        write(pathlib.Path(tmp))
        os.chmod(tmp, 0o777 & ~_umask())
        if path.exists():  # rename(2) replaces only an empty folder: move the old one aside first
            old = tempfile.mkdtemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
            os.replace(path, old)
        os.replace(tmp, path)
    except BaseException:
        if old and not path.exists():  # stopped between the two renames: the old folder goes back
            os.replace(old, path)
            old = None
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if old:
            shutil.rmtree(old, ignore_errors=True)
    return path


# .NAME.PID.RANDOM.tmp, as write_file and write_folder name their temp files and folders (mkstemp's and
# mkdtemp's random part: 8 of [a-z0-9_])
_TEMP = re.compile(r"\..+\.(\d+)\.[a-z0-9_]{8}\.tmp")


def remove_stale(folder) -> list:
    """Remove FOLDER's temp files and folders of write_file and write_folder whose writer is no longer
    running (killed mid-write); a running writer's are kept. The names removed."""
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        m = _TEMP.fullmatch(name)
        if m and not pid_running(int(m.group(1))):
            stale = os.path.join(folder, name)
            try:
                if os.path.isdir(stale) and not os.path.islink(stale):
                    shutil.rmtree(stale)
                else:
                    os.unlink(stale)
                removed.append(name)
            except FileNotFoundError:  # another process removed it first
                pass
    return removed


def pid_running(pid: int) -> bool:
    """Whether process PID exists (this process counts; another user's too)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


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
