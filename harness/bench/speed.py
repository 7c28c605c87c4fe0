"""Training speed and peak memory: ``transformer_tfixup`` vs stock ``transformer``, same dims.

The timed step is fairseq-train's own ``Trainer.train_step([sample])`` (``new_trainer``: label-smoothed CE forward
and backward, grad norm, fairseq's Adam, the method's schedule; CUDA ``--dtypes fp16``/``amp`` pass ``--fp16``/
``--amp``, CPU runs fp32). Both trainers live in one process, take the same real IWSLT'14 batches in the same order
and are timed in alternating blocks (A B, B A, ...), so that drifts of a shared machine hit both alike; the ratio
is T-Fixup / stock. Peak memory: each model trains again in a fresh process (``train_peak``). FLOPs per step:
torch.utils.flop_counter over one train_step per batch (matmuls, not the optimizer); MFU = achieved FLOP/s / the
device's peak (--peak-tflops or ``PEAK_TFLOPS``; none for CPUs).

    python -m harness.bench.speed --quick --out /tmp/speed
    python -m harness.bench.speed --out results/bench                               # CPU, small + base
    python -m harness.bench.speed --device cuda --sizes small base big --dtypes fp32 fp16 amp --out DIR
"""

import concurrent.futures
import multiprocessing
import pathlib
import resource
import shlex
import statistics
import sys
import tempfile
import time

from harness.bench import common, runs as runlib
from fairseq_tfixup.diagnostics.train import build_trainer
from tfixup import atomic, methods

# name -> sizes (layers per side); dropout 0.1 for all (stock big would use 0.3)
SIZES = {
    "tiny": dict(embed=64, ffn=128, heads=2, layers=2),
    "small": dict(embed=512, ffn=1024, heads=4, layers=6),  # transformer_iwslt_de_en
    "base": dict(embed=512, ffn=2048, heads=8, layers=6),  # transformer (wmt_en_de)
    "big": dict(embed=1024, ffn=4096, heads=16, layers=6),  # transformer_vaswani_wmt_en_de_big
}
MODELS = {"tfixup": "tfixup", "stock": "postln"}  # name -> method of tfixup/methods.py
# --dtypes -> fairseq-train's precision flags on CUDA. No bf16: fairseq 0.12's --bf16 implies --tpu
# (fairseq/options.py), so fairseq-train cannot train in bf16 on a GPU.
PRECISION = {"fp32": [], "fp16": ["--fp16"], "amp": ["--amp"]}

# dense peak TFLOP/s (no sparsity) of GPUs we may be lent; matched by substring of the device name
PEAK_TFLOPS = {
    **dict.fromkeys(("H200", "H100"), {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "amp": 989.4}),
    "A100": {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "amp": 312.0},
}

MODES = {
    "smoke": dict(sizes=["tiny"], rounds=2, steps=2, warmup=1, max_tokens=512, batches=4),
    "quick": dict(sizes=["small"], rounds=2, steps=2, warmup=1, max_tokens=1024, batches=4),
    "default": dict(sizes=["small", "base"], rounds=4, steps=2, warmup=1, max_tokens=1024, batches=8),
}


def train_flags(model: str, size: str, max_tokens: int, device: str, dtype: str, save_dir: str) -> list:
    """fairseq-train's flags (after the data folder): a study run's of the IWSLT recipe at this size with the
    method's schedule, at ``dtype``'s precision; fairseq writes crash.pt to ``save_dir`` if a step fails."""
    recipe = common.recipe({**SIZES[size], "max_tokens": max_tokens}, MODELS[model], lr="5e-4")
    return [*common.train_args(recipe, device), "--save-dir", save_dir, *PRECISION[dtype]]


def new_trainer(model: str, size: str, data: pathlib.Path, cfg: dict, device: str, dtype: str, save_dir: str):
    """fairseq-train's Trainer for this model, at the start of epoch 1 (diagnostics.train.build_trainer)."""
    return build_trainer(data, train_flags(model, size, cfg["max_tokens"], device, dtype, save_dir))[2]


def real_batches(trainer, n: int) -> list:
    """The first ``n`` batches of fairseq-train's epoch-1 train iterator (train_step moves them to the device)."""
    itr = trainer.get_train_iterator(epoch=1).next_epoch_itr(shuffle=True)
    return [sample for sample, _ in zip(itr, range(n))]


