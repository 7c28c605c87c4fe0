"""Training for the training-time diagnostics: fairseq-train's own ``Trainer``, watched by recorders.

The model, task, criterion, optimizer and scheduler are fairseq's, built from the same flags as
fairseq-train (``models.ModelSpec.flags``), and each update is ``Trainer.train_step``: so any
``--optimizer``/``--lr-scheduler`` works and the update is exactly fairseq-train's. Recorders see the
batch before the forward pass, the gradients once they are final (summed, divided by the sample size,
clipped) and the model after the update. The gradients are seen through fairseq's own hook for that
moment, the task's ``optimizer_step``, which ``Trainer.train_step`` calls just before the optimizer steps.
"""

import time
from typing import Callable, Iterable, Sequence

from fairseq_tfixup.diagnostics import data
from fairseq_tfixup.diagnostics.models import ModelSpec, parse_train_args


class Recorder:
    """Override what you need. ``step`` counts from 1."""

    def attach(self, model, task) -> None: ...

    def before_forward(self, step: int, sample) -> None: ...

    def after_backward(self, step: int, model) -> None: ...

    def after_update(self, step: int, model) -> None: ...

    def detach(self) -> None: ...


def build_trainer(data_bin, flags: Sequence[str]):
    """(cfg, task, trainer) as fairseq_cli/train.py's main() builds them (seeded from --seed), the trainer
    at the start of epoch 1 as fairseq-train's first update finds it."""
    import numpy as np
    from fairseq import tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    cfg = convert_namespace_to_omegaconf(parse_train_args(data_bin, flags))
    np.random.seed(cfg.common.seed)
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    trainer = Trainer(cfg, task, task.build_model(cfg.model), task.build_criterion(cfg.criterion))
    trainer.begin_epoch(1)
    return cfg, task, trainer


def train(data_bin, spec: ModelSpec, schedule: str, steps: int, recorders: Sequence[Recorder],
          warmup_updates: int = 4000, split: str = "train", seed: int = 1, device: str = "cpu",
          log: Callable[[str], None] = print) -> dict:
    """Train ``steps`` updates from a fresh seeded model; returns per-step loss (bits per token, as
    fairseq logs it) and lr."""
    cfg, task, trainer = build_trainer(data_bin, [*spec.flags(schedule, warmup_updates, cpu=device == "cpu"),
                                                  "--seed", str(seed)])
    losses, lrs = [], []
    fairseq_step = task.optimizer_step

    def optimizer_step(optimizer, model, update_num):
        for r in recorders:
            r.after_backward(update_num + 1, model)
        lrs.append(optimizer.get_lr())
        return fairseq_step(optimizer, model, update_num)

    task.optimizer_step = optimizer_step
    from fairseq import utils

    max_positions = utils.resolve_max_positions(task.max_positions(), trainer.model.max_positions())
    batches: Iterable = data.training_batches(task, cfg.dataset.max_tokens, cfg.dataset.batch_size, max_positions,
                                              split=split, seed=seed)
    for r in recorders:
        r.attach(trainer.model, task)
    t0 = time.time()
    try:
        for step in range(1, steps + 1):
            sample = next(batches)
            for r in recorders:
                r.before_forward(step, sample)
            try:
                stats = trainer.train_step([sample])
            except FloatingPointError as e:  # fairseq's "gradients are Nan/Inf"
                log(f"  step {step}: {e}; stopping")
                break
            for r in recorders:
                r.after_update(step, trainer.model)
            losses.append(float(stats["loss"]))
            if step % 10 == 0 or step == steps:
                log(f"  {spec.model}/{schedule} step {step}/{steps}: loss {losses[-1]:.3f} bits "
                    f"lr {lrs[-1]:.2e} ({time.time() - t0:.0f} s)")
    finally:
        for r in recorders:
            r.detach()
    return {"loss": losses, "lr": lrs}
