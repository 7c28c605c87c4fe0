"""The plugin's fairseq-free modules, loaded from their files.

``import fairseq_tfixup.atomic`` runs the package's ``__init__`` first, which
registers the models with fairseq and so imports fairseq: 5 to 9 s of a
2-core machine, paid by every pipeline step that only writes a JSON file or
reads a checkpoint's update count (several per train.sh and evaluate.sh run).
These modules import nothing from fairseq, so the steps load them from the
plugin's files (the checkout's, like ``--user-dir``) without the package:

    from pipeline.plugin import atomic, checkpoints, presets
"""

import importlib.util
import pathlib
import sys

PLUGIN = pathlib.Path(__file__).resolve().parents[1] / "fairseq_tfixup"


def load(name: str):
    """fairseq_tfixup/NAME.py as a module of its own (once per process)."""
    key = f"_tfixup_plain_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, PLUGIN / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


def __getattr__(name: str):  # ``from pipeline.plugin import atomic`` loads atomic.py on first use
    if name in ("atomic", "checkpoints", "presets"):
        return load(name)
    raise AttributeError(name)
