"""The learning-rate schedules of this project's studies, as pure functions of the update count.

``warmup`` is fairseq's ``inverse_sqrt``; ``nowarmup`` and ``matched`` are this plugin's
``inverse_sqrt_nowarmup`` and ``inverse_sqrt_matched`` (fairseq_tfixup/lr_scheduler/, which compute
their rates with these functions). Plain Python, no fairseq or torch import: the studies' reports
read them. fairseq sets the rate for update t + 1 from t updates done (``step_update(t)``, the rate
at t = 0 set at build), so update k of a run takes ``lr_at(k - 1)``.
Any plain PyTorch loop (harness/bench/hf.py, examples/) can use them too, e.g.
``torch.optim.lr_scheduler.LambdaLR(opt, lambda t: nowarmup_lr(1.0, 4000, t))``.
"""


def nowarmup_lr(peak_lr: float, decay_period: int, num_updates: int) -> float:
    """lr * sqrt(P / (P + t)): T-Fixup's schedule."""
    return peak_lr * (decay_period / (decay_period + num_updates)) ** 0.5


def matched_lr(peak_lr: float, decay_period: int, warmup_updates: int, warmup_init_lr: float,
               num_updates: int) -> float:
    """Linear warmup over W updates onto lr * sqrt(P / (P + t)), then that curve."""
    if num_updates < warmup_updates:
        target = nowarmup_lr(peak_lr, decay_period, warmup_updates)
        return warmup_init_lr + (target - warmup_init_lr) * num_updates / warmup_updates
    return nowarmup_lr(peak_lr, decay_period, num_updates)


def inverse_sqrt_lr(peak_lr: float, warmup_updates: int, warmup_init_lr: float, num_updates: int) -> float:
    """fairseq's inverse_sqrt: linear warmup over W updates from the init rate, then lr * sqrt(W / t)."""
    if num_updates < warmup_updates:
        return warmup_init_lr + (peak_lr - warmup_init_lr) * num_updates / warmup_updates
    return peak_lr * (warmup_updates / num_updates) ** 0.5


def lr_at(kind: str, peak_lr: float, num_updates: int, warmup_updates: int = 4000, decay_period: int = 4000,
          warmup_init_lr: float = 1e-7) -> float:
    """The rate after ``num_updates`` updates under schedule ``kind`` (tfixup.methods.SCHEDULES)."""
    if kind == "warmup":
        return inverse_sqrt_lr(peak_lr, warmup_updates, warmup_init_lr, num_updates)
    if kind == "matched":
        return matched_lr(peak_lr, decay_period, warmup_updates, warmup_init_lr, num_updates)
    if kind == "nowarmup":
        return nowarmup_lr(peak_lr, decay_period, num_updates)
    raise ValueError(f"unknown schedule {kind!r}; choose warmup, matched or nowarmup")


def mean_lr(kind: str, peak_lr: float, updates: int, warmup_updates: int = 4000, decay_period: int = 4000,
            warmup_init_lr: float = 1e-7) -> float:
    """The mean rate of a run of ``updates`` updates (update k takes ``lr_at(k - 1)``)."""
    if updates < 1:
        raise ValueError(f"mean_lr needs updates >= 1, got {updates}")
    return sum(lr_at(kind, peak_lr, t, warmup_updates, decay_period, warmup_init_lr) for t in range(updates)) / updates
