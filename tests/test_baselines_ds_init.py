"""transformer_dsinit (Zhang et al., EMNLP 2019): depth-scaled Xavier per layer, decoding, training."""

import math

import pytest
import torch
from torch import nn

from fairseq_tfixup.baselines.ds_init import ds_init_bound

from model_checks import TINY, assert_incremental_decoding_matches_full, trained_looking_
from conftest import build_model

N_ENC, N_DEC = 4, 6
LAYERS = ["--encoder-layers", N_ENC, "--decoder-layers", N_DEC, *TINY]


def test_bound_is_xavier_over_sqrt_depth():
    xavier = math.sqrt(6 / (512 + 2048))
    assert ds_init_bound(512, 2048, 1) == pytest.approx(xavier)
    assert ds_init_bound(512, 2048, 4) == pytest.approx(xavier / 2)
    assert ds_init_bound(512, 2048, 9, alpha=0.6) == pytest.approx(xavier * 0.2)
    with pytest.raises(ValueError, match="counts layers from 1"):
        ds_init_bound(512, 512, 0)


def _linears(stack):
    """(depth l from 1, name, nn.Linear) for every linear layer of every layer of a stack."""
    for depth, layer in enumerate(stack.layers, start=1):
        for name, module in layer.named_modules():
            if isinstance(module, nn.Linear):
                yield depth, name, module


def test_each_layer_is_drawn_with_its_depth_scaled_bound(dict_dir):
    model, _, _ = build_model(dict_dir, "transformer_dsinit", *LAYERS, seed=3)
    stock, _, _ = build_model(dict_dir, "transformer", *LAYERS, seed=3)
    for stack, n in ((model.encoder, N_ENC), (model.decoder, N_DEC)):
        seen = set()
        for depth, name, linear in _linears(stack):
            w = linear.weight
            bound = math.sqrt(6 / (linear.in_features + linear.out_features)) / math.sqrt(depth)
            # uniform on [-bound, bound]: std bound/sqrt(3), support reaching the bound
            assert w.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.05), (depth, name)
            assert bound * 0.95 < w.abs().max().item() <= bound, (depth, name)
            assert torch.count_nonzero(linear.bias) == 0, (depth, name)
            seen.add(name)
        assert seen == ({"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj", "fc1", "fc2"}
                        | ({"encoder_attn." + p for p in ("q_proj", "k_proj", "v_proj", "out_proj")}
                           if stack is model.decoder else set()))
        # the deepest layer's weights are sqrt(n) times smaller than the first's
        first, last = stack.layers[0].fc1.weight.std().item(), stack.layers[-1].fc1.weight.std().item()
        assert first / last == pytest.approx(math.sqrt(n), rel=0.05)
    # everything outside the layers' linear maps is fairseq's own draw (same seed, same build order)
    stock_params = dict(stock.named_parameters())
    others = [n for n, _ in model.named_parameters() if not n.endswith(("_proj.weight", "_proj.bias", "fc1.weight",
                                                                          "fc1.bias", "fc2.weight", "fc2.bias"))]
    assert "encoder.embed_tokens.weight" in others and "decoder.layers.0.final_layer_norm.weight" in others
    for name in others:
        torch.testing.assert_close(dict(model.named_parameters())[name], stock_params[name], rtol=0, atol=0, msg=name)


def test_alpha_flag_scales_every_bound(dict_dir):
    half, _, _ = build_model(dict_dir, "transformer_dsinit", *LAYERS, "--ds-init-alpha", 0.5, seed=3)
    full, _, _ = build_model(dict_dir, "transformer_dsinit", *LAYERS, seed=3)
    for stack in ("encoder", "decoder"):
        for (_, name, a), (_, _, b) in zip(_linears(getattr(half, stack)), _linears(getattr(full, stack))):
            assert a.weight.std().item() == pytest.approx(0.5 * b.weight.std().item(), rel=0.05), name
    with pytest.raises(ValueError, match="--ds-init-alpha must be > 0, got 0.0"):
        build_model(dict_dir, "transformer_dsinit", *LAYERS, "--ds-init-alpha", 0)


def test_incremental_decoding_equals_full_forward(dict_dir):
    model, _, _ = build_model(dict_dir, "transformer_dsinit", "--encoder-layers", 3, "--decoder-layers", 4, *TINY)
    assert_incremental_decoding_matches_full(trained_looking_(model))