def step_flops(trainer, sample) -> int:
    """FLOPs of one train_step on this batch (forward and backward matmuls, attention's included)."""
    import torch
    from torch.utils import flop_counter as fc

    # torch's counter counted nothing for the CPU's fused attention (scaled_dot_product_attention, which
    # fairseq's self-attention takes): count it with the formulas torch has for the CUDA kernels
    aten = torch.ops.aten
    for op, formula in ((aten._scaled_dot_product_flash_attention_for_cpu, fc.sdpa_flop),
                        (aten._scaled_dot_product_flash_attention_for_cpu_backward, fc.sdpa_backward_flop)):
        if op not in fc.flop_registry:
            fc.register_flop_formula(op, get_raw=True)(formula)  # FORMULA takes shapes already
    counter = fc.FlopCounterMode(display=False)
    with counter:
        trainer.train_step([sample])
    return counter.get_total_flops()


def ab_speed(size: str, dtype: str, data: pathlib.Path, cfg: dict, device: str, peak_tflops: float) -> dict:
    """Alternating A/B timing of both trainers on the same batches; tokens/s, FLOP/s."""
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else lambda: None
    with tempfile.TemporaryDirectory(prefix="speed-") as save_dir:
        trainers = {m: new_trainer(m, size, data, cfg, device, dtype, save_dir) for m in MODELS}
        batches = real_batches(trainers["tfixup"], cfg["batches"])
        params = {m: sum(p.numel() for p in t.model.parameters()) for m, t in trainers.items()}
        # one counted step per batch; these also warm up (allocator, first-call kernels, optimizer state)
        flops = {m: [step_flops(trainers[m], b) for b in batches] for m in MODELS}
        for m in MODELS:
            for i in range(cfg["warmup"]):
                trainers[m].train_step([batches[i % len(batches)]])
        sync()
        times, toks, timed_flops = ({m: [] for m in MODELS} for _ in range(3))  # per model, per round
        for r in range(cfg["rounds"]):
            idx = [(r * cfg["steps"] + i) % len(batches) for i in range(cfg["steps"])]
            for m in (list(MODELS) if r % 2 == 0 else list(MODELS)[::-1]):
                t0 = time.perf_counter()
                for i in idx:
                    trainers[m].train_step([batches[i]])
                sync()
                times[m].append(time.perf_counter() - t0)
                toks[m].append(sum(int(batches[i]["ntokens"]) for i in idx))
                timed_flops[m].append(sum(flops[m][i] for i in idx))
            common.log(f"  {size} {dtype} round {r + 1}/{cfg['rounds']}: "
                       + ", ".join(f"{m} {toks[m][-1] / times[m][-1]:.0f} tok/s" for m in MODELS))
    out = {"size": size, "dims": "{embed}-{ffn}-{heads}, {layers}+{layers} layers".format(**SIZES[size]),
           "dtype": dtype, "device": device}
    for m in MODELS:
        achieved = sum(timed_flops[m]) / sum(times[m])
        out[m] = {
            "params": params[m], "tokens_per_s": sum(toks[m]) / sum(times[m]),
            "s_per_step": sum(times[m]) / (cfg["rounds"] * cfg["steps"]),
            "gflop_per_step": statistics.mean(flops[m]) / 1e9, "achieved_tflops": achieved / 1e12,
            "mfu": achieved / (peak_tflops * 1e12) if peak_tflops else None,
            # the trainer is fairseq-train's for DATA-BIN and these flags
            "fairseq_train_flags": shlex.join(train_flags(m, size, cfg["max_tokens"], device, dtype, "<temporary>")),
        }
    per_round = [(toks["tfixup"][i] / times["tfixup"][i]) / (toks["stock"][i] / times["stock"][i])
                 for i in range(cfg["rounds"])]
    out["ratio_tokens_per_s"] = out["tfixup"]["tokens_per_s"] / out["stock"]["tokens_per_s"]
    out["ratio_per_round"] = {"median": statistics.median(per_round), "min": min(per_round), "max": max(per_round)}
    return out


