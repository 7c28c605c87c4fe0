"""The Fig. 3c ablations: T-Fixup's two steps, each alone (fairseq_tfixup/baselines/ablations.py)."""

import pytest
import torch

from fairseq_tfixup.models.transformer_tfixup import is_layer_norm

from conftest import build_model

FLAGS = ["--encoder-layers", 3, "--decoder-layers", 4, "--encoder-embed-dim", 64, "--decoder-embed-dim", 64,
         "--encoder-ffn-embed-dim", 128, "--decoder-ffn-embed-dim", 128, "--encoder-attention-heads", 4,
         "--decoder-attention-heads", 4, "--share-decoder-input-output-embed"]


def _layer_norms(model):
    return [n for n, m in model.named_modules() if is_layer_norm(m)]


def test_noln_has_no_layer_norm_and_fairseqs_own_weights(dict_dir):
    noln, _, _ = build_model(dict_dir, "transformer_noln", *FLAGS, seed=5)
    stock, _, _ = build_model(dict_dir, "transformer", *FLAGS, seed=5)
    assert _layer_norms(noln) == []
    stock_params = dict(stock.named_parameters())
    for name, p in noln.named_parameters():  # the same draw, untouched: no T-Fixup redraw or scale
        torch.testing.assert_close(p, stock_params[name], rtol=0, atol=0, msg=name)
    assert set(stock_params) - {n for n, _ in noln.named_parameters()} == {
        n for n in stock_params if "layer_norm" in n}


def test_tfixup_ln_keeps_post_ln_and_has_tfixups_weights(dict_dir):
    with_ln, _, _ = build_model(dict_dir, "transformer_tfixup_ln", *FLAGS, seed=5)
    tfixup, _, _ = build_model(dict_dir, "transformer_tfixup", *FLAGS, seed=5)
    stock, _, _ = build_model(dict_dir, "transformer", *FLAGS, seed=5)
    assert _layer_norms(with_ln) == _layer_norms(stock) != []
    assert not with_ln.encoder.layers[0].normalize_before
    tfixup_params = dict(tfixup.named_parameters())
    for name, p in with_ln.named_parameters():
        if "layer_norm" in name:
            continue
        torch.testing.assert_close(p, tfixup_params[name], rtol=0, atol=0, msg=name)  # same draws, same scales


@pytest.mark.parametrize("arch, flag, message", [
    ("transformer_noln", "--encoder-normalize-before", "transformer_noln has no LayerNorm: --encoder-normalize-before"),
    ("transformer_noln", "--layernorm-embedding", "transformer_noln has no LayerNorm: --layernorm-embedding"),
    ("transformer_tfixup_ln", "--decoder-normalize-before",
     "transformer_tfixup_ln is a Post-LN Transformer: drop --decoder-normalize-before"),
])
def test_refusals_name_the_architecture(dict_dir, arch, flag, message):
    with pytest.raises(ValueError, match=message):
        build_model(dict_dir, arch, *FLAGS, flag)
