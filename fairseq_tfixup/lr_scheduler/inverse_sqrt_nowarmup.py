"""``inverse_sqrt_nowarmup``: lr_t = lr * sqrt(P / (P + t)), no warmup.

The schedule the T-Fixup authors trained with. It starts at the peak ``--lr``
and halves every time t grows by a factor 4 of (P + t): lr/sqrt(2) at t = P,
lr/2 at t = 3P. fairseq's ``inverse_sqrt`` cannot do this: it divides by
``--warmup-updates`` and so fails at 0.

The rate is a pure function of the update count, so a resumed run (fairseq
calls ``step_update(num_updates)`` after loading ``checkpoint_last.pt``)
continues exactly where it stopped.
"""

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import List

from omegaconf import II

from fairseq.dataclass import FairseqDataclass
from fairseq.optim.lr_scheduler import FairseqLRScheduler, register_lr_scheduler

from tfixup.schedules import nowarmup_lr  # noqa: F401  (the formula, plain Python; imported from here too)


def single_lr(lr, scheduler: str) -> float:
    """The one --lr a scheduler of ours takes (fairseq keeps --lr as a list), checked > 0."""
    if isinstance(lr, Collection) and len(lr) > 1:
        raise ValueError(f"{scheduler} takes a single --lr, got " + ",".join(map(str, lr)))
    peak = lr[0] if isinstance(lr, Collection) else lr
    if peak <= 0:
        raise ValueError(f"{scheduler} needs --lr > 0, got {peak}")
    return peak


class UpdateSchedule(FairseqLRScheduler):
    """A rate that is a function of the update count alone (``lr_at``): set at every update, kept at
    epoch boundaries, so a resumed run continues exactly where it stopped."""

    def lr_at(self, num_updates: int) -> float:
        raise NotImplementedError

    def step(self, epoch, val_loss=None):
        """The rate only moves with updates, not at epoch boundaries."""
        super().step(epoch, val_loss)
        return self.optimizer.get_lr()

    def step_update(self, num_updates):
        self.lr = self.lr_at(num_updates)
        self.optimizer.set_lr(self.lr)
        return self.lr


@dataclass
class InverseSqrtNoWarmupConfig(FairseqDataclass):
    decay_period: int = field(
        default=4000,
        metadata={"help": "P in lr * sqrt(P / (P + t)): the lr falls by 1/sqrt(2) after P updates"},
    )
    warmup_updates: int = field(
        default=0,
        metadata={"help": "must stay 0: this schedule has no warmup (the flag exists to catch its use)"},
    )
    lr: List[float] = II("optimization.lr")


@register_lr_scheduler("inverse_sqrt_nowarmup", dataclass=InverseSqrtNoWarmupConfig)
class InverseSqrtNoWarmupSchedule(UpdateSchedule):
    """Decay the learning rate as lr * sqrt(P / (P + t)) from the first update."""

    def __init__(self, cfg: InverseSqrtNoWarmupConfig, optimizer):
        super().__init__(cfg, optimizer)
        if cfg.warmup_updates > 0:
            raise ValueError(
                f"inverse_sqrt_nowarmup has no warmup: drop --warmup-updates {cfg.warmup_updates} "
                "(or use --lr-scheduler inverse_sqrt for a warmup baseline)"
            )
        if cfg.decay_period <= 0:
            raise ValueError(f"--decay-period must be > 0, got {cfg.decay_period}")
        self.peak_lr = single_lr(cfg.lr, "inverse_sqrt_nowarmup")
        self.decay_period = cfg.decay_period
        self.lr = self.peak_lr
        self.optimizer.set_lr(self.lr)

    def lr_at(self, num_updates):
        return nowarmup_lr(self.peak_lr, self.decay_period, num_updates)