def _status_kib(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def train_peak(model: str, size: str, data: str, cfg: dict, device: str, dtype: str, threads: int) -> dict:
    """Build one model's trainer, load its batches, train on each once: the training peak memory, in a fresh process
    (``memory``) so that nothing else is counted. CPU: the rise of peak RSS over the steps (activations, gradients,
    optimizer state, allocator slack); on Linux writing 5 to /proc/self/clear_refs resets VmHWM to the current RSS,
    so the peaks of building and loading do not hide it; elsewhere getrusage's max RSS, which cannot be reset.
    CUDA: the largest per-step peak fairseq's train_step logs (gb_free = total - max_memory_allocated)."""
    import gc

    import torch
    from fairseq.logging import metrics

    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory(prefix="speed-mem-") as save_dir:
        trainer = new_trainer(model, size, pathlib.Path(data), cfg, device, dtype, save_dir)
        batches = real_batches(trainer, cfg["batches"])
        rec = {"steps": len(batches), "params": sum(p.numel() for p in trainer.model.parameters())}
        if device == "cuda":
            peak = 0.0
            for b in batches:
                with metrics.aggregate(new_root=True) as agg:
                    trainer.train_step([b])
                peak = max(peak, trainer.cuda_env.total_memory_in_GB - agg["gb_free"].val)
            return {**rec, "train_peak_mib": peak * 1024, "method": "fairseq train_step's gb_free (whole step)"}
        gc.collect()
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            before, how = _status_kib("VmRSS"), "VmHWM after clear_refs"
        except OSError:
            before, how = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "ru_maxrss"
        for b in batches:
            trainer.train_step([b])
    after = _status_kib("VmHWM") if how.startswith("VmHWM") else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {**rec, "rss_before_kib": before, "rss_peak_kib": after, "method": how,
            "train_peak_mib": (after - before) / 1024}


def fresh_process() -> concurrent.futures.Executor:
    """Where ``memory`` runs each train_peak: a fresh process (spawn: no memory inherited from this one)."""
    return concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))


def memory(size: str, dtype: str, data: pathlib.Path, cfg: dict, device: str, threads: int) -> dict:
    """train_peak of each model, each in a fresh process (``fresh_process``)."""
    out = {}
    for m in MODELS:
        with fresh_process() as pool:
            try:
                out[m] = pool.submit(train_peak, m, size, str(data), cfg, device, dtype, threads).result()
            except Exception as e:  # one line naming the run, not the worker's traceback
                common.die(f"memory run failed for {m} {size} {dtype}: {type(e).__name__}: {e}")
        common.log(f"  memory {size} {dtype} {m}: +{out[m]['train_peak_mib']:.0f} MiB")
    out["ratio_train_peak"] = out["tfixup"]["train_peak_mib"] / out["stock"]["train_peak_mib"]
    return out


def peak_for(device: str, dtype: str, override: float):
    """The peak TFLOP/s at DTYPE for MFU: OVERRIDE, else PEAK_TFLOPS's row of this GPU; None on CPU or unknown GPUs."""
    if override or device != "cuda":
        return override or None
    import torch

    name = torch.cuda.get_device_name(0)
    return next((table.get(dtype) for key, table in PEAK_TFLOPS.items() if key in name), None)


def report(result: dict) -> str:
    cfg, rows = result["config"], []
    for r in result["results"]:
        t, s, mem = r["tfixup"], r["stock"], r[f"{r['device']}_memory"]
        rows.append([r["size"], r["dims"], r["dtype"], f"{t['params'] / 1e6:.2f}M / {s['params'] / 1e6:.2f}M",
                     t["tokens_per_s"], s["tokens_per_s"], f"{r['ratio_tokens_per_s']:.3f}",
                     "{median:.3f} ({min:.3f}-{max:.3f})".format(**r["ratio_per_round"]),
                     mem["tfixup"]["train_peak_mib"], mem["stock"]["train_peak_mib"], f"{mem['ratio_train_peak']:.3f}",
                     f"{t['gflop_per_step']:.1f} / {s['gflop_per_step']:.1f}",
                     f"{t['achieved_tflops'] * 1e3:.1f} / {s['achieved_tflops'] * 1e3:.1f}",
                     f"{t['mfu']:.3f} / {s['mfu']:.3f}" if t["mfu"] is not None else "n/a"])
    memnote = ("rise of peak RSS (VmHWM, reset before training) over the training steps" if cfg["device"] == "cpu"
               else "largest per-step torch.cuda.max_memory_allocated that fairseq's train_step logs (gb_free)")
    return (
        common.header_md(f"Training speed and peak memory: T-Fixup vs stock Transformer ({cfg['device']})", result)
        + f"Step = {cfg['step']}; same {cfg['batches']} real batches (max-tokens {cfg['max_tokens']}) for both; "
        f"{cfg['rounds']} alternating rounds of {cfg['steps']} steps after {cfg['batches']} FLOP-counting and "
        f"{cfg['warmup']} warm-up steps each. tokens/s = {cfg['tokens']}; peak memory (fresh process per model) = "
        f"{memnote}. Ratios are T-Fixup / stock; 'ratio tok/s' is over all timed steps, the per-round median is "
        f"robust to a burst of load from other processes during one block.\n\n"
        + common.md_table(["size", "dims", "dtype", "params T-Fixup / stock", "T-Fixup tok/s", "stock tok/s",
                           "ratio tok/s", "per-round ratio: median (range)", "T-Fixup peak MiB", "stock peak MiB",
                           "ratio memory", "GFLOP/step", "GFLOP/s", "MFU"], rows) + "\n")


