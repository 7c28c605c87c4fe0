"""The two halves of T-Fixup, each alone: ablations for the paper's Fig. 3c and the authors' issue #7.

* ``transformer_noln``: the Transformer with every LayerNorm removed (as ``transformer_tfixup``)
  and fairseq's own initialisation, with no T-Fixup scaling. The paper (§3.1, Fig. 3c): removing
  LayerNorm "makes training very unstable even when warmup is used".
* ``transformer_tfixup_ln``: T-Fixup's initialisation (redraws and scales of
  ``tfixup.tfixup_init``) on the stock Post-LN Transformer, LayerNorms kept. What LayerNorm
  adds on top of T-Fixup's initialisation, asked on the authors' repository (issue #7) and not
  answered there.

Each is ``transformer_tfixup`` with one of its two steps left out, so both share its hooks and
refusals; architectures are registered for every preset (``_iwslt_de_en``, ..., ``_deep_narrow``).
"""

from fairseq.models import register_model
from fairseq.models.transformer import TransformerDecoderBase, TransformerEncoderBase

from fairseq_tfixup.baselines.post_ln import register_presets
from fairseq_tfixup.models.transformer_tfixup import TFixupTransformerModel


@register_model("transformer_noln")
class NoNormTransformerModel(TFixupTransformerModel):
    """No LayerNorm, fairseq's default initialisation (paper Fig. 3c's "no LN" arm)."""

    apply_init = False


@register_model("transformer_tfixup_ln")
class TFixupPostLNModel(TFixupTransformerModel):
    """T-Fixup's initialisation on the Post-LN Transformer, LayerNorms kept."""

    encoder_class = TransformerEncoderBase
    decoder_class = TransformerDecoderBase
    removes_layer_norm = False


register_presets("transformer_noln")
register_presets("transformer_tfixup_ln")
