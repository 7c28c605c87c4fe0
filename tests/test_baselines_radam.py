"""--optimizer radam (Liu et al., ICLR 2020): selected by fairseq's parser, steps as in the paper's
Algorithm 2, works through fairseq's FP16Optimizer (flat parameters), trains through fairseq-train."""

import math

import pytest
import torch
from fairseq import optim, options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.optim.lr_scheduler import build_lr_scheduler

from fairseq_tfixup.baselines.radam import FairseqRAdam


FLAGS = ["--optimizer", "radam", "--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-9", "--weight-decay", "0.01",
         "--lr", "1e-2", "--lr-scheduler", "inverse_sqrt_nowarmup"]


def parse(data_dir, *flags):
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser, [str(data_dir), "--task", "translation", "-s", "de", "-t", "en", "--arch", "transformer", *flags])
    return convert_namespace_to_omegaconf(args)


def liu_et_al_radam(params, grads_per_step, lr, betas, eps, weight_decay):
    """Liu et al. (2020), Algorithm 2, written out, with decoupled weight decay and the
    variance-tractable test rho_t > 5 of the authors' code (the paper writes > 4)."""
    beta1, beta2 = betas
    rho_inf = 2 / (1 - beta2) - 1
    params = [p.clone() for p in params]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    for t, grads in enumerate(grads_per_step, start=1):
        rho_t = rho_inf - 2 * t * beta2 ** t / (1 - beta2 ** t)
        for i, g in enumerate(grads):
            params[i] = params[i] * (1 - lr * weight_decay)
            m[i] = beta1 * m[i] + (1 - beta1) * g
            v[i] = beta2 * v[i] + (1 - beta2) * g * g
            m_hat = m[i] / (1 - beta1 ** t)
            if rho_t > 5:
                l_t = math.sqrt(1 - beta2 ** t) / (v[i].sqrt() + eps)
                r_t = math.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
                params[i] = params[i] - lr * r_t * m_hat * l_t
            else:  # SGD with momentum while the adaptive rate's variance is intractable
                params[i] = params[i] - lr * m_hat
    return params


def test_selected_and_configured_by_fairseqs_parser(dict_dir):
    cfg = parse(dict_dir, *FLAGS)
    params = [torch.nn.Parameter(torch.randn(4, 3))]
    optimizer = optim.build_optimizer(cfg.optimizer, params)
    assert isinstance(optimizer, FairseqRAdam)
    assert isinstance(optimizer.optimizer, torch.optim.RAdam)
    group = optimizer.optimizer.param_groups[0]
    assert group["betas"] == (0.9, 0.98) and group["eps"] == 1e-9 and group["weight_decay"] == 0.01
    assert group["decoupled_weight_decay"] is True  # AdamW-style, like the authors' code and fairseq's adam
    # usable with this plugin's schedule: the peak lr from the first update, then lr * sqrt(P / (P + t))
    scheduler = build_lr_scheduler(cfg.lr_scheduler, optimizer)
    assert optimizer.get_lr() == pytest.approx(1e-2)
    scheduler.step_update(12000)
    assert optimizer.get_lr() == pytest.approx(1e-2 * math.sqrt(4000 / 16000))


def test_steps_follow_algorithm_2_and_torch(dict_dir):
    cfg = parse(dict_dir, *FLAGS)
    torch.manual_seed(0)
    start = [torch.randn(6, 5), torch.randn(5)]
    grads = [[torch.randn_like(p) for p in start] for _ in range(12)]  # beta2 = 0.98: rho_t > 5 from t = 6

    params = [torch.nn.Parameter(p.clone()) for p in start]
    fairseq_radam = optim.build_optimizer(cfg.optimizer, params)
    reference = [torch.nn.Parameter(p.clone()) for p in start]
    torch_radam = torch.optim.RAdam(reference, lr=1e-2, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.01,
                                    decoupled_weight_decay=True)
    for step_grads in grads:
        for p, q, g in zip(params, reference, step_grads):
            p.grad, q.grad = g.clone(), g.clone()
        fairseq_radam.step()
        torch_radam.step()
    expected = liu_et_al_radam(start, grads, lr=1e-2, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.01)
    for p, q, e in zip(params, reference, expected):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=0, atol=0)
        torch.testing.assert_close(p.detach(), e, rtol=1e-5, atol=1e-6)
    # and it is not Adam: Adam's first step moves every coordinate by ~lr, RAdam's by lr * |g|
    first = [torch.nn.Parameter(p.clone()) for p in start]
    one_step = optim.build_optimizer(cfg.optimizer, first)
    for p, g in zip(first, grads[0]):
        p.grad = g.clone()
    one_step.step()
    moved = (start[0] * (1 - 1e-2 * 0.01) - first[0].detach()) / 1e-2
    torch.testing.assert_close(moved, grads[0][0], rtol=1e-4, atol=1e-5)  # m_hat = g at t = 1


def test_fp16_optimizer_steps_one_flat_fp32_copy(dict_dir, monkeypatch):
    """fairseq's FP16Optimizer keeps one flat fp32 master copy when the optimizer supports flat params
    (RAdam's update is elementwise); its master weights follow RAdam on the fp32 parameters."""
    cfg = parse(dict_dir, *FLAGS, "--fp16", "--cpu", "--fp16-init-scale", "128")
    # the flat copy is keyed by CUDA device index, which is None for CPU tensors
    monkeypatch.setattr(torch.cuda, "current_device", lambda: None)
    torch.manual_seed(0)
    half = [torch.nn.Parameter(torch.randn(6, 5).half()), torch.nn.Parameter(torch.randn(5).half())]
    initial = half[0].detach().clone()
    fp16 = optim.FP16Optimizer.build_optimizer(cfg, half)
    assert fp16.has_flat_params and isinstance(fp16.fp32_optimizer, FairseqRAdam)
    assert not fp16.fp32_optimizer.supports_memory_efficient_fp16  # its state would follow fp16 params

    reference = [torch.nn.Parameter(p.detach().float()) for p in half]
    torch_radam = torch.optim.RAdam(reference, lr=1e-2, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.01,
                                    decoupled_weight_decay=True)
    for _ in range(10):
        fp16.zero_grad()  # as fairseq's trainer does: also sets the unscaling factor 1 / loss scale
        fp16.backward(sum((p.float() ** 3).sum() for p in half))
        fp16.step()
        torch_radam.zero_grad()
        sum((p.half().float() ** 3).sum() for p in reference).backward()  # the same fp16-rounded inputs
        torch_radam.step()
    master = fp16.fp32_params[None].detach()
    torch.testing.assert_close(master, torch.cat([p.detach().view(-1) for p in reference]), rtol=2e-3, atol=2e-3)
    # the fp16 model weights moved, and are the master weights rounded
    assert not torch.equal(half[0].detach(), initial)
    torch.testing.assert_close(half[0].detach(), master[:30].view(6, 5).half(), rtol=0, atol=0)
