"""inverse_sqrt_nowarmup through fairseq's own optimizer and scheduler builders."""

import math

import pytest
import torch
from fairseq import optim, options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.optim import lr_scheduler

import fairseq_tfixup  # noqa: F401  (registers the scheduler)


def _build(*flags):
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        "unused", "--arch", "transformer_tfixup", "--optimizer", "adam", "--lr", "5e-4",
        "--lr-scheduler", "inverse_sqrt_nowarmup", *flags,
    ])
    cfg = convert_namespace_to_omegaconf(args)
    params = [torch.nn.Parameter(torch.zeros(3))]
    optimizer = optim.build_optimizer(cfg.optimizer, params)
    return lr_scheduler.build_lr_scheduler(cfg.lr_scheduler, optimizer), optimizer


def test_values_at_0_P_3P():
    sched, optimizer = _build("--decay-period", "4000")
    assert optimizer.get_lr() == pytest.approx(5e-4)  # no warmup: the peak from the first update
    assert sched.step_update(0) == pytest.approx(5e-4)
    assert sched.step_update(4000) == pytest.approx(5e-4 / math.sqrt(2))
    assert sched.step_update(12000) == pytest.approx(5e-4 / 2)
    assert optimizer.get_lr() == pytest.approx(5e-4 / 2)
    sched.step(epoch=3)  # epoch boundaries leave it alone
    assert optimizer.get_lr() == pytest.approx(5e-4 / 2)


def test_default_decay_period_is_the_papers_4000():
    sched, _ = _build()
    assert sched.decay_period == 4000
    assert sched.step_update(4000) == pytest.approx(5e-4 / math.sqrt(2))


def test_rate_depends_only_on_the_update_count():
    """What makes a resume exact: after loading checkpoint_last.pt fairseq calls
    step_update(num_updates) on a fresh scheduler, which must land where the uninterrupted
    one is, with no history."""
    walked, _ = _build("--decay-period", "100")
    for t in range(1, 251):
        walked.step_update(t)
    jumped, optimizer = _build("--decay-period", "100")
    assert jumped.step_update(250) == pytest.approx(walked.lr)
    assert optimizer.get_lr() == pytest.approx(5e-4 * math.sqrt(100 / 350))
    assert walked.step_update(0) == pytest.approx(5e-4)  # and back


@pytest.mark.parametrize("flags, message", [
    (["--warmup-updates", "4000"], "inverse_sqrt_nowarmup has no warmup: drop --warmup-updates 4000"),
    (["--decay-period", "0"], "--decay-period must be > 0, got 0"),
    (["--lr", "0"], "inverse_sqrt_nowarmup needs --lr > 0, got 0.0"),
    (["--lr=-1e-3"], "inverse_sqrt_nowarmup needs --lr > 0, got -0.001"),
])
def test_bad_flags(flags, message):
    with pytest.raises(ValueError, match=message) as err:
        _build(*flags)
    assert "\n" not in str(err.value)
