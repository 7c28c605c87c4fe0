"""``--optimizer giadam``: GI-Adam (Kalra & Barkeshli, "Why Warmup the Learning Rate? Underlying Mechanisms and
Improvements", NeurIPS 2024, arXiv:2406.09405): Adam whose second moment starts at the squared gradient at
initialisation, v_0 = g_0^2, instead of 0.

Everything else is fairseq's ``adam`` on the CPU, step for step (``fairseq.optim.adam.Adam``, which this
subclasses): the same moments, bias corrections, epsilon outside the square root, and decoupled (AdamW-style)
weight decay; the flags are ``adam``'s (``--adam-betas``, ``--adam-eps``, ``--weight-decay``), so a recipe
switches with ``--optimizer`` alone. (On a GPU fairseq's ``adam`` takes apex's fused kernel where apex is
installed; ``giadam`` always runs this Python loop.)

g_0 is the gradient of the first update, at the initial weights: no extra batch is drawn. With the bias
correction kept, the first updates are then smaller than Adam's: after the first step v_1 = g_0^2, so its
bias-corrected value is g_0^2 / (1 - beta2) and the first update is lr sqrt(1 - beta2) sign(g_0) (0.14 lr at
beta2 = 0.98) where Adam's is lr sign(g_0); the factor fades as the early squared gradients leave v
(about 1 / (1 - beta2) updates): in effect a warmup that the optimizer does by itself. Train without
warmup (``--lr-scheduler inverse_sqrt_nowarmup``). A resumed run keeps its saved moments.
"""

from dataclasses import dataclass, field
from typing import Any, List

import torch
from omegaconf import II

from fairseq.dataclass import FairseqDataclass
from fairseq.optim import FairseqOptimizer, register_optimizer
from fairseq.optim.adam import Adam

from fairseq_tfixup.baselines.radam import adam_settings


class GIAdam(Adam):
    """fairseq's Adam with exp_avg_sq set to grad ** 2 (fp32) the first time a parameter is stepped."""

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None or len(self.state[p]) != 0:
                    continue
                grad = p.grad.data.float()
                state = self.state[p]
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(grad)
                state["exp_avg_sq"] = grad * grad  # v_0 = g_0^2: the only change to Adam
                if group.get("amsgrad", False):
                    state["max_exp_avg_sq"] = torch.zeros_like(grad)
        super().step()
        return loss


@dataclass
class FairseqGIAdamConfig(FairseqDataclass):
    adam_betas: Any = field(default=(0.9, 0.999), metadata={"help": "betas for GI-Adam"})
    adam_eps: float = field(default=1e-8, metadata={"help": "epsilon for GI-Adam"})
    weight_decay: float = field(default=0.0, metadata={"help": "decoupled weight decay (AdamW-style)"})
    lr: List[float] = II("optimization.lr")


@register_optimizer("giadam", dataclass=FairseqGIAdamConfig)
class FairseqGIAdam(FairseqOptimizer):
    """GI-Adam, configured like fairseq's ``adam``."""

    def __init__(self, cfg: FairseqGIAdamConfig, params):
        super().__init__(cfg)
        self._optimizer = GIAdam(params, **self.optimizer_config)

    @property
    def optimizer_config(self):
        """Settings that override those stored in a checkpoint (a resumed run may change them)."""
        return adam_settings(self.cfg)

    @property
    def supports_flat_params(self):
        return True  # elementwise, as fairseq's adam: FP16Optimizer may hand it one flat fp32 copy

    @property
    def supports_memory_efficient_fp16(self):
        return True  # fp32 moments for fp16 parameters, as fairseq's Adam keeps them
