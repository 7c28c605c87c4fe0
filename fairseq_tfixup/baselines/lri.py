"""``transformer_lri``: Lipschitz constrained parameter initialisation (LRI; Xu, Liu, van Genabith,
Xiong, Zhang, ACL 2020, "Lipschitz Constrained Parameter Initialization for Deep Transformers",
pp. 397-402; arXiv:1911.03179, first titled "Why Deep Transformers are Difficult to Converge? From
Computation Order to Lipschitz Restricted Parameter Initialization"), the T-Fixup paper's Table 3
baseline (WMT'14 En-De base, 12 layers 28.7, 24 layers 29.5 BLEU).

What the method is, and where each part comes from:

* Computation order (paper Figure 1 and its caption). The paper compares the order of the
  original paper, (a) "v1": out = LN(in_res + F(in_res)), the Post-LN Transformer, with the one
  of the official implementation, (b) "v2": out = in_res + F(LN(in_res)), Pre-LN. It regards
  LN's output as the residual connection's output, since it is the next sublayer's in_res;
  then each v1 sublayer reads y = LN(x) and gives y + F(y), the LN output, not x, on the
  shortcut. Its abstract: v2 eases the optimisation of deep Transformers, and with the
  Lipschitz initialisation deep Transformers in the *original* order v1 converge too, with
  BLEU gains up to 24 layers (a summary of the paper adds that v1's LayerNorm can shrink the
  residual connection, which the initialisation is to prevent; that analysis itself is in the
  part of the paper not available here, see below).
  The authors' code (github.com/hfxunlp/transformer, "Neutron") computes exactly that: every
  sublayer starts with its LayerNorm, ``norm_residual`` takes the shortcut from the LN output
  (v1; ``cnfg/hyp.py`` ``computation_order = "v1"``, the default there), and each stack ends
  with a LayerNorm (``norm_output``). Counted per stack that is fairseq's Post-LN layer,
  x <- LN(x + dropout(F(x))), plus one LayerNorm on the stack's input: the LN that opens the
  first sublayer, which Post-LN does not have. Here: fairseq's Post-LN layers unchanged and
  its ``layernorm_embedding`` (switched on by ``build_model``) as that input LayerNorm.
  One difference, *ours*: fairseq normalises the embeddings before their dropout, the
  authors' code after it; at evaluation the two are the same function.
* Initialisation, as the authors' code does it (``utils/init.py``,
  ``init_model_params_lipschitz``, under that name since commit 362ed8d, 2020-04-13; the
  same rule as ``init_model_params`` in ``utils.py``, commit 6809ade, 2019-06-12, the code
  of the paper's experiments): every linear weight U(-b, b), b = 1 / sqrt(d_in) (their
  Kaiming-uniform with gain sqrt(1/3): sqrt(3) * sqrt(1/3) / sqrt(d_in)), biases 0; every
  embedding matrix (vocabulary V x d) U(-e, e), e = sqrt(2 / (V + d)) (their Xavier-uniform
  with gain sqrt(1/3)), the padding row 0; LayerNorm gain 1, bias 0 (fairseq's own).
  Linear layers are drawn first and embeddings after, as there, so an output projection
  shared with the embedding keeps the embedding's rule. For a square d x d matrix b is
  Xavier's bound / sqrt(3).

Uncertain (docs/baselines.md says the same): the paper's own section on the initialisation
(its equations) was not available to this project; the bounds above are the authors' code,
which names them after the paper (its ``cnfg/README.md``: "lipschitz constraint parameter
initialization in [Lipschitz Constrained Parameter Initialization for Deep Transformers]").
Which of the paper's result columns (v1 or v2 with the initialisation) the T-Fixup paper's
LRI rows quote is not stated there either; v1 is the order the paper's abstract claims the
initialisation makes trainable, and the authors' default.

Refused: ``--encoder-normalize-before``/``--decoder-normalize-before`` (they would make the
model order v2, Pre-LN). Sizes come from fairseq's presets (``post_ln.register_presets``). Schedule: with
warmup, as the authors train (their ``GoogleLR``, 8000 warmup steps).
"""

import logging
import math

import torch
from torch import nn

from fairseq.models import register_model
from fairseq.models.transformer import TransformerModel

from fairseq_tfixup.baselines.post_ln import register_presets
from fairseq_tfixup.models.transformer_tfixup import post_ln_config

logger = logging.getLogger(__name__)


def linear_bound(fan_in: int) -> float:
    """b of a linear weight's U(-b, b): 1 / sqrt(d_in)."""
    return 1.0 / math.sqrt(fan_in)


def embedding_bound(num_embeddings: int, embedding_dim: int) -> float:
    """e of an embedding matrix's U(-e, e): sqrt(2 / (V + d))."""
    return math.sqrt(2.0 / (num_embeddings + embedding_dim))


@torch.no_grad()
def apply_lri_init_(model: nn.Module) -> None:
    """Redraw every linear layer, then every embedding matrix, of the model, in place."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            bound = linear_bound(module.in_features)
            nn.init.uniform_(module.weight, -bound, bound)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            bound = embedding_bound(module.num_embeddings, module.embedding_dim)
            nn.init.uniform_(module.weight, -bound, bound)
            if module.padding_idx is not None:
                module.weight[module.padding_idx].zero_()


@register_model("transformer_lri")
class LRITransformerModel(TransformerModel):
    """Post-LN layers with a LayerNorm on each stack's input (LRI's order v1) and LRI's
    initialisation. Takes every ``transformer`` flag."""

    @classmethod
    def build_model(cls, args, task):
        post_ln_config(args, "transformer_lri")
        args.layernorm_embedding = True  # the LayerNorm that opens v1's first sublayer
        # fairseq builds the model, then (when loading a checkpoint) overwrites every parameter
        model = super().build_model(args, task)
        apply_lri_init_(model)
        logger.info("LRI: order v1 (a LayerNorm on each stack's input, then Post-LN layers); "
                    "linear weights U(+-1/sqrt(d_in)), embeddings U(+-sqrt(2/(V+d))), biases 0")
        return model


register_presets("transformer_lri")
