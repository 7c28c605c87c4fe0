"""GI-Adam (Kalra & Barkeshli, 2024) for a torch Adam/AdamW: ``gi_adam_init_(opt)`` after the first backward
pass and before the first ``opt.step()``. Needs torch only."""

import torch


def gi_adam_init_(opt: torch.optim.Optimizer) -> int:
    """Each parameter's second moment starts at its first gradient squared instead of zero (the first moment at
    zero, bias corrections kept), so that the first updates are about lr * sqrt(1 - beta2^t) per parameter
    instead of lr; parameters without a gradient are left to Adam; how many tensors."""
    n = 0
    for group in opt.param_groups:
        for p in group["params"]:
            if p.grad is None:
                continue
            state = opt.state[p]
            if state:
                raise ValueError("gi_adam_init_: the optimizer has stepped already; call it before its first step")
            state["step"] = torch.tensor(0.0, dtype=torch.float64 if torch.get_default_dtype() == torch.float64
                                         else torch.float32)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = p.grad.detach().clone().pow_(2)
            n += 1
    return n
