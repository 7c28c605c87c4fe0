"""--optimizer giadam (Kalra & Barkeshli, 2024): fairseq's Adam with the second moment started at the first
gradient squared; selected by fairseq's parser with adam's flags; its steps written out; a resumed optimizer
keeps its moments. (A fairseq-train run: tests/test_methods.py, as for every row.)"""

import math

import pytest
import torch
from fairseq import optim

from fairseq_tfixup.baselines.giadam import FairseqGIAdam, GIAdam

from test_baselines_radam import parse

FLAGS = ["--optimizer", "giadam", "--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-9", "--weight-decay", "0.01",
         "--lr", "1e-2", "--lr-scheduler", "inverse_sqrt_nowarmup"]


def gi_adam(params, grads_per_step, lr, betas, eps, weight_decay):
    """Adam as fairseq computes it (bias corrections folded into the step size, eps outside the root,
    decoupled weight decay), with v_0 = g_1^2 where Adam has 0."""
    beta1, beta2 = betas
    params = [p.clone() for p in params]
    m = [torch.zeros_like(p) for p in params]
    v = [g * g for g in grads_per_step[0]]
    for t, grads in enumerate(grads_per_step, start=1):
        for i, g in enumerate(grads):
            m[i] = beta1 * m[i] + (1 - beta1) * g
            v[i] = beta2 * v[i] + (1 - beta2) * g * g
            step = lr * math.sqrt(1 - beta2 ** t) / (1 - beta1 ** t)
            params[i] = params[i] * (1 - lr * weight_decay) - step * m[i] / (v[i].sqrt() + eps)
    return params


def test_selected_and_configured_by_fairseqs_parser(dict_dir):
    optimizer = optim.build_optimizer(parse(dict_dir, *FLAGS).optimizer, [torch.nn.Parameter(torch.randn(4, 3))])
    assert isinstance(optimizer, FairseqGIAdam) and isinstance(optimizer.optimizer, GIAdam)
    group = optimizer.optimizer.param_groups[0]
    assert group["betas"] == (0.9, 0.98) and group["eps"] == 1e-9 and group["weight_decay"] == 0.01
    assert optimizer.supports_flat_params


def test_steps_are_adams_with_v0_the_first_gradient_squared(dict_dir):
    torch.manual_seed(0)
    start = [torch.randn(6, 5), torch.randn(5)]
    grads = [[torch.randn_like(p) for p in start] for _ in range(8)]
    params = [torch.nn.Parameter(p.clone()) for p in start]
    giadam = optim.build_optimizer(parse(dict_dir, *FLAGS).optimizer, params)
    for step, step_grads in enumerate(grads):
        for p, g in zip(params, step_grads):
            p.grad = g.clone()
        giadam.step()
        if step == 0:  # the first update: lr sqrt(1 - beta2) sign(g) (plus the decay), Adam's is lr sign(g)
            moved = (start[0] * (1 - 1e-2 * 0.01) - params[0].detach()) / 1e-2
            torch.testing.assert_close(moved, math.sqrt(1 - 0.98) * grads[0][0].sign(), rtol=0, atol=1e-4)
    expected = gi_adam(start, grads, lr=1e-2, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.01)
    for p, e in zip(params, expected):
        torch.testing.assert_close(p.detach(), e, rtol=1e-5, atol=1e-6)


def test_a_resumed_optimizer_keeps_its_moments(dict_dir):
    cfg = parse(dict_dir, *FLAGS).optimizer
    params = [torch.nn.Parameter(torch.randn(4))]
    first = optim.build_optimizer(cfg, params)
    for g in (torch.ones(4), 2 * torch.ones(4)):
        params[0].grad = g
        first.step()
    saved = first.state_dict()
    again = optim.build_optimizer(cfg, params)
    again.load_state_dict(saved)
    params[0].grad = 3 * torch.ones(4)
    again.step()  # its v continues from the saved one, not from 3 ** 2
    v = again.optimizer.state[params[0]]["exp_avg_sq"]
    assert v == pytest.approx(torch.full((4,), 0.98 * (0.98 * 1 + 0.02 * 4) + 0.02 * 9))
