"""The studies' fairseq runs on a GPU machine that has PyTorch but neither fairseq nor a package index.

``make`` (here, in the project's venv) writes a bundle under work/device/pylib: fairseq's and fairseq_cli's
Python source from the installed fairseq (no compiled parts, no examples), the two Cython sources fairseq
needs to batch data (from its source release, which pip downloads without building), and the pure-Python
packages it imports (hydra, omegaconf, antlr4), plus a bitarray wheel for the GPU machine's Python
(``--python``, default 3.12). About 9 MB: it travels with the working tree.

``setup`` (there, from the repository root) compiles the two Cython modules in place and writes a
``fairseq-train`` launcher into work/device/bin; then, with ``PYTHONPATH=work/device/pylib:.`` and
``PATH=work/device/bin:$PATH``, a study's ``--device cuda`` runs as here:

    python -m tools.device_bundle make                 # here
    python3 -m tools.device_bundle setup               # there, then:
    PYTHONPATH=work/device/pylib:. PATH=work/device/bin:$PATH \\
        python3 -m harness.bench.lr --out results/bench --data work/data-bin/iwslt14-v1000 --device cuda --jobs 12
"""

import argparse
import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

from tfixup import atomic

REPO = pathlib.Path(__file__).resolve().parent.parent
BUNDLE = REPO / "work" / "device"
PURE = ("hydra", "omegaconf", "antlr4")  # fairseq's pure-Python dependencies the GPU machine lacks
CYTHON = ("data_utils_fast", "token_block_utils_fast")  # fairseq/data/*.pyx: batching, LM token blocks
FAIRSEQ_DIST = "fairseq-fixed==0.12.3.1"


def log(msg: str) -> None:
    print(f"device_bundle: {msg}", file=sys.stderr, flush=True)


def _package_dir(name: str) -> pathlib.Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"device_bundle: {name} is not installed here; run it in the project's venv "
                 f"(. .venv/bin/activate, after bash scripts/install.sh)")
    return pathlib.Path(list(spec.submodule_search_locations)[0])


def _pip_download(args: list, dest: str) -> pathlib.Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", dest, *args], check=True)
    got = sorted(pathlib.Path(dest).iterdir())
    if not got:
        sys.exit(f"device_bundle: pip downloaded nothing for {' '.join(args)}")
    return got[0]


def make(python: str, out: pathlib.Path = BUNDLE) -> pathlib.Path:
    """Write the bundle to OUT/pylib through the one atomic writer (tfixup/atomic.py's write_folder: built
    in a temp folder, then renamed into place; a failure leaves the old bundle or none, never half of one)."""

    def fill(tmp: pathlib.Path) -> None:
        skip = shutil.ignore_patterns("*.so", "__pycache__", "examples")
        for name in ("fairseq", "fairseq_cli", *PURE):
            shutil.copytree(_package_dir(name), tmp / name, ignore=skip)
        with tempfile.TemporaryDirectory() as dl:
            # the source release holds the .pyx files the installed package lacks; --no-build-isolation: pip
            # reads its metadata with this venv's torch instead of fetching one
            sdist = _pip_download(["--no-binary", ":all:", "--no-build-isolation", FAIRSEQ_DIST], dl)
            with tarfile.open(sdist) as tar:
                for m in tar.getmembers():
                    stem = pathlib.PurePosixPath(m.name)
                    if stem.suffix == ".pyx" and stem.stem in CYTHON and stem.parent.name == "data":
                        (tmp / "fairseq" / "data" / stem.name).write_bytes(tar.extractfile(m).read())
        missing = [c for c in CYTHON if not (tmp / "fairseq" / "data" / f"{c}.pyx").exists()]
        if missing:
            sys.exit(f"device_bundle: {FAIRSEQ_DIST}'s source release has no fairseq/data/{missing[0]}.pyx")
        with tempfile.TemporaryDirectory() as dl:
            whl = _pip_download(["--only-binary", ":all:", "--python-version", python,
                                 "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
                                 "--platform", "manylinux_2_28_x86_64", "bitarray"], dl)
            zipfile.ZipFile(whl).extractall(tmp)

    final = atomic.write_folder(out / "pylib", fill)
    size = sum(f.stat().st_size for f in final.rglob("*") if f.is_file())
    log(f"bundle ready: {final} ({size / 2**20:.1f} MiB, bitarray for Python {python})")
    return final


LAUNCHER = '#!/bin/sh\nexec "{python}" -m fairseq_cli.train "$@"\n'


def setup(out: pathlib.Path = BUNDLE) -> None:
    """Compile fairseq's Cython modules inside OUT/pylib and write OUT/bin/fairseq-train."""
    pylib = out / "pylib"
    if not (pylib / "fairseq").is_dir():
        sys.exit(f"device_bundle: no bundle at {pylib}; make it where fairseq is installed: "
                 f"python -m tools.device_bundle make")
    import numpy
    from Cython.Build import cythonize
    from setuptools import Extension, setup as build

    exts = [Extension(f"fairseq.data.{c}", [f"fairseq/data/{c}.pyx"], include_dirs=[numpy.get_include()],
                      language="c++", extra_compile_args=["-std=c++11", "-O2"]) for c in CYTHON]
    cwd = os.getcwd()
    os.chdir(pylib)
    try:
        build(name="fairseq-cython", ext_modules=cythonize(exts, language_level=3, quiet=True),
              script_args=["-q", "build_ext", "--inplace", "--build-temp", str(out / "build")])
    finally:
        os.chdir(cwd)
    (out / "bin").mkdir(exist_ok=True)
    launcher = out / "bin" / "fairseq-train"
    atomic.write_text(launcher, LAUNCHER.format(python=sys.executable))
    launcher.chmod(0o755)
    log(f"compiled {', '.join(CYTHON)}; launcher {launcher}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make", help="write work/device/pylib here (in the project's venv)")
    m.add_argument("--python", default="3.12", help="the GPU machine's Python version (default 3.12)")
    sub.add_parser("setup", help="on the GPU machine: compile the Cython modules, write the launcher")
    a = p.parse_args(argv)
    if a.cmd == "make":
        make(a.python)
    else:
        setup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
