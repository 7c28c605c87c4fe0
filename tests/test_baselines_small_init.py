"""transformer_smallinit: fairseq's Transformer drawn as HuggingFace transformers draws the same model (Marian's
``_init_weights`` with ``init_std`` 0.02): every linear weight and embedding N(0, 0.02), biases and padding rows
0, LayerNorms 1 and 0; Post-LN by default and Pre-LN with fairseq's flags; the embedding multiplier kept.
(Decoding, a state-dict round trip and a fairseq-train run: tests/test_methods.py, as for every row.)"""

import importlib.util
import math
import pathlib
import re

import pytest
import torch
from torch import nn

from fairseq_tfixup.baselines.small_init import INIT_STD

from model_checks import build_tiny

N_ENC, N_DEC = 3, 2


def test_the_std_is_transformers_marian_default():
    """MarianConfig's init_std, read from transformers' source (importing transformers takes seconds)."""
    spec = importlib.util.find_spec("transformers")
    if spec is None:
        pytest.skip("transformers is not installed")
    source = pathlib.Path(spec.origin).parent / "models" / "marian" / "configuration_marian.py"
    found = re.findall(r"init_std\s*(?::\s*float)?\s*=\s*([\d.]+)", source.read_text())
    assert found and float(found[0]) == INIT_STD == 0.02


def test_every_weight_is_drawn_as_transformers_draws_it(dict_dir):
    model, _, args = build_tiny(dict_dir, "transformer_smallinit", N_ENC, N_DEC, seed=3)
    assert not args.encoder_normalize_before and not args.decoder_normalize_before  # Post-LN, as Marian
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 6 * N_ENC + 10 * N_DEC + 1  # every attention and feed-forward matrix, the output
    for name, linear in linears:
        assert linear.weight.std().item() == pytest.approx(INIT_STD, rel=0.1), name
        assert abs(linear.weight.mean().item()) < 0.1 * INIT_STD, name
        assert linear.bias is None or torch.count_nonzero(linear.bias) == 0, name  # q/k/v biases too
    for stack in (model.encoder, model.decoder):
        emb = stack.embed_tokens
        rows = torch.cat([emb.weight[: emb.padding_idx], emb.weight[emb.padding_idx + 1:]])
        assert rows.std().item() == pytest.approx(INIT_STD, rel=0.05)
        assert torch.count_nonzero(emb.weight[emb.padding_idx]) == 0
        assert stack.embed_scale == pytest.approx(math.sqrt(emb.embedding_dim))  # kept, as Marian's scale_embedding
    norms = [m for m in model.modules() if isinstance(m, nn.LayerNorm)]
    assert len(norms) == 2 * N_ENC + 3 * N_DEC
    assert all(torch.all(m.weight == 1) and torch.all(m.bias == 0) for m in norms)


def test_pre_ln_flags_give_the_pre_ln_model_with_the_same_draw(dict_dir):
    model, _, args = build_tiny(dict_dir, "transformer_smallinit", N_ENC, N_DEC, "--encoder-normalize-before",
                                "--decoder-normalize-before")
    assert args.encoder_normalize_before and args.decoder_normalize_before
    assert all(layer.normalize_before for layer in model.encoder.layers)
    assert model.encoder.layer_norm is not None and model.decoder.layer_norm is not None  # Pre-LN's final norms
    assert model.encoder.layers[0].fc1.weight.std().item() == pytest.approx(INIT_STD, rel=0.1)


def test_a_tied_output_projection_is_the_embedding(dict_dir):
    model, _, _ = build_tiny(dict_dir, "transformer_smallinit", 1, 1, "--share-decoder-input-output-embed")
    assert model.decoder.output_projection.weight is model.decoder.embed_tokens.weight
    assert model.decoder.output_projection.weight.std().item() == pytest.approx(INIT_STD, rel=0.05)
