"""Training speed and peak memory: ``transformer_tfixup`` vs stock ``transformer``, same dims.

A training step is what fairseq-train does per update, without its bookkeeping:
label-smoothed cross-entropy forward, backward, Adam step, on real IWSLT'14
batches (the same batches, in the same order, for both models). Both models
live in one process and are timed in alternating blocks (A B, B A, A B, ...),
so that drifts of a shared machine hit both alike; the ratio is T-Fixup / stock.

Peak memory:
  CPU  each (size, model) runs in a fresh subprocess; peak = the rise of the
       process's peak RSS (VmHWM, reset just before training) over the training steps, i.e.
       activations + gradients + Adam state + allocator slack on top of the
       built model and the loaded data.
  CUDA torch.cuda.max_memory_allocated during a block minus what was allocated
       before it (gradients + activations + optimizer transients), plus the
       static allocation of weights and Adam state.

FLOPs per step are counted by torch.utils.flop_counter on the real batches;
model FLOP utilisation (MFU) = achieved FLOP/s / peak FLOP/s of the device,
given by --peak-tflops or a small table of known GPUs (none for CPUs).

    python -m bench.speed --quick --out /tmp/speed
    python -m bench.speed --out results/bench                               # CPU, small + base
    python -m bench.speed --device cuda --sizes small base big --dtypes fp32 fp16 bf16 --out DIR
"""

import argparse
import json
import pathlib
import resource
import statistics
import subprocess
import sys
import time

from bench import common

# name -> (embed, ffn, heads, layers per side); dropout 0.1 for all (stock big would use 0.3)
SIZES = {
    "tiny": (64, 128, 2, 2),
    "small": (512, 1024, 4, 6),  # transformer_iwslt_de_en
    "base": (512, 2048, 8, 6),  # transformer (wmt_en_de)
    "big": (1024, 4096, 16, 6),  # transformer_vaswani_wmt_en_de_big
}
# name -> method of fairseq_tfixup/presets.py
MODELS = {"tfixup": "tfixup", "stock": "postln"}

# dense peak TFLOP/s (no sparsity) of GPUs we may be lent; matched by substring of the device name
PEAK_TFLOPS = {
    "H200": {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},
    "H100": {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},
    "A100": {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},
}

MODES = {
    "smoke": dict(sizes=["tiny"], rounds=2, steps=2, warmup=1, max_tokens=512, batches=4),
    "quick": dict(sizes=["small"], rounds=2, steps=2, warmup=1, max_tokens=1024, batches=4),
    "default": dict(sizes=["small", "base"], rounds=4, steps=2, warmup=1, max_tokens=1024, batches=8),
}


def build(model: str, size: str, data: pathlib.Path, max_tokens: int, device: str):
    """(task, model, criterion) through fairseq's own parser, as fairseq-train builds them."""
    from fairseq_tfixup import presets

    embed, ffn, heads, layers = SIZES[size]
    flags = [*presets.model_flags(MODELS[model]), *presets.dims_flags(embed, ffn, heads, layers, layers),
             "--share-decoder-input-output-embed", "--dropout", "0.1",
             "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
             "--max-tokens", str(max_tokens), *(["--cpu"] if device == "cpu" else [])]
    _, task, net, criterion = presets.build(data, flags, seed=1, device=device)
    return task, net, criterion


def real_batches(task, net, n: int, max_tokens: int, device: str) -> list:
    from fairseq import utils

    task.load_dataset("train")
    itr = task.get_batch_iterator(
        dataset=task.dataset("train"), max_tokens=max_tokens,
        max_positions=utils.resolve_max_positions(task.max_positions(), net.max_positions()), seed=1,
    ).next_epoch_itr(shuffle=True)
    batches = []
    for sample in itr:
        batches.append(utils.move_to_cuda(sample) if device == "cuda" else sample)
        if len(batches) == n:
            break
    return batches


class Trainer:
    """One model's training step: forward + label-smoothed loss, backward, Adam."""

    def __init__(self, net, criterion, device: str, dtype: str, lr: float = 5e-4):
        import torch

        self.net, self.criterion, self.device = net, criterion, device
        self.opt = torch.optim.Adam(net.parameters(), lr=lr, betas=(0.9, 0.98))
        self.amp = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(dtype)
        self.scaler = torch.amp.GradScaler("cuda") if dtype == "fp16" else None

    def step(self, sample) -> None:
        import torch

        self.net.train()
        with torch.autocast(self.device, dtype=self.amp or torch.float32, enabled=self.amp is not None):
            loss, _, _ = self.criterion(self.net, sample)
        if self.scaler:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            loss.backward()
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def flops(self, sample) -> int:
        """FLOPs of one step's forward and backward on this batch (Adam's elementwise work not counted)."""
        from torch.utils.flop_counter import FlopCounterMode

        counter = FlopCounterMode(display=False)
        self.net.train()
        import torch

        with counter, torch.autocast(self.device, dtype=self.amp or torch.float32, enabled=self.amp is not None):
            loss, _, _ = self.criterion(self.net, sample)
        with counter:
            loss.backward()
        self.opt.zero_grad(set_to_none=True)
        return counter.get_total_flops()


def sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def ab_speed(size: str, dtype: str, data: pathlib.Path, cfg: dict, device: str, peak_tflops: float) -> dict:
    """Alternating A/B timing of both models on the same batches; tokens/s, FLOP/s, CUDA memory."""
    import torch

    torch.manual_seed(1)
    built = {m: build(m, size, data, cfg["max_tokens"], device) for m in MODELS}
    task, net0, _ = built["tfixup"]
    batches = real_batches(task, net0, cfg["batches"], cfg["max_tokens"], device)
    trainers = {m: Trainer(net, crit, device, dtype) for m, (_, net, crit) in built.items()}
    params = {m: sum(p.numel() for p in net.parameters()) for m, (_, net, _) in built.items()}
    flops = {m: [trainers[m].flops(b) for b in batches] for m in MODELS}
    times = {m: [] for m in MODELS}
    toks = {m: [] for m in MODELS}
    mem = {m: [] for m in MODELS}
    cursor = 0
    # warm-up blocks are not timed (allocator, first-call kernels)
    for m in MODELS:
        for i in range(cfg["warmup"]):
            trainers[m].step(batches[i % len(batches)])
    sync(device)
    for r in range(cfg["rounds"]):
        order = list(MODELS) if r % 2 == 0 else list(MODELS)[::-1]
        block = [batches[(cursor + i) % len(batches)] for i in range(cfg["steps"])]
        idx = [(cursor + i) % len(batches) for i in range(cfg["steps"])]
        cursor += cfg["steps"]
        for m in order:
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
                before = torch.cuda.memory_allocated()
            t0 = time.perf_counter()
            for b in block:
                trainers[m].step(b)
            sync(device)
            times[m].append(time.perf_counter() - t0)
            toks[m].append(sum(int(b["ntokens"]) for b in block))
            flops[m + "_timed"] = flops.get(m + "_timed", 0) + sum(flops[m][i] for i in idx)
            if device == "cuda":
                mem[m].append(torch.cuda.max_memory_allocated() - before)
        common.log(f"  {size} {dtype} round {r + 1}/{cfg['rounds']}: "
                   + ", ".join(f"{m} {toks[m][-1] / times[m][-1]:.0f} tok/s" for m in MODELS))
    out = {"size": size, "dims": "%d-%d-%d, %d+%d layers" % (SIZES[size][:3] + SIZES[size][3:] * 2),
           "dtype": dtype, "device": device}
    for m in MODELS:
        tps = sum(toks[m]) / sum(times[m])
        achieved = flops[m + "_timed"] / sum(times[m])
        out[m] = {
            "params": params[m], "tokens_per_s": tps, "s_per_step": sum(times[m]) / (cfg["rounds"] * cfg["steps"]),
            "gflop_per_step": statistics.mean(flops[m]) / 1e9, "achieved_tflops": achieved / 1e12,
            "mfu": achieved / (peak_tflops * 1e12) if peak_tflops else None,
            "cuda_step_peak_mib": max(mem[m]) / 2**20 if mem[m] else None,
        }
    per_round = [(toks["tfixup"][i] / times["tfixup"][i]) / (toks["stock"][i] / times["stock"][i])
                 for i in range(cfg["rounds"])]
    out["ratio_tokens_per_s"] = out["tfixup"]["tokens_per_s"] / out["stock"]["tokens_per_s"]
    out["ratio_per_round"] = {"median": statistics.median(per_round), "min": min(per_round), "max": max(per_round)}
    if device == "cuda":
        out["ratio_cuda_step_peak"] = out["tfixup"]["cuda_step_peak_mib"] / out["stock"]["cuda_step_peak_mib"]
    del trainers, built
    return out


