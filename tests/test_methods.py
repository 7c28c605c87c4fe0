"""Every method row of tfixup/methods.py, from its row alone: its fairseq architectures are registered for
every size preset with that preset's sizes, its model decodes incrementally as in a full pass and survives a
state-dict round trip, and it trains through fairseq-train --user-dir on real data, the main job's Multi30k
data-bin (its own optimizer and warmup, through the project's one command builder). A new row is tested here with no code naming it."""

import pytest
from fairseq.models import ARCH_MODEL_REGISTRY

import fairseq_tfixup  # noqa: F401  (registers the models)
from fairseq_tfixup.baselines.post_ln import PRESETS
from tfixup import methods

from conftest import build_model
from model_checks import (
    assert_encoder_survives_state_dict_round_trip,
    assert_incremental_decoding_matches_full,
    build_tiny,
    train_briefly,
    trained_looking_,
)

# the plugin's models (fairseq's own transformer is fairseq's to test)
MODELS = sorted({m.arch for m in methods.METHODS.values() if m.arch != "transformer"})
# (embed, ffn, heads) that each architecture suffix gives, as its fairseq (or T-Fixup depth-study) preset does
SIZES = {"": (512, 2048, 8), "_iwslt_de_en": (512, 1024, 4), "_wmt_en_de": (512, 2048, 8),
         "_vaswani_wmt_en_de_big": (1024, 4096, 16), "_deep_narrow": (64, 128, 2)}
# one method per model and optimizer of the plugin's (fairseq's own transformer with Adam or SGD is
# fairseq's to test; DLCL-Pre-LN is DLCL's model with fairseq's flags)
TRAINED_HERE = list({(m.arch, m.optimizer): name for name, m in reversed(methods.METHODS.items())
                     if m.arch != "transformer" or m.optimizer not in ("adam", "sgd")}.values())


def test_every_size_preset_is_a_suffix():
    assert set(SIZES) == set(PRESETS)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("suffix", SIZES)
def test_architectures_are_registered_with_each_presets_sizes(model, suffix, dict_dir):
    arch = model + suffix
    assert arch in ARCH_MODEL_REGISTRY, f"{arch} is not registered"
    built, _, a = build_model(dict_dir, arch, "--encoder-layers", 1, "--decoder-layers", 1)
    assert type(built) is ARCH_MODEL_REGISTRY[arch]
    assert (a.encoder_embed_dim, a.encoder_ffn_embed_dim, a.encoder_attention_heads) == SIZES[suffix]
    assert (a.decoder_embed_dim, a.decoder_ffn_embed_dim, a.decoder_attention_heads) == SIZES[suffix]


@pytest.mark.parametrize("model", MODELS)
def test_incremental_decoding_and_a_state_dict_round_trip_keep_the_models_function(model, dict_dir):
    """Weights perturbed (an initialisation may make layers near-identity and hide a wrong decoding cache);
    the round trip: fairseq 0.12.2 switches encoder layers to a fused Post-LN kernel once a state dict is
    loaded, which would drop a method's own residual (DeepNorm's alpha, ReZero's gate, a missing LayerNorm)."""
    built, _, _ = build_tiny(dict_dir, model, 3, 2)
    assert_incremental_decoding_matches_full(trained_looking_(built))
    assert_encoder_survives_state_dict_round_trip(built)


@pytest.mark.parametrize("method", TRAINED_HERE)
def test_every_method_trains_through_fairseq_train(main_job_bin, method):
    log = train_briefly(main_job_bin, method)
    model = ARCH_MODEL_REGISTRY[methods.method(method).arch].__name__
    assert f"{model}(" in log  # fairseq-train built the method's own model (it logs the model)
    assert f"'optimizer': {{'_name': '{methods.method(method).optimizer}'" in log
