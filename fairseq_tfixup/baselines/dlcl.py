"""``transformer_dlcl``: dynamic linear combination of layers (Wang et al., ACL 2019, "Learning
Deep Transformer Models for Machine Translation", §3.2), the rows "DLCL 25L" (Post-LN) and
"DLCL-Pre-LN 30L" of T-Fixup's Table 2.

With y_0 the embedding output and y_k the output of encoder layer k, the input of layer l+1
(and, for l = N, the encoder's output) is a learned combination of everything below it:

* Pre-LN (``--encoder-normalize-before``): x_{l+1} = sum_{k<=l} W_{l+1,k} LN_k(y_k);
* Post-LN (fairseq's default):            x_{l+1} = LN_{l+1}(sum_{k<=l} W_{l+1,k} y_k).

W is one learned lower-triangular (N+1) x (N+1) matrix (row l feeds layer l+1, row N is the
output); *ours*: initialised to the average, W_{l+1,k} = 1/(l+1), which the authors' code
offers next to the identity start. Each LN_k is its own LayerNorm (N+1 of them).
Pre-LN keeps fairseq's final LayerNorm after the combination, as a stock Pre-LN encoder does.

Wang et al. deepen and combine the encoder only; the decoder is fairseq's own. The layers are
fairseq's own too: only the encoder's layer loop changes, and fairseq has no hook narrower
than ``forward_scriptable`` for it (each layer's input there is the previous output).
"""

from typing import List, Optional

import torch
from torch import nn

from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerEncoderBase, TransformerModel, transformer_wmt_en_de
from fairseq.modules import LayerNorm

from fairseq_tfixup.baselines.post_ln import register_presets
from fairseq_tfixup.models.transformer_tfixup import CustomLayerStacks, without_fused_encoder_path


def average_weights(num_layers: int) -> torch.Tensor:
    """(N+1) x (N+1): row l averages y_0..y_l, zero above the diagonal."""
    rows = torch.arange(1, num_layers + 2, dtype=torch.float).unsqueeze(1)
    return torch.tril(torch.ones(num_layers + 1, num_layers + 1)) / rows


class DLCLTransformerEncoder(TransformerEncoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, return_fc=False):
        if return_fc:
            raise ValueError("transformer_dlcl: return_fc (fc_results) is not supported")
        super().__init__(cfg, dictionary, embed_tokens, return_fc=False)
        n = cfg.encoder.layers
        self.pre_norm = cfg.encoder.normalize_before
        self.dlcl_weights = nn.Parameter(average_weights(n))
        self.dlcl_norms = nn.ModuleList(LayerNorm(cfg.encoder.embed_dim, export=cfg.export) for _ in range(n + 1))

    def build_encoder_layer(self, cfg):
        return without_fused_encoder_path(super().build_encoder_layer(cfg))

    def remember(self, history: List[torch.Tensor], y: torch.Tensor) -> None:
        """Store y_k: normalised once (Pre-LN) or as it is (Post-LN)."""
        history.append(self.dlcl_norms[len(history)](y) if self.pre_norm else y)

    def combine(self, history: List[torch.Tensor]) -> torch.Tensor:
        """The input of layer l+1 from y_0..y_l (l+1 = len(history))."""
        weights = self.dlcl_weights[len(history) - 1, : len(history)]
        x = torch.einsum("k,ktbc->tbc", weights.type_as(history[0]), torch.stack(history))
        return x if self.pre_norm else self.dlcl_norms[len(history) - 1](x)

    def forward_scriptable(
        self,
        src_tokens,
        src_lengths: Optional[torch.Tensor] = None,
        return_all_hiddens: bool = False,
        token_embeddings: Optional[torch.Tensor] = None,
    ):
        """fairseq's encoder forward with the layer loop above; same inputs and outputs."""
        padding_mask = src_tokens.eq(self.padding_idx)
        has_pads = bool(padding_mask.any())
        x, encoder_embedding = self.forward_embedding(src_tokens, token_embeddings)
        x = (x * (1 - padding_mask.unsqueeze(-1).type_as(x))).transpose(0, 1)  # T x B x C

        states = [x] if return_all_hiddens else []
        history: List[torch.Tensor] = []
        self.remember(history, x)
        for layer in self.layers:
            x = layer(self.combine(history), encoder_padding_mask=padding_mask if has_pads else None)
            self.remember(history, x)
            if return_all_hiddens:
                states.append(x)
        x = self.combine(history)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        return {
            "encoder_out": [x],
            "encoder_padding_mask": [padding_mask],
            "encoder_embedding": [encoder_embedding],
            "encoder_states": states,
            "fc_results": [],
            "src_tokens": [],
            "src_lengths": [src_tokens.ne(self.padding_idx).sum(dim=1, dtype=torch.int32).reshape(-1, 1)],
        }


@register_model("transformer_dlcl")
class DLCLTransformerModel(CustomLayerStacks, TransformerModel):
    """Transformer whose encoder layers read a learned combination of all earlier layers
    (Wang et al., 2019). Post-LN by default; Pre-LN with ``--encoder-normalize-before``."""

    encoder_class = DLCLTransformerEncoder  # the decoder is fairseq's


# Architectures: fairseq's presets (and 64-128-2 _deep_narrow); explicit flags win. Set the depth
# with --encoder-layers (Table 2 of T-Fixup: DLCL 25 layers, DLCL-Pre-LN 30).
register_presets("transformer_dlcl")


@register_model_architecture("transformer_dlcl", "transformer_dlcl_pre_norm_wmt_en_de")
def dlcl_pre_norm_wmt_en_de(args):
    """DLCL-Pre-LN: Pre-LN encoder and decoder."""
    args.encoder_normalize_before = getattr(args, "encoder_normalize_before", True)
    args.decoder_normalize_before = getattr(args, "decoder_normalize_before", True)
    transformer_wmt_en_de(args)
