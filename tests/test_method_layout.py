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

import pytest
from fairseq.models import ARCH_MODEL_REGISTRY
from torch import nn

import fairseq_tfixup  # noqa: F401  (registers the models)
from fairseq_tfixup import baselines
from tfixup import methods

from conftest import REPO, build_model


def test_every_baseline_module_is_imported_and_every_row_registered():
    modules = {m.name for m in pkgutil.iter_modules(baselines.__path__) if not m.name.startswith("_")}
    assert modules and all(f"fairseq_tfixup.baselines.{m}" in sys.modules for m in modules)
    for name, row in methods.METHODS.items():
        assert row.arch in ARCH_MODEL_REGISTRY, f"method {name}: --arch {row.arch} is not registered"
        if row.lm_arch:
            assert row.lm_arch in ARCH_MODEL_REGISTRY, f"method {name}: --arch {row.lm_arch} is not registered"


# the worked example of docs/baselines.md ("Adding a method"), as written there
TOY_MODULE = textwrap.dedent('''\
    from fairseq.models import register_model
    from fairseq.models.transformer import TransformerEncoderBase, TransformerModel

    from fairseq_tfixup.baselines.post_ln import register_presets
    from fairseq_tfixup.models.transformer_tfixup import CustomLayerStacks, without_fused_encoder_path


    class ToyEncoder(TransformerEncoderBase):
        def build_encoder_layer(self, cfg):
            layer = super().build_encoder_layer(cfg)
            # the method: change the layer here (its norms, its residual, ...), as the other modules do
            return without_fused_encoder_path(layer)  # fairseq's fused eval kernel computes stock Post-LN


    @register_model("transformer_toy")
    class ToyTransformerModel(CustomLayerStacks, TransformerModel):
        encoder_class = ToyEncoder


    register_presets("transformer_toy")  # transformer_toy_iwslt_de_en, ..._wmt_en_de, ..._deep_narrow, ...
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


def test_the_worked_example_is_the_one_in_docs_baselines():
    doc = (REPO / "docs" / "baselines.md").read_text()
    assert "# fairseq_tfixup/baselines/toy.py\n" + TOY_MODULE in doc


# ---------------------------------------------------------------- fairseq's fused encoder path


def stock_post_ln_encoder(model) -> bool:
    """MODEL's encoder computes fairseq's stock Post-LN layer by layer (the function fairseq 0.12.2's fused
    eval kernel computes): fairseq's own encoder calling fairseq's own layers, with LayerNorms after each
    sublayer. Anything else (another stack, another layer, other norms, norms first) is the method's."""
    from fairseq_tfixup.models.transformer_tfixup import is_layer_norm

    fairseqs = lambda obj: type(obj).__module__.startswith("fairseq.")  # noqa: E731
    return fairseqs(model.encoder) and all(
        fairseqs(layer) and not layer.normalize_before and is_layer_norm(layer.self_attn_layer_norm)
        and is_layer_norm(layer.final_layer_norm) for layer in model.encoder.layers)


def fused_path_left_open(model) -> list:
    """The encoder layers of MODEL that may take fairseq's fused kernel though the method changed them: a
    method's module must pass each through ``without_fused_encoder_path`` (docs/baselines.md)."""
    if stock_post_ln_encoder(model):
        return []
    return [i for i, layer in enumerate(model.encoder.layers) if getattr(layer, "can_use_fastpath", None) is not False]


@pytest.mark.parametrize("name", [n for n, m in methods.METHODS.items()
                                  if not ARCH_MODEL_REGISTRY[m.arch].__module__.startswith("fairseq.")])
def test_every_method_keeps_its_encoder_layers_off_fairseqs_fused_path(name, dict_dir):
    row = methods.METHODS[name]
    model, _, _ = build_model(dict_dir, row.arch, "--encoder-layers", "2", "--decoder-layers", "1",
                              "--encoder-embed-dim", "16", "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
                              "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
                              "--decoder-attention-heads", "2", *row.flags)
    assert fused_path_left_open(model) == [], (
        f"method {name} ({row.arch}): encoder layers {fused_path_left_open(model)} changed but not passed through "
        "without_fused_encoder_path (fairseq_tfixup/models/transformer_tfixup.py): return "
        "without_fused_encoder_path(layer) from the encoder's build_encoder_layer (docs/baselines.md)")


def test_a_method_that_forgets_the_fused_path_is_caught(dict_dir):
    """A method whose encoder layers drop their norms and are not passed through without_fused_encoder_path:
    the check above names its layers; the same layers passed through it are not named."""
    from fairseq_tfixup.models.transformer_tfixup import without_fused_encoder_path

    model, _, _ = build_model(dict_dir, "transformer", "--encoder-layers", "2", "--decoder-layers", "1",
                              "--encoder-embed-dim", "16", "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim",
                              "32", "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
                              "--decoder-attention-heads", "2")
    assert fused_path_left_open(model) == []  # fairseq's own Post-LN: the kernel computes it
    for layer in model.encoder.layers:  # the forgetful method: norms gone, the path left open
        for child in ("self_attn_layer_norm", "final_layer_norm"):
            setattr(layer, child, nn.Identity())
    assert fused_path_left_open(model) == [0, 1]
    for layer in model.encoder.layers:
        without_fused_encoder_path(layer)
    assert fused_path_left_open(model) == []