def plot(result: dict, path: pathlib.Path) -> None:
    rs, w = result["results"], 0.38
    x = range(len(rs))
    fig, axes = common.pyplot().subplots(1, 2, figsize=(10, 3.8))
    panels = ((lambda r, m: r[m]["tokens_per_s"], "target tokens / s (training step)"),
              (lambda r, m: r[f"{r['device']}_memory"][m]["train_peak_mib"], "training peak memory (MiB)"))
    for ax, (value, ylabel) in zip(axes, panels):
        for m, dx, label in (("tfixup", -w / 2, "T-Fixup"), ("stock", w / 2, "stock Post-LN")):
            ax.bar([i + dx for i in x], [value(r, m) for r in rs], w, color=methods.method(MODELS[m]).color,
                   label=label)
        ax.set(ylabel=ylabel, xticks=list(x), xticklabels=[f"{r['size']} {r['dtype']}" for r in rs])
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    for i, r in enumerate(rs):
        axes[0].annotate(f"x{r['ratio_tokens_per_s']:.2f}", (i, r["tfixup"]["tokens_per_s"]), ha="center",
                         va="bottom", fontsize=8)
    fig.suptitle(f"T-Fixup vs stock Transformer, {result['config']['device']}, {result['threads']} thread(s)",
                 fontsize=9)
    atomic.save_figure(path, fig)


def main(argv=None):
    import torch

    p = common.benchmark_parser(__doc__.split("\n\n")[0], "speed.{json,md,png}",
                                threads_help="torch threads (default 1: shared machine)", quick=True)
    p.add_argument("--device", choices=common.DEVICES, default="cpu")
    p.add_argument("--sizes", nargs="+", choices=list(SIZES), help="override the mode's sizes")
    p.add_argument("--dtypes", nargs="+", choices=list(PRECISION),
                   help="fairseq-train's precision on CUDA: fp32, fp16 (--fp16), amp (--amp); default fp32 on CPU, "
                        "all three on CUDA (no bf16: fairseq 0.12's --bf16 means TPU)")
    p.add_argument("--rounds", type=int, help="override the mode's alternating rounds")
    p.add_argument("--max-tokens", type=int, help="override the mode's batch size in tokens")
    p.add_argument("--peak-tflops", type=float, help="device peak for MFU (default: known GPUs; none on CPU)")
    args = p.parse_args(argv)
    cfg = dict(MODES[args.mode])
    if args.device == "cuda" and args.mode == "default" and not args.sizes:
        cfg["sizes"] = ["small", "base", "big"]
    cfg["dtypes"] = args.dtypes or (list(PRECISION) if args.device == "cuda" else ["fp32"])
    if args.device == "cpu" and cfg["dtypes"] != ["fp32"]:
        common.die(f"--dtypes {' '.join(cfg['dtypes'])}: only fp32 on --device cpu; fp16 and amp need --device cuda")
    cfg = runlib.with_overrides(cfg, args, ("sizes", "rounds", "max_tokens"))
    torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        common.die("--device cuda: no CUDA device visible to torch")
    data = common.prepare_data(300, 200, args.data, args.data_root)
    results = []
    for size in cfg["sizes"]:
        for dtype in cfg["dtypes"]:
            common.log(f"speed {size} {dtype} on {args.device}")
            rec = ab_speed(size, dtype, data, cfg, args.device, peak_for(args.device, dtype, args.peak_tflops))
            rec[f"{args.device}_memory"] = memory(size, dtype, data, cfg, args.device, args.threads)
            results.append(rec)
    result = {"benchmark": "speed", "mode": args.mode, "command": common.command_line(), "machine": common.machine(),
              "data": common.data_description(data), "data_counts": common.data_counts(data), "threads": args.threads,
              "config": {**cfg, "device": args.device, "step": "fairseq Trainer.train_step (label-smoothed CE forward "
                         "+ backward, grad norm, fairseq Adam + the method's LR schedule"
                         + (", --fp16/--amp as the dtype says" if args.device == "cuda" else "") + ")",
                         "tokens": "target tokens (fairseq's wps)"},
              "results": results}
    text = report(result)
    stem = "speed" + ("" if args.device == "cpu" else "-" + args.device) + args.tag
    common.write_outputs(pathlib.Path(args.out), stem, result, plot, text, "speed and memory")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
