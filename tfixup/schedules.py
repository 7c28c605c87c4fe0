"""The project's two learning-rate curves as plain functions of the update count (no fairseq, no torch).

    nowarmup_lr: lr * sqrt(P / (P + t)), from the first update (T-Fixup's schedule)
    matched_lr:  a linear warmup over W updates from ``warmup_init_lr`` onto that same curve, then the curve

fairseq's schedulers ``inverse_sqrt_nowarmup`` and ``inverse_sqrt_matched`` (fairseq_tfixup/lr_scheduler/)
and any plain PyTorch loop (harness/bench/hf.py, examples/) use these, e.g. with
``torch.optim.lr_scheduler.LambdaLR(opt, lambda t: nowarmup_lr(1.0, 4000, t))``.
"""


def nowarmup_lr(peak_lr: float, decay_period: int, num_updates: int) -> float:
    return peak_lr * (decay_period / (decay_period + num_updates)) ** 0.5


def matched_lr(peak_lr: float, decay_period: int, warmup_updates: int, warmup_init_lr: float,
               num_updates: int) -> float:
    if num_updates < warmup_updates:
        target = nowarmup_lr(peak_lr, decay_period, warmup_updates)
        return warmup_init_lr + (target - warmup_init_lr) * num_updates / warmup_updates
    return nowarmup_lr(peak_lr, decay_period, num_updates)
