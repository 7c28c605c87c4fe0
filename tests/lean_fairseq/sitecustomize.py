"""The test suite's Python processes (tests/conftest.py puts this folder first on PYTHONPATH): fairseq 0.12 imports
every task and criterion module when it is imported, and two of them import scikit-learn and scipy.stats (the
sentence-prediction criterion's metrics, the audio-classification task's), a large share of the start of every
fairseq process. This project builds neither (tfixup/allowlist_table.py: the translation and
language-modeling tasks, the cross-entropy criteria), so here they are empty modules: what fairseq registers from
them is missing, nothing else changes. Users' processes import them as fairseq does.

With TFIXUP_TEST_PROCESSES set (scripts/test.sh, for the whole suite), each such process also appends one line
to that file at its exit: its own CPU seconds and whether it is pytest itself or imported torch and fairseq. The
suite's record sums them (harness/main_job.py, timing --processes): where the suite's CPU goes."""

import importlib.abc
import importlib.machinery
import os
import sys

SKIPPED = ("fairseq.criterions.sentence_prediction", "fairseq.criterions.sentence_prediction_adapters",
           "fairseq.tasks.audio_classification")


class _Empty(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__doc__ = "skipped by the test suite (tests/lean_fairseq/sitecustomize.py)"


class _Skip(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        return importlib.machinery.ModuleSpec(name, _Empty()) if name in SKIPPED else None


def _account(path: str) -> None:
    t = os.times()
    line = '{"cpu_s": %.3f, "pytest": %s, "torch": %s, "fairseq": %s}\n' % (
        t.user + t.system, *("true" if m in sys.modules else "false" for m in ("_pytest", "torch", "fairseq")))
    try:
        with open(path, "a") as f:  # one short write in append mode: lines of processes ending at once stay whole
            f.write(line)
    except OSError:  # the suite's work folder gone (a test's own checkout copy): this process goes unaccounted
        pass


def install() -> None:
    """Skip the modules in this process, and account for it at exit (once)."""
    if not any(type(f).__name__ == "_Skip" for f in sys.meta_path):  # also when loaded twice, by two names
        sys.meta_path.insert(0, _Skip())
        if os.environ.get("TFIXUP_TEST_PROCESSES"):
            import atexit

            atexit.register(_account, os.environ["TFIXUP_TEST_PROCESSES"])


def chain() -> None:
    """Run the sitecustomize this one shadows (the next on sys.path), if there is one."""
    import importlib.util
    import pathlib

    here = pathlib.Path(__file__).resolve().parent
    for entry in sys.path:
        path = pathlib.Path(entry or ".").resolve() / "sitecustomize.py"
        if path.parent != here and path.is_file():
            spec = importlib.util.spec_from_file_location("_shadowed_sitecustomize", path)
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


install()
if __name__ == "sitecustomize":
    chain()
