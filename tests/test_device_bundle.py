"""tools/device_bundle.py: the bundle a GPU machine without fairseq or a package index runs the studies from.
The downloads are stood in for (no network in tests): a source release holding the two Cython files, a wheel."""

import io
import sys
import tarfile
import zipfile

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO))
from tools import device_bundle  # noqa: E402


def fake_download(args, dest):
    import pathlib

    if "--no-binary" in args:
        path = pathlib.Path(dest) / "fairseq-fixed-0.12.3.1.tar.gz"
        with tarfile.open(path, "w:gz") as tar:
            for name in device_bundle.CYTHON:
                data = f"# {name}\n".encode()
                info = tarfile.TarInfo(f"fairseq-fixed-0.12.3.1/fairseq/data/{name}.pyx")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return path
    path = pathlib.Path(dest) / "bitarray-3.0-cp312-cp312-manylinux2014_x86_64.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("bitarray/__init__.py", "")
    return path


def test_make_bundles_fairseq_source_without_compiled_parts(tmp_path, monkeypatch):
    monkeypatch.setattr(device_bundle, "_pip_download", fake_download)
    out = device_bundle.make("3.12", tmp_path)
    assert out == tmp_path / "pylib" and [p.name for p in tmp_path.iterdir()] == ["pylib"]  # the temp folder moved into place
    for name in ("fairseq", "fairseq_cli", *device_bundle.PURE, "bitarray"):
        assert (out / name).is_dir(), name
    assert (out / "fairseq" / "data" / "data_utils_fast.pyx").read_text() == "# data_utils_fast\n"
    assert not list(out.rglob("*.so")) and not (out / "fairseq" / "examples").exists()


def test_setup_without_a_bundle_is_one_line_naming_make(tmp_path):
    with pytest.raises(SystemExit, match="python -m tools.device_bundle make"):
        device_bundle.setup(tmp_path)
