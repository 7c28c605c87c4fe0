"""A method is two files: its module in fairseq_tfixup/baselines/ and its row in tfixup/methods.py.

The baselines package imports every module of its folder, so no import list names a method: a module
added there registers its architectures with fairseq, and its row is then known to every study, config
check and test (tests/test_bench_plans.py finds a new row in every study's plan)."""

import pathlib
import pkgutil
import shutil
import subprocess
import sys
import textwrap

from fairseq.models import ARCH_MODEL_REGISTRY

import fairseq_tfixup  # noqa: F401  (registers the models)
from fairseq_tfixup import baselines
from tfixup import methods

from conftest import REPO


def test_every_baseline_module_is_imported_and_every_row_registered():
    modules = {m.name for m in pkgutil.iter_modules(baselines.__path__) if not m.name.startswith("_")}
    assert modules and all(f"fairseq_tfixup.baselines.{m}" in sys.modules for m in modules)
    for name, row in methods.METHODS.items():
        assert row.arch in ARCH_MODEL_REGISTRY, f"method {name}: --arch {row.arch} is not registered"
        if row.lm_arch:
            assert row.lm_arch in ARCH_MODEL_REGISTRY, f"method {name}: --arch {row.lm_arch} is not registered"


# the worked example of docs/baselines.md ("Adding a method"): a model whose only change is its name
TOY_MODULE = textwrap.dedent('''\
    """A toy method: fairseq's Transformer under another name."""

    from fairseq.models import register_model
    from fairseq.models.transformer import TransformerModel

    from fairseq_tfixup.baselines.post_ln import register_presets


    @register_model("transformer_toy")
    class ToyTransformerModel(TransformerModel):
        pass


    register_presets("transformer_toy")
    ''')
TOY_ROW = '\nMETHODS["toy"] = Method("transformer_toy", "Toy", "tab:pink", warmup=True)\n'


def test_a_new_method_is_its_module_and_its_row(tmp_path):
    """Copy the two packages, add the toy module and its row (no other file changes), and import them as
    fairseq-train --user-dir would: the row's architectures are registered for every size preset."""
    for pkg in ("tfixup", "fairseq_tfixup"):
        shutil.copytree(REPO / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "fairseq_tfixup" / "baselines" / "toy.py").write_text(TOY_MODULE)
    with open(tmp_path / "tfixup" / "methods.py", "a") as f:
        f.write(TOY_ROW)
    check = ("import fairseq_tfixup, tfixup\n"
             "from fairseq.models import ARCH_MODEL_REGISTRY as R\n"
             "from fairseq_tfixup.baselines.post_ln import PRESETS\n"
             "from tfixup.methods import METHODS\n"
             f"assert tfixup.__file__.startswith({str(tmp_path)!r}), tfixup.__file__\n"
             "row = METHODS['toy']\n"
             "assert all(row.arch + s in R for s in PRESETS), sorted(a for a in R if 'toy' in a)\n"
             "print(R[row.arch + '_iwslt_de_en'].__name__)\n")
    out = subprocess.run([sys.executable, "-c", check], cwd=tmp_path, capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path), "PYTHONWARNINGS": "ignore"},
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "ToyTransformerModel"
    assert pathlib.Path(tmp_path / "fairseq_tfixup" / "baselines" / "__init__.py").read_text() == \
        (REPO / "fairseq_tfixup" / "baselines" / "__init__.py").read_text()