def _status_kib(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def memory_worker(args) -> None:
    """Run in a fresh process: build, load batches, then train; print the peak-RSS rise as JSON.

    Linux: writing 5 to /proc/self/clear_refs resets the peak RSS (VmHWM) to the current RSS, so
    transient peaks of building and data loading do not hide the training peak. Elsewhere fall
    back to getrusage's max RSS, which cannot be reset."""
    import gc

    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    task, net, crit = build(args.model, args.size, pathlib.Path(args.data), args.max_tokens, "cpu")
    batches = real_batches(task, net, args.steps, args.max_tokens, "cpu")
    trainer = Trainer(net, crit, "cpu", "fp32")
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before, how = _status_kib("VmRSS"), "VmHWM after clear_refs"
    except OSError:
        before, how = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "ru_maxrss"
    for b in batches:
        trainer.step(b)
    after = _status_kib("VmHWM") if how.startswith("VmHWM") else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"rss_before_kib": before, "rss_peak_kib": after, "steps": len(batches), "method": how,
                      "params": sum(p.numel() for p in net.parameters())}))


def cpu_memory(size: str, data: pathlib.Path, cfg: dict, threads: int) -> dict:
    out = {}
    for m in MODELS:
        cmd = [sys.executable, "-m", "bench.speed", "--memory-worker", "--model", m, "--size", size,
               "--data", str(data), "--max-tokens", str(cfg["max_tokens"]), "--steps", str(cfg["batches"]),
               "--threads", str(threads), "--out", "-"]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=common.REPO,
                              env={**__import__("os").environ, "OMP_NUM_THREADS": str(threads),
                                   "PYTHONWARNINGS": "ignore"})
        if proc.returncode != 0:
            common.die(f"memory worker failed for {m} {size}: {proc.stderr.strip().splitlines()[-1:]}")
        rec = json.loads(proc.stdout.strip().splitlines()[-1])
        rec["train_peak_mib"] = (rec["rss_peak_kib"] - rec["rss_before_kib"]) / 1024
        out[m] = rec
        common.log(f"  memory {size} {m}: +{rec['train_peak_mib']:.0f} MiB over {rec['rss_before_kib'] / 1024:.0f} MiB")
    out["ratio_train_peak"] = out["tfixup"]["train_peak_mib"] / out["stock"]["train_peak_mib"]
    return out


def peak_for(device: str, dtype: str, override: float):
    if override:
        return override
    if device != "cuda":
        return None
    import torch

    name = torch.cuda.get_device_name(0)
    for key, table in PEAK_TFLOPS.items():
        if key in name:
            return table.get(dtype)
    return None


def run(args, cfg) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        common.die("--device cuda: no CUDA device visible to torch")
    data = common.prepare_data(300, 200, args.data, args.data_root)
    results = []
    for size in cfg["sizes"]:
        for dtype in cfg["dtypes"]:
            if args.device == "cpu" and dtype != "fp32":
                common.die(f"--dtypes {dtype} needs --device cuda (CPU runs fp32)")
            common.log(f"speed {size} {dtype} on {args.device}")
            rec = ab_speed(size, dtype, data, cfg, args.device, peak_for(args.device, dtype, args.peak_tflops))
            if args.device == "cpu":
                rec["cpu_memory"] = cpu_memory(size, data, cfg, args.threads)
            results.append(rec)
    return {
        "benchmark": "speed", "mode": args.mode, "command": common.command_line(), "machine": common.machine(),
        "data": common.data_description(data), "data_counts": common.data_counts(data), "threads": args.threads,
        "config": {**cfg, "device": args.device, "step": "label-smoothed CE forward + backward + torch Adam",
                   "tokens": "target tokens (fairseq's wps)"},
        "results": results,
    }


