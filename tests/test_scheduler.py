"""inverse_sqrt_nowarmup and inverse_sqrt_matched through fairseq's own optimizer and scheduler builders."""

import math

import pytest
import torch
from fairseq import optim, options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.optim import lr_scheduler

import fairseq_tfixup  # noqa: F401  (registers the scheduler)


def _build(*flags, scheduler="inverse_sqrt_nowarmup"):
    """fairseq's optimizer and ``scheduler`` built from fairseq-train flags, as fairseq-train builds them."""
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        "unused", "--arch", "transformer_tfixup", "--optimizer", "adam", "--lr", "5e-4",
        "--lr-scheduler", scheduler, *flags,
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


def _build_matched(*flags):
    return _build(*flags, scheduler="inverse_sqrt_matched")


def test_matched_warms_up_onto_the_nowarmup_curve_and_then_equals_it():
    sched, optimizer = _build_matched("--warmup-updates", "200", "--decay-period", "4000", "--warmup-init-lr", "1e-7")
    assert optimizer.get_lr() == pytest.approx(1e-7)  # before the first update
    at_w = 5e-4 * math.sqrt(4000 / 4200)
    assert sched.step_update(0) == pytest.approx(1e-7)
    assert sched.step_update(100) == pytest.approx(1e-7 + (at_w - 1e-7) / 2)  # linear
    assert sched.step_update(200) == pytest.approx(at_w)  # t = W: on the curve, no jump
    nowarmup, _ = _build("--decay-period", "4000")
    for t in (200, 201, 800, 4200, 12000):  # t = W + P and beyond: T-Fixup's rate at the same update
        assert sched.step_update(t) == pytest.approx(nowarmup.step_update(t), rel=1e-12)
    assert sched.step_update(4200) == pytest.approx(5e-4 * math.sqrt(4000 / 8200))


def test_matched_rate_depends_only_on_the_update_count():
    walked, _ = _build_matched("--warmup-updates", "50", "--decay-period", "100")
    for t in range(1, 131):
        walked.step_update(t)
    jumped, optimizer = _build_matched("--warmup-updates", "50", "--decay-period", "100")
    assert jumped.step_update(130) == pytest.approx(walked.lr)
    assert optimizer.get_lr() == pytest.approx(5e-4 * math.sqrt(100 / 230))
    assert jumped.step_update(25) == pytest.approx(walked.step_update(25))  # inside the warmup too


@pytest.mark.parametrize("flags, message", [
    (["--warmup-updates", "0"], "inverse_sqrt_matched needs --warmup-updates > 0, got 0"),
    (["--decay-period", "0"], "--decay-period must be > 0, got 0"),
    (["--lr", "0"], "inverse_sqrt_matched needs --lr > 0, got 0.0"),
    (["--warmup-init-lr", "1e-3"], "--warmup-init-lr must be between 0 and --lr 0.0005, got 0.001"),
])
def test_matched_bad_flags(flags, message):
    with pytest.raises(ValueError, match=message) as err:
        _build_matched(*flags)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("kind,flags", [
    ("nowarmup", ("--lr-scheduler", "inverse_sqrt_nowarmup", "--decay-period", "4000")),
    ("matched", ("--lr-scheduler", "inverse_sqrt_matched", "--warmup-updates", "200", "--decay-period", "4000")),
    ("warmup", ("--lr-scheduler", "inverse_sqrt", "--warmup-updates", "200", "--warmup-init-lr", "1e-7")),
])
def test_the_pure_formulas_are_the_schedulers_rates(kind, flags):
    """tfixup/schedules.py (what the studies' reports average) gives fairseq's scheduler's rate at every update,
    fairseq's own inverse_sqrt included; update k of a run takes the rate after k - 1 updates."""
    from tfixup import schedules

    sched, optimizer = _build(*flags[2:], scheduler=flags[1])
    rates = [optimizer.get_lr()] + [sched.step_update(t) for t in range(1, 800)]
    expected = [schedules.lr_at(kind, 5e-4, t, warmup_updates=200, decay_period=4000) for t in range(800)]
    assert rates == pytest.approx(expected, rel=1e-9, abs=1e-15)
    assert schedules.mean_lr(kind, 5e-4, 800, 200, 4000) == pytest.approx(sum(rates) / 800, rel=1e-12)


def test_mean_lr_of_the_studies_schedules():
    """The matched warmup gives up about W/2 updates at the peak rate against no warmup."""
    from tfixup import schedules

    full = schedules.mean_lr("nowarmup", 1.0, 800, 200, 4000)
    matched = schedules.mean_lr("matched", 1.0, 800, 200, 4000)
    assert (full - matched) * 800 == pytest.approx(100, rel=0.05)
    assert round(schedules.mean_lr("warmup", 1.0, 800, 200, 4000), 2) == 0.62 and round(full, 2) == 0.95
    with pytest.raises(ValueError, match="unknown schedule"):
        schedules.lr_at("cosine", 1.0, 3)
    with pytest.raises(ValueError, match="updates >= 1"):
        schedules.mean_lr("nowarmup", 1.0, 0)
