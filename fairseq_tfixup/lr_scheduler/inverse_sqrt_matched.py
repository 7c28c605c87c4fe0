"""``inverse_sqrt_matched``: linear warmup over W updates onto T-Fixup's curve, then that curve.

    lr_t = init + (lr * sqrt(P / (P + W)) - init) * t / W     for t < W
    lr_t = lr * sqrt(P / (P + t))                             for t >= W

A warmup baseline that differs from a T-Fixup run (``inverse_sqrt_nowarmup``, same ``--lr`` and
``--decay-period P``) only in its first W updates. The decay uses the update count t itself, not
t - W: from update W on, both runs take the same step size at the same update, so any later
difference comes from the method and the warmup, not the schedule. (With t - W the baseline would
run at a slightly higher rate than T-Fixup at every later update.) fairseq's ``inverse_sqrt``
decays as lr * sqrt(W / t) instead, which for W < P is well below T-Fixup's curve: with W = 200
and P = 4000 its mean rate over 800 updates is 0.63 of the peak against T-Fixup's 0.95.

In the paper W = P = 4000; at t = W both schedules reach lr / sqrt(2) here, where fairseq's
``inverse_sqrt`` would reach lr. The rate is a pure function of t, so a resume is exact.
"""

from dataclasses import dataclass, field
from typing import List

from omegaconf import II

from fairseq.dataclass import FairseqDataclass
from fairseq.optim.lr_scheduler import register_lr_scheduler

from fairseq_tfixup.lr_scheduler.inverse_sqrt_nowarmup import UpdateSchedule, single_lr
from tfixup.schedules import matched_lr  # noqa: F401  (the formula, plain Python; imported from here too)


@dataclass
class InverseSqrtMatchedConfig(FairseqDataclass):
    warmup_updates: int = field(default=4000, metadata={"help": "W: linear warmup over the first W updates"})
    warmup_init_lr: float = field(default=1e-7, metadata={"help": "the rate at update 0"})
    decay_period: int = field(
        default=4000, metadata={"help": "P of T-Fixup's curve lr * sqrt(P / (P + t)), followed from update W on"})
    lr: List[float] = II("optimization.lr")


@register_lr_scheduler("inverse_sqrt_matched", dataclass=InverseSqrtMatchedConfig)
class InverseSqrtMatchedSchedule(UpdateSchedule):
    """Warm up linearly over W updates, then follow lr * sqrt(P / (P + t)) (T-Fixup's curve)."""

    def __init__(self, cfg: InverseSqrtMatchedConfig, optimizer):
        super().__init__(cfg, optimizer)
        self.peak_lr = single_lr(cfg.lr, "inverse_sqrt_matched")
        if cfg.warmup_updates <= 0:
            raise ValueError(f"inverse_sqrt_matched needs --warmup-updates > 0, got {cfg.warmup_updates} "
                             "(without warmup use --lr-scheduler inverse_sqrt_nowarmup)")
        if cfg.decay_period <= 0:
            raise ValueError(f"--decay-period must be > 0, got {cfg.decay_period}")
        if not 0 <= cfg.warmup_init_lr <= self.peak_lr:
            raise ValueError(f"--warmup-init-lr must be between 0 and --lr {self.peak_lr}, got {cfg.warmup_init_lr}")
        self.decay_period, self.warmup_updates = cfg.decay_period, cfg.warmup_updates
        self.warmup_init_lr = cfg.warmup_init_lr
        self.lr = self.warmup_init_lr
        self.optimizer.set_lr(self.lr)

    def lr_at(self, num_updates):
        return matched_lr(self.peak_lr, self.decay_period, self.warmup_updates, self.warmup_init_lr, num_updates)