def report(result: dict) -> str:
    cfg = result["config"]
    rows = []
    for r in result["results"]:
        t, s = r["tfixup"], r["stock"]
        mem = r.get("cpu_memory")
        rows.append([r["size"], r["dims"], r["dtype"], f"{t['params'] / 1e6:.2f}M / {s['params'] / 1e6:.2f}M",
                     t["tokens_per_s"], s["tokens_per_s"], f"{r['ratio_tokens_per_s']:.3f}",
                     f"{r['ratio_per_round']['median']:.3f} ({r['ratio_per_round']['min']:.3f}-"
                     f"{r['ratio_per_round']['max']:.3f})",
                     mem["tfixup"]["train_peak_mib"] if mem else t["cuda_step_peak_mib"],
                     mem["stock"]["train_peak_mib"] if mem else s["cuda_step_peak_mib"],
                     f"{(mem['ratio_train_peak'] if mem else r['ratio_cuda_step_peak']):.3f}",
                     f"{t['gflop_per_step']:.1f} / {s['gflop_per_step']:.1f}",
                     f"{t['achieved_tflops'] * 1e3:.1f} / {s['achieved_tflops'] * 1e3:.1f}",
                     f"{t['mfu']:.3f} / {s['mfu']:.3f}" if t["mfu"] is not None else "n/a"])
    device = cfg["device"]
    memnote = ("peak memory = rise of peak RSS (VmHWM, reset before training) over the training steps, "
               "fresh process per model" if device == "cpu"
               else "peak memory = torch.cuda.max_memory_allocated during a block minus allocation before it")
    return (
        common.header_md(f"Training speed and peak memory: T-Fixup vs stock Transformer ({device})", result)
        + f"Step = {cfg['step']}; same {cfg['batches']} real batches (max-tokens {cfg['max_tokens']}) for both; "
        f"{cfg['rounds']} alternating rounds of {cfg['steps']} steps after {cfg['warmup']} warm-up steps each. "
        f"tokens/s = {cfg['tokens']}; {memnote}. Ratios are T-Fixup / stock; 'ratio tok/s' is over all "
        f"timed steps, the per-round median is robust to a burst of load from other processes during one block.\n\n"
        + common.md_table(["size", "dims", "dtype", "params T-Fixup / stock", "T-Fixup tok/s", "stock tok/s",
                           "ratio tok/s", "per-round ratio: median (range)", "T-Fixup peak MiB", "stock peak MiB", "ratio memory",
                           "GFLOP/step", "GFLOP/s", "MFU"], rows)
        + "\n"
    )


def plot(result: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rs = result["results"]
    labels = [f"{r['size']} {r['dtype']}" for r in rs]
    x = range(len(rs))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    w = 0.38
    axes[0].bar([i - w / 2 for i in x], [r["tfixup"]["tokens_per_s"] for r in rs], w, color="C3", label="T-Fixup")
    axes[0].bar([i + w / 2 for i in x], [r["stock"]["tokens_per_s"] for r in rs], w, color="C0", label="stock Post-LN")
    axes[0].set_ylabel("target tokens / s (training step)")

    def mem(r, m):
        return r["cpu_memory"][m]["train_peak_mib"] if "cpu_memory" in r else r[m]["cuda_step_peak_mib"]

    axes[1].bar([i - w / 2 for i in x], [mem(r, "tfixup") for r in rs], w, color="C3", label="T-Fixup")
    axes[1].bar([i + w / 2 for i in x], [mem(r, "stock") for r in rs], w, color="C0", label="stock Post-LN")
    axes[1].set_ylabel("training peak memory (MiB)")
    for ax in axes:
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    for i, r in enumerate(rs):
        axes[0].annotate(f"x{r['ratio_tokens_per_s']:.2f}", (i, r["tfixup"]["tokens_per_s"]), ha="center",
                         va="bottom", fontsize=8)
    fig.suptitle(f"T-Fixup vs stock Transformer, {result['config']['device']}, {result['threads']} thread(s)",
                 fontsize=9)
    common.save_figure(fig, path)
    plt.close(fig)


def main(argv=None):
    p = common.benchmark_parser(__doc__.split("\n\n")[0], "speed.{json,md,png}",
                                threads_help="torch threads (default 1: shared machine)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--sizes", nargs="+", choices=list(SIZES), help="override the mode's sizes")
    p.add_argument("--dtypes", nargs="+", choices=["fp32", "fp16", "bf16"],
                   help="default fp32 on CPU; fp32 fp16 bf16 on CUDA")
    p.add_argument("--rounds", type=int, help="override the mode's alternating rounds")
    p.add_argument("--max-tokens", type=int, help="override the mode's batch size in tokens")
    p.add_argument("--peak-tflops", type=float, help="device peak for MFU (default: known GPUs; none on CPU)")
    # internal: one memory measurement in a fresh process
    p.add_argument("--memory-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", choices=list(MODELS), help=argparse.SUPPRESS)
    p.add_argument("--size", choices=list(SIZES), help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=4, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.memory_worker:
        memory_worker(args)
        return 0
    cfg = dict(MODES[args.mode])
    if args.device == "cuda" and args.mode == "default" and not args.sizes:
        cfg["sizes"] = ["small", "base", "big"]
    cfg["dtypes"] = args.dtypes or (["fp32", "fp16", "bf16"] if args.device == "cuda" else ["fp32"])
    for k in ("sizes", "rounds", "max_tokens"):
        if getattr(args, k) is not None:
            cfg[k] = getattr(args, k)
    out = pathlib.Path(args.out)
    result = run(args, cfg)
    text = report(result)
    stem = "speed" + ("" if args.device == "cpu" else "-" + args.device) + args.tag
    common.write_outputs(out, stem, result, plot, text, "speed and memory")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
