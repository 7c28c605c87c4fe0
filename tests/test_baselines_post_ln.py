"""What the Post-LN baselines share (baselines/post_ln.py): their architectures, sized like fairseq's
presets, and the refusal of Pre-LN flags."""

import pytest
from fairseq.models import ARCH_MODEL_REGISTRY

import fairseq_tfixup  # noqa: F401  (registers the baselines)

from conftest import build_model

MODELS = {"transformer_dsinit": "DSInitTransformerModel", "transformer_deepnorm": "DeepNormTransformerModel",
          "transformer_lri": "LRITransformerModel"}
# (embed, ffn, heads) that each architecture suffix gives, as its fairseq (or T-Fixup depth-study) preset does
SIZES = {"": (512, 2048, 8), "_iwslt_de_en": (512, 1024, 4), "_wmt_en_de": (512, 2048, 8),
         "_vaswani_wmt_en_de_big": (1024, 4096, 16), "_deep_narrow": (64, 128, 2)}


@pytest.mark.parametrize("model", MODELS)
def test_architectures_are_registered(model):
    archs = sorted(a for a, m in ARCH_MODEL_REGISTRY.items() if m.__name__ == MODELS[model])
    assert archs == sorted(model + suffix for suffix in SIZES)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("suffix", SIZES)
def test_architecture_sizes(model, suffix, dict_dir):
    built, _, a = build_model(dict_dir, model + suffix, "--encoder-layers", 1, "--decoder-layers", 1)
    assert type(built).__name__ == MODELS[model]
    assert (a.encoder_embed_dim, a.encoder_ffn_embed_dim, a.encoder_attention_heads) == SIZES[suffix]
    assert (a.decoder_embed_dim, a.decoder_ffn_embed_dim, a.decoder_attention_heads) == SIZES[suffix]
    assert not a.encoder_normalize_before and not a.decoder_normalize_before  # Post-LN
    assert built.encoder.layers[0].self_attn_layer_norm is not None


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("flag", ["--encoder-normalize-before", "--decoder-normalize-before"])
def test_pre_ln_flags_are_refused(model, flag, dict_dir):
    with pytest.raises(ValueError, match=f"^{model} is a Post-LN Transformer: drop {flag}$"):
        build_model(dict_dir, model + "_deep_narrow", "--encoder-layers", 1, "--decoder-layers", 1, flag)
