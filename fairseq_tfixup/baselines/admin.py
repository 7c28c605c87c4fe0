"""``transformer_admin``: Admin, adaptive model initialisation (Liu, Liu, Gao, Chen & Han,
EMNLP 2020, "Understanding the Difficulty of Training Transformers", §5).

A Post-LN Transformer whose residual connections weigh the shortcut:

    x_i = LN(b_i),   b_i = x_{i-1} * omega_i + f_i(x_{i-1})

with omega_i a D-dimensional vector, trained with the rest after it is set, once, from a
profiling pass:

    omega_i = sqrt( sum_{j<i} Var[f_j(x_{j-1})] )

so that the shortcut carries as much as the branches below it contributed, as in Pre-LN.
Branches are counted per stack in the order they run (self-attention, encoder-attention,
FFN); j = 0 is the stack's input (embeddings), f_0(x_{-1}) = x_0, which keeps omega_1 > 0.

Where the profiling happens. It needs a real batch and the freshly initialised model, which
meet first in the first training step, so the model profiles itself there: before the first
forward in training mode it runs one forward in eval mode (no dropout) with omega = 1 (plain
Post-LN), reads each branch's output variance (over every position of the batch; *ours*),
sets the omegas and records ``admin_profiled`` in a buffer. Checkpoints carry that buffer, so
a resumed or evaluated model is never profiled again; with several workers the variances are
averaged across them, so every replica starts with the same omegas. A separate profiling
command (the authors' two runs) would do the same with one more step to get wrong.

Why not the ``admin-torch`` package (0.1.0): it sets omega from the depth alone (the
closed-form "O(log n)" rule of Liu et al.'s later "Very Deep Transformers for NMT"), with no
profiling, and its residual module would still have to be wired into fairseq's layers;
fairseq's ``residual_connection`` hook is that wiring.
"""

import logging
from typing import Dict, List

import torch
from torch import nn

from fairseq.models import register_model
from fairseq.models.transformer import TransformerModel
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

from fairseq_tfixup.baselines.layers import LayerClassDecoder, LayerClassEncoder
from fairseq_tfixup.baselines.post_ln import register_presets
from fairseq_tfixup.models.transformer_tfixup import CustomLayerStacks, post_ln_config, without_fused_encoder_path

logger = logging.getLogger(__name__)


class AdminResidual:
    """``residual_connection`` with omega: row r of ``self.omega`` for the r-th branch that runs.

    fairseq's layers call ``residual_connection(x, residual)`` once per branch, in order, and
    nothing else tells which branch it is; ``forward`` lists the rows before the call.
    """

    def residual_connection(self, x, residual):
        return residual * self.omega[next(self.branch_rows)] + x


class AdminEncoderLayer(AdminResidual, TransformerEncoderLayerBase):
    def __init__(self, cfg, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        self.omega = nn.Parameter(torch.ones(2, self.embed_dim))  # self-attention, FFN
        without_fused_encoder_path(self)

    def forward(self, x, *args, **kwargs):
        self.branch_rows = iter((0, 1))
        return super().forward(x, *args, **kwargs)


class AdminDecoderLayer(AdminResidual, TransformerDecoderLayerBase):
    def __init__(self, cfg, no_encoder_attn=False, add_bias_kv=False, add_zero_attn=False):
        super().__init__(cfg, no_encoder_attn, add_bias_kv, add_zero_attn)
        # self-attention, encoder-attention (if any), FFN
        self.omega = nn.Parameter(torch.ones(2 if no_encoder_attn else 3, self.embed_dim))

    def forward(self, x, encoder_out=None, *args, **kwargs):
        cross = self.encoder_attn is not None and encoder_out is not None
        self.branch_rows = iter((0, 1, 2) if cross else (0, len(self.omega) - 1))
        return super().forward(x, encoder_out, *args, **kwargs)


class AdminTransformerEncoder(LayerClassEncoder):
    layer_class = AdminEncoderLayer


class AdminTransformerDecoder(LayerClassDecoder):
    layer_class = AdminDecoderLayer


def omegas_from_variances(variances: torch.Tensor) -> torch.Tensor:
    """[Var x_0, Var f_1, ..., Var f_n] -> [omega_1, ..., omega_n]: omega_i^2 = sum_{j<i}."""
    return torch.cumsum(variances, dim=0)[:-1].sqrt()


def mean_over_workers(values: torch.Tensor) -> torch.Tensor:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(values)
        values /= torch.distributed.get_world_size()
    return values


@register_model("transformer_admin")
class AdminTransformerModel(CustomLayerStacks, TransformerModel):
    """Post-LN Transformer with Admin's profiled shortcut weights (Liu et al., 2020)."""

    encoder_class = AdminTransformerEncoder
    decoder_class = AdminTransformerDecoder

    def __init__(self, args, encoder, decoder):
        super().__init__(args, encoder, decoder)
        self.register_buffer("admin_profiled", torch.zeros((), dtype=torch.bool))

    @classmethod
    def build_model(cls, args, task):
        post_ln_config(args, "transformer_admin")
        return super().build_model(args, task)

    def forward(self, src_tokens, src_lengths, prev_output_tokens, *args, **kwargs):
        if self.training and not self.admin_profiled:
            self.profile_(src_tokens, src_lengths, prev_output_tokens)
        return super().forward(src_tokens, src_lengths, prev_output_tokens, *args, **kwargs)

    @torch.no_grad()
    def profile_(self, src_tokens, src_lengths, prev_output_tokens) -> Dict[str, List[float]]:
        """Set every omega from one forward pass on this batch (see the module's docstring)."""
        stacks = {"encoder": self.encoder, "decoder": self.decoder}
        variances: Dict[str, List[torch.Tensor]] = {side: [] for side in stacks}
        hooks = []
        for side, stack in stacks.items():
            record = variances[side].append
            # x_0: the first layer's input; f_i: each branch's output, where the layer applies
            # its dropout (an identity in eval mode) before the residual connection
            hooks.append(stack.layers[0].register_forward_pre_hook(lambda m, a, rec=record: rec(a[0].float().var())))
            for layer in stack.layers:
                hooks.append(layer.dropout_module.register_forward_hook(
                    lambda m, a, out, rec=record: rec(out.float().var())))
        try:
            self.eval()
            self(src_tokens, src_lengths, prev_output_tokens)
        finally:
            self.train()
            for hook in hooks:
                hook.remove()
        profiled = {}
        for side, stack in stacks.items():
            omegas = omegas_from_variances(mean_over_workers(torch.stack(variances[side])))
            rows = [layer.omega for layer in stack.layers]
            if len(omegas) != sum(len(r) for r in rows):
                raise RuntimeError(f"Admin profiling: {len(omegas)} {side} branches ran, expected {sum(len(r) for r in rows)}")
            for omega, values in zip(rows, omegas.split([len(r) for r in rows])):
                omega.copy_(values.unsqueeze(1).expand_as(omega))
            profiled[side] = omegas.tolist()
            logger.info("Admin: %s omegas %s", side, " ".join(f"{w:.3f}" for w in profiled[side]))
        self.admin_profiled.fill_(True)
        return profiled


register_presets("transformer_admin")  # fairseq's presets (and 64-128-2 _deep_narrow); explicit flags win
