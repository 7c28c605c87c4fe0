"""``--optimizer radam``: Rectified Adam (Liu et al., ICLR 2020, "On the Variance
of the Adaptive Learning Rate and Beyond"), the T-Fixup paper's "RAdam, no
warmup" baseline (Table 1: IWSLT'14 De-En 34.8, IWSLT'14 En-De 28.5).

RAdam (Liu et al., Algorithm 2) is Adam whose adaptive step is multiplied by the
rectification term r_t = sqrt((rho_t - 4)(rho_t - 2) rho_inf /
((rho_inf - 4)(rho_inf - 2) rho_t)), with rho_inf = 2 / (1 - beta2) - 1 and
rho_t = rho_inf - 2 t beta2^t / (1 - beta2^t) (§4, Eq. 5-7). While the variance
of the adaptive rate is intractable the step is plain SGD with momentum. The
paper's test is rho_t > 4; the authors' code and ``torch.optim.RAdam`` (which we
wrap) use rho_t > 5. Weight decay is decoupled, as in the authors' code and in
fairseq's own ``adam`` (AdamW-style).

The flags are ``adam``'s (``--adam-betas``, ``--adam-eps``, ``--weight-decay``),
so a recipe switches between the two with ``--optimizer`` alone. Train without
warmup, e.g. with ``--lr-scheduler inverse_sqrt_nowarmup``.
"""

import ast
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, List

import torch
from omegaconf import II, OmegaConf

from fairseq.dataclass import FairseqDataclass
from fairseq.optim import FairseqOptimizer, register_optimizer


@dataclass
class FairseqRAdamConfig(FairseqDataclass):
    adam_betas: Any = field(default=(0.9, 0.999), metadata={"help": "betas for RAdam"})
    adam_eps: float = field(default=1e-8, metadata={"help": "epsilon for RAdam"})
    weight_decay: float = field(default=0.0, metadata={"help": "decoupled weight decay (AdamW-style)"})
    lr: List[float] = II("optimization.lr")


def adam_settings(cfg) -> dict:
    """lr, betas, eps and weight decay of an optimizer configured with ``adam``'s flags (RAdam, GI-Adam)."""
    betas = cfg.adam_betas  # "(0.9, 0.98)" on the command line, a list in a hydra config
    if isinstance(betas, str):
        betas = ast.literal_eval(betas)
    elif OmegaConf.is_config(betas):
        betas = OmegaConf.to_container(betas)
    return {
        "lr": cfg.lr[0] if isinstance(cfg.lr, Collection) else cfg.lr,
        "betas": tuple(betas),
        "eps": cfg.adam_eps,
        "weight_decay": cfg.weight_decay,
    }


@register_optimizer("radam", dataclass=FairseqRAdamConfig)
class FairseqRAdam(FairseqOptimizer):
    """``torch.optim.RAdam`` with decoupled weight decay, configured like fairseq's ``adam``."""

    def __init__(self, cfg: FairseqRAdamConfig, params):
        super().__init__(cfg)
        self._optimizer = torch.optim.RAdam(params, decoupled_weight_decay=True, **self.optimizer_config)

    @property
    def optimizer_config(self):
        """Settings that override those stored in a checkpoint (a resumed run may change them)."""
        return adam_settings(self.cfg)

    @property
    def supports_flat_params(self):
        # RAdam's update is elementwise, so fairseq's FP16Optimizer may hand it one flat fp32
        # copy of all parameters (as it does for adam). Its state follows the parameters' dtype,
        # so the memory-efficient fp16 path (fp16 parameters, fp32 state) stays unsupported.
        return True
