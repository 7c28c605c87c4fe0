"""What the Post-LN baselines share (baselines/post_ln.py): the refusal of Pre-LN flags. (Their
architectures and sizes: tests/test_methods.py, for every method.)"""

import pytest

import fairseq_tfixup  # noqa: F401  (registers the baselines)

from conftest import build_model

MODELS = {"transformer_dsinit": "DSInitTransformerModel", "transformer_deepnorm": "DeepNormTransformerModel",
          "transformer_lri": "LRITransformerModel"}


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("flag", ["--encoder-normalize-before", "--decoder-normalize-before"])
def test_pre_ln_flags_are_refused(model, flag, dict_dir):
    with pytest.raises(ValueError, match=f"^{model} is a Post-LN Transformer: drop {flag}$"):
        build_model(dict_dir, model + "_deep_narrow", "--encoder-layers", 1, "--decoder-layers", 1, flag)
