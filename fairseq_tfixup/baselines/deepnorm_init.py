"""DeepNorm's constants for an encoder-decoder (Wang et al., 2022, "DeepNet:
Scaling Transformers to 1,000 Layers", §2.3-2.4 and Figure 2), as pure functions.

DeepNorm keeps Post-LN and up-weights the residual: x_{l+1} = LN(alpha * x_l + G_l(x_l)).
It also draws v_proj, out_proj, fc1 and fc2 Xavier-normal with gain beta, and q_proj,
k_proj Xavier-normal with gain 1 (Figure 2's ``deepnorm_init``). With N encoder
and M decoder layers (Figure 2's table):

* encoder: alpha = 0.81 (N^4 M)^(1/16), beta = 0.87 (N^4 M)^(-1/16);
* decoder: alpha = (3M)^(1/4), beta = (12M)^(-1/4), for every decoder sublayer
  (self-attention, encoder attention and feed-forward).

``baselines/deepnorm.py`` applies them; the tests read them against the paper.
"""

BETA_SCALED = ("v_proj", "out_proj", "fc1", "fc2")
UNIT_GAIN = ("q_proj", "k_proj")


def encoder_alpha(encoder_layers: int, decoder_layers: int) -> float:
    _check(encoder_layers, decoder_layers)
    return 0.81 * (encoder_layers ** 4 * decoder_layers) ** (1 / 16)


def encoder_beta(encoder_layers: int, decoder_layers: int) -> float:
    _check(encoder_layers, decoder_layers)
    return 0.87 * (encoder_layers ** 4 * decoder_layers) ** (-1 / 16)


def decoder_alpha(decoder_layers: int) -> float:
    _check(1, decoder_layers)
    return (3 * decoder_layers) ** 0.25


def decoder_beta(decoder_layers: int) -> float:
    _check(1, decoder_layers)
    return (12 * decoder_layers) ** -0.25


def xavier_gain(linear_name: str, beta: float) -> float:
    """Gain of the Xavier-normal draw for a linear layer of a Transformer layer, named as
    ``layer.named_modules()`` yields it (``self_attn.v_proj``, ``encoder_attn.q_proj``, ``fc2``)."""
    leaf = linear_name.rsplit(".", 1)[-1]
    if leaf in BETA_SCALED:
        return beta
    if leaf in UNIT_GAIN:
        return 1.0
    raise ValueError(f"DeepNorm has no rule for linear layer {linear_name!r}")


def _check(encoder_layers: int, decoder_layers: int) -> None:
    if encoder_layers < 1 or decoder_layers < 1:
        raise ValueError(f"DeepNorm needs at least one layer per stack, got {encoder_layers} and {decoder_layers}")
