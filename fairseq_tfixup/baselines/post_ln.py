"""What the baselines share: the architecture presets they are registered with. (The Post-LN ones,
DS-Init, DeepNorm, Admin and LRI, refuse pre-LN flags through models/transformer_tfixup.py's
``post_ln_config``: those methods are defined for the Post-LN Transformer, x_{l+1} = LN(x_l + G(x_l)).)"""

from fairseq.models import register_model_architecture
from fairseq.models.transformer import (
    base_architecture,
    transformer_iwslt_de_en,
    transformer_vaswani_wmt_en_de_big,
    transformer_wmt_en_de,
)

from fairseq_tfixup.models.transformer_tfixup import tfixup_deep_narrow

# suffix -> preset, so that `<model>_iwslt_de_en` has the sizes of fairseq's `transformer_iwslt_de_en`
# and `<model>_deep_narrow` those of `transformer_tfixup_deep_narrow` (64-128-2, the depth study)
PRESETS = {
    "": base_architecture,
    "_iwslt_de_en": transformer_iwslt_de_en,
    "_wmt_en_de": transformer_wmt_en_de,
    "_vaswani_wmt_en_de_big": transformer_vaswani_wmt_en_de_big,
    "_deep_narrow": tfixup_deep_narrow,
}


def register_presets(model_name: str) -> None:
    """Register the architectures ``<model_name><suffix>`` for every preset."""
    for suffix, preset in PRESETS.items():
        register_model_architecture(model_name, model_name + suffix)(preset)
