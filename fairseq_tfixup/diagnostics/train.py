"""A minimal fairseq-train loop for the training-time diagnostics.

It does what ``fairseq.trainer.Trainer.train_step`` does for one CPU/GPU worker with no
mixed precision: criterion forward, backward of the summed loss, gradients divided by
the sample size (so they are those of the mean token loss), optional clipping, optimizer
step, then the scheduler's ``step_update``. Optimizer and scheduler are fairseq's own,
built from the same flags as fairseq-train, so any ``--optimizer``/``--lr-scheduler`` works.
Callbacks see the model right after the backward pass and right after the update.
"""

import dataclasses
import time
from typing import Callable, Iterable, Sequence

import torch

from fairseq_tfixup.diagnostics import data
from fairseq_tfixup import presets
from fairseq_tfixup.diagnostics.models import ModelSpec, build


class Recorder:
    """Override what you need. ``step`` counts from 1."""

    def attach(self, model, task) -> None: ...

    def before_forward(self, step: int, sample) -> None: ...

    def after_backward(self, step: int, model) -> None: ...

    def after_update(self, step: int, model) -> None: ...

    def detach(self) -> None: ...


def build_optimizer(args, model):
    from fairseq import optim
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.optim import lr_scheduler

    cfg = convert_namespace_to_omegaconf(args)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = optim.build_optimizer(cfg.optimizer, params)
    scheduler = lr_scheduler.build_lr_scheduler(cfg.lr_scheduler, optimizer)
    scheduler.step_update(0)  # as Trainer does before the first update
    return cfg, optimizer, scheduler


def train(data_bin, spec: ModelSpec, schedule: str, steps: int, recorders: Sequence[Recorder],
          warmup_updates: int = 4000, split: str = "train", seed: int = 1, device: str = "cpu",
          log: Callable[[str], None] = print) -> dict:
    """Train ``steps`` updates from a fresh seeded model; returns per-step loss and lr."""
    spec = dataclasses.replace(spec, extra=list(spec.extra))
    args, task, model, criterion = build(data_bin, spec, seed=seed, device=device,
                                         extra_flags=presets.schedule_flags(schedule, warmup_updates))
    cfg, optimizer, scheduler = build_optimizer(args, model)
    batches: Iterable = data.training_batches(task, args, split=split, seed=seed, device=device)
    for r in recorders:
        r.attach(model, task)
    losses, lrs = [], []
    t0 = time.time()
    model.train()
    try:
        for step in range(1, steps + 1):
            sample = next(batches)
            for r in recorders:
                r.before_forward(step, sample)
            optimizer.zero_grad()
            loss, sample_size, _ = criterion(model, sample)
            optimizer.backward(loss)
            optimizer.multiply_grads(1.0 / float(sample_size))
            optimizer.clip_grad_norm(cfg.optimization.clip_norm)
            for r in recorders:
                r.after_backward(step, model)
            lrs.append(optimizer.get_lr())
            optimizer.step()
            scheduler.step_update(step)
            for r in recorders:
                r.after_update(step, model)
            losses.append(loss.item() / float(sample_size))
            if not torch.isfinite(loss):
                log(f"  step {step}: loss is {loss.item()}; stopping")
                break
            if step % 10 == 0 or step == steps:
                log(f"  {spec.model}/{schedule} step {step}/{steps}: loss {losses[-1]:.3f} "
                    f"lr {lrs[-1]:.2e} ({time.time() - t0:.0f} s)")
    finally:
        for r in recorders:
            r.detach()
    return {"loss": losses, "lr": lrs}
