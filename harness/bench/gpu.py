"""Mixed precision and speed on a GPU, in one resumable command: what the CPU cannot measure.

Four parts, each a list of runs with a record each (OUT/gpu/runs/RUN.json; a recorded run is skipped, so the study
runs in parts: ``--stop-after`` starts no run past that many seconds, and the same command again runs the rest):

  fp16   the paper's IWSLT small model (512-1024-4, 6+6 layers, 4096 tokens per update) in fairseq's ``--fp16``
         (fp16 weights and activations, fp32 master copy, dynamic loss scale), lr 5e-4 and 1e-3: T-Fixup without
         warmup against Post-LN and Pre-LN on fairseq's inverse_sqrt warmup. Per run: the steps skipped on a
         gradient overflow, the loss-scale drops, the valid curve, and the largest |value| per layer of the
         residual stream (each layer's output and every LayerNorm's input) and of the FFN's hidden units, against
         fp16's 65504; beside the CPU analysis's prediction (results/diagnostics/fp16_headroom.json, fp32).
  deep   T-Fixup at 50 and 100 layers per side, the depth study's runs in fp16, beside their fp32 records.
  bf16   the HuggingFace study's GPT-2 and Llama runs at 6 layers (harness/bench/hf.py's specs and loop) under
         ``torch.autocast(dtype=torch.bfloat16)`` (fairseq 0.12's ``--bf16`` means TPU), beside their fp32 records.
  speed  harness/bench/speed.py's measurement (A/B blocks of Trainer.train_step, fresh-process peak memory, MFU)
         at 512-1024-4 and 1024-4096-16, fp32 and fp16; alone, after the training runs (which share the GPU).

Every record carries the device, its driver, the torch/CUDA/cuDNN versions, the command and the date. CPU mode
(``--device cpu --smoke``, what the tests run): the same code at a tiny size, fp32 where fp16 needs CUDA.

    python -m harness.bench.gpu prepare        # here, once: work/data-bin/iwslt14-v1000, work/hf-data, work/device
    python -m harness.bench.gpu --device cpu --smoke --out /tmp/gpu --data DATA --hf-data HF_DATA   # the CPU mode
    python3 -m tools.device_bundle setup; PYTHONPATH=work/device/pylib:. PATH=work/device/bin:$PATH \\
        python3 -m harness.bench.gpu --device cuda --out results/bench --stop-after 360              # on the GPU
"""

import argparse
import contextlib
import json
import math
import os
import pathlib
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

from harness.bench import common, convergence, depth, hf, runs as runlib, speed
from tfixup import atomic

STEM = "gpu"
PARTS = ("fp16", "deep", "bf16", "speed")
CARRY_LIMIT_MIB = 64  # what a device call carries at most (the working tree with its carried paths)
FP16_MAX = 65504.0
FP16_ARMS = common.arm_table([common.arm("tfixup", "nowarmup"), common.arm("postln", "warmup"),
                             common.arm("preln", "warmup")])
CPU_PREDICTION = common.REPO / "results" / "diagnostics" / "fp16_headroom.json"
FP32_RECORDS = {"deep": common.REPO / "results" / "bench" / "depth" / "runs",
                "bf16": common.REPO / "results" / "bench" / "hf" / "runs"}
MODES = {
    "smoke": dict(  # the CPU mode: every part at a tiny size, a few updates (seconds)
        fp16=dict(embed=32, ffn=64, heads=2, layers=1, updates=4, valid_every=2, warmup=2, max_tokens=512,
                  dropout=0.1, decay_period=4000, lrs=[1e-3], arms=["preln_warmup"]),
        deep=dict(depths=[3], updates=3, valid_every=3),
        bf16=dict(mode="smoke", families=["llama"], layers=2, arms=["tfixup"]),
        speed=dict(sizes=["tiny"], rounds=1, steps=1, warmup=1, max_tokens=512, batches=2)),
    # sized for one device call on one H100 (an estimate from the lr study's H100 runs: none of this has run on a
    # GPU yet); --stop-after keeps a call inside its limit whatever the real speed
    "default": dict(
        fp16=dict(embed=512, ffn=1024, heads=4, layers=6, updates=800, valid_every=100, warmup=200,
                  max_tokens=4096, dropout=0.1, decay_period=4000, lrs=[5e-4, 1e-3], arms=list(FP16_ARMS)),
        deep=dict(depths=[100, 50], updates=600, valid_every=50),  # the depth study's budget at these depths
        bf16=dict(mode="default", families=["gpt2", "llama"], layers=6, arms=["tfixup", "stock_matched"]),
        speed=dict(sizes=["small", "big"], rounds=4, steps=2, warmup=1, max_tokens=4096, batches=8)),
}



def fairseq_dtype(device: str) -> str:
    """The fp16 and deep parts' precision: fairseq's --fp16 on CUDA; fp32 on CPU, where --fp16 is refused."""
    return "fp16" if device == "cuda" else "fp32"


def _fairseq_run(rid: str, meta: dict, args: list, data, dtype: str) -> runlib.Run:
    """A fairseq-train run of ARGS at DTYPE's precision (speed.PRECISION's flags), META and DTYPE in its record."""
    return runlib.Run(rid, dict(meta, dtype=dtype), ["fairseq", *args, *speed.PRECISION[dtype]], str(data))


def fp16_runs(cfg: dict, data: pathlib.Path, device: str) -> list:
    """The paper's small model on each arm at each lr, through the convergence study's run builder."""
    c, dtype = cfg["fp16"], fairseq_dtype(device)
    return [_fairseq_run(f"fp16-{name}-lr{lr:g}-{dtype}", dict(part="fp16", method=name, lr=lr, layers=c["layers"],
                                                               updates=c["updates"]),
                         convergence.make_run(c, data, name, lr, 1, c["updates"], "fp16", FP16_ARMS, device).args,
                         data, dtype) for lr in c["lrs"] for name in c["arms"]]


def depth_config(cfg: dict, data: pathlib.Path, device: str) -> dict:
    """The depth study's settings (its command line's defaults) with this study's updates and validation."""
    args = depth.parser().parse_args(["--data", str(data), "--out", "-", "--device", device])
    d = cfg["deep"]
    return dict(depth.make_config(args), updates=d["updates"], deep_updates=d["updates"], valid_every=d["valid_every"])


def make_runs(cfg: dict, data: pathlib.Path, hf_data: pathlib.Path, device: str, peak_tflops: float = None) -> list:
    """Every run of every part, the longest first: T-Fixup at each depth (the depth study's run, at fairseq_dtype's
    precision), fp16, the HuggingFace study's specs of the chosen families, arms and depth (first seed), speed last."""
    dcfg, dtype, b, sp = depth_config(cfg, data, device), fairseq_dtype(device), cfg["bf16"], cfg["speed"]
    deep = [depth.run_of(dcfg, data, "tfixup", n) for n in cfg["deep"]["depths"]]  # meta: method, depth, updates
    specs = [s for s in hf.make_specs(hf.make_config(b["mode"])) if s["family"] in b["families"]
             and s.get("layers") == b["layers"] and s["seed"] == 1 and s["arm"] in b["arms"]]
    return [*(_fairseq_run(f"deep-tfixup-{r.meta['depth']}-{dtype}", dict(part="deep", **r.meta, fp32_id=r.id),
                           r.args, data, dtype) for r in deep),
            *fp16_runs(cfg, data, device),
            *(runlib.Run(f"bf16-{hf.run_id(s)}", dict(part="bf16", family=s["family"], arm=s["arm"], layers=s["layers"],
                                                       dtype="bf16", fp32_id=hf.run_id(s)),
                         ["hf", json.dumps(s, sort_keys=True)], str(hf_data)) for s in specs),
            *(runlib.Run(f"speed-{size}-{dt}-{device}", dict(part="speed", size=size, dtype=dt),
                         ["speed", json.dumps(dict({k: v for k, v in sp.items() if k != "sizes"}, size=size, dtype=dt,
                                                   device=device, peak_tflops=peak_tflops), sort_keys=True)], str(data))
              for size in sp["sizes"] for dt in (["fp32", "fp16"] if device == "cuda" else ["fp32"]))]


def accelerator(device: str) -> dict:
    """Where a run trained, beside common.machine(): the device, and on CUDA its driver, capability, memory, cuDNN."""
    import torch
    if device != "cuda":
        return {"device": "cpu", "cuda": torch.version.cuda}
    p = torch.cuda.get_device_properties(0)
    smi = shutil.which("nvidia-smi") and subprocess.run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True)
    if smi and smi.returncode == 0 and smi.stdout.strip():
        driver = smi.stdout.split()[0]
    else:  # no nvidia-smi: the kernel module's version line
        proc = pathlib.Path("/proc/driver/nvidia/version")
        driver = next((w for w in (proc.read_text().split() if proc.is_file() else []) if w[:1].isdigit() and "." in w),
                      None)
    return {"device": torch.cuda.get_device_name(0), "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), "capability": f"{p.major}.{p.minor}",
            "memory_gib": round(p.total_memory / 2**30, 1), "driver": driver}


class ActivationMax:
    """The largest |value| per layer over the training steps, on the device (one read at the end): the residual
    stream (each layer's output and the input of each of its LayerNorms: for Post-LN the sum x + branch before
    it is normalised) and the FFN's hidden units (fc1's output, before the activation)."""

    def __init__(self, model):
        import torch

        self.maxima, self.handles, self.active = {}, [], True

        def keep(key, output: bool):
            def hook(module, inputs, out=None):
                x = out if output else (inputs[0] if inputs else None)
                x = x[0] if isinstance(x, tuple) else x
                if self.active and torch.is_tensor(x) and x.numel():
                    v = x.detach().abs().amax().float()
                    self.maxima[key] = torch.maximum(self.maxima[key], v) if key in self.maxima else v
            return hook

        for side in ("encoder", "decoder"):
            for i, layer in enumerate(getattr(model, side).layers):
                self.handles.append(layer.register_forward_hook(keep((side, "stream", i), True)))
                for name, m in layer.named_modules():
                    if name.endswith("layer_norm"):
                        self.handles.append(m.register_forward_pre_hook(keep((side, "stream", i), False)))
                    elif name == "fc1":
                        self.handles.append(m.register_forward_hook(keep((side, "ffn", i), True)))

    def result(self) -> dict:
        """{"encoder": {"stream": [per layer], "ffn": [...]}, "decoder": {...}} (inf or nan: left fp16's range)."""
        out = {}
        for (side, q, i), v in sorted(self.maxima.items()):
            out.setdefault(side, {}).setdefault(q, []).append(float(v))
        return out

    def detach(self):
        for h in self.handles:
            h.remove()


def peak_of(maxima: dict) -> dict:
    """The largest value over every layer and quantity, where it was, and fp16's headroom (65504 / it)."""
    cells = [(v, f"{side}.{i}.{q}") for side, qs in maxima.items() for q, vals in qs.items()
             for i, v in enumerate(vals)]
    if not cells:
        return {"value": None, "where": None, "fp16_headroom": None, "over_fp16": None}
    bad = [c for c in cells if not math.isfinite(c[0])]
    value, where = bad[0] if bad else max(cells, key=lambda c: c[0])  # the first of equal maxima
    return {"value": value, "where": where, "over_fp16": bool(bad) or value > FP16_MAX,
            "fp16_headroom": FP16_MAX / value if math.isfinite(value) and value > 0 else None}


def valid_loss(trainer) -> float:
    """fairseq-train's validation: the valid set's loss (bits per token) as fairseq_cli/train.py's validate sums it."""
    from fairseq.logging import metrics
    with metrics.aggregate(new_root=True) as agg:
        for sample in trainer.get_valid_iterator("valid").next_epoch_itr(shuffle=False, set_dataset_epoch=False):
            trainer.valid_step(sample)
    return float(agg.get_smoothed_values()["loss"])


def train_fairseq(data: pathlib.Path, args: list, threads: int) -> dict:
    """fairseq-train's update (its Trainer, built from ARGS as fairseq_cli/train.py builds it) until --max-update,
    valid loss every --validate-interval-updates; the overflow steps, loss scale and activation maxima."""
    import torch
    from fairseq.logging import metrics

    from fairseq_tfixup.diagnostics.train import build_trainer

    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory(prefix="gpu-run-") as save_dir:  # fairseq writes crash.pt there on a failure
        cfg, task, trainer = build_trainer(data, [*args, "--save-dir", save_dir])
        cuda, fp16, peak_gb = not cfg.common.cpu, cfg.common.fp16, 0.0
        task.load_dataset("valid", combine=False, epoch=1)
        max_update, every = cfg.optimization.max_update, cfg.dataset.validate_interval_updates
        watch = ActivationMax(trainer.model)

        def scale():
            return float(trainer.optimizer.scaler.loss_scale) if fp16 else None

        rec = {"status": "ok", "steps": 0, "overflow_steps": 0, "valid_curve": [], "train_curve": [],
               "loss_scale_curve": [], "params": sum(p.numel() for p in trainer.model.parameters())}
        first_scale, drops, lowest, losses, times = scale(), 0, scale(), [], []
        epoch_itr, t_start = trainer.get_train_iterator(epoch=1), time.time()
        try:
            while trainer.get_num_updates() < max_update and rec["status"] == "ok":
                if epoch_itr.next_epoch_idx > 1:
                    trainer.begin_epoch(epoch_itr.next_epoch_idx)
                for sample in epoch_itr.next_epoch_itr(shuffle=True):
                    before, s0, t0 = trainer.get_num_updates(), scale(), time.perf_counter()
                    try:
                        with metrics.aggregate(new_root=True) as agg:
                            out = trainer.train_step([sample])
                    except FloatingPointError as e:  # fairseq: "Minimum loss scale reached", "gradients are Nan/Inf"
                        rec.update(status="nan", error=str(e).splitlines()[0])
                        break
                    if cuda:
                        torch.cuda.synchronize()
                        if "gb_free" in agg:  # the step's peak, as speed.py reads it (train_step resets the peak)
                            peak_gb = max(peak_gb, trainer.cuda_env.total_memory_in_GB - agg["gb_free"].val)
                    times.append(time.perf_counter() - t0)
                    rec["steps"] += 1
                    if fp16:
                        drops, lowest = drops + (scale() < s0), min(lowest, scale())
                    n = trainer.get_num_updates()
                    if n == before:  # fairseq skipped the update: gradient overflow, the loss scale halved
                        rec["overflow_steps"] += 1
                        continue
                    losses.append(float(out["loss"]))
                    if not math.isfinite(losses[-1]):
                        rec.update(status="nan", error=f"loss {losses[-1]} at update {n}")
                        break
                    if n % every == 0 or n >= max_update:
                        watch.active = False
                        v = valid_loss(trainer)
                        watch.active = True
                        window = losses[-every:]
                        rec["train_curve"].append((n, round(sum(window) / len(window), 4)))
                        rec["valid_curve"].append((n, round(v, 4)))
                        if fp16:
                            rec["loss_scale_curve"].append((n, scale()))
                        common.log(f"  update {n}/{max_update}: train {rec['train_curve'][-1][1]:.3f} valid {v:.3f} "
                                   f"bits{f', loss scale {scale():g}' if fp16 else ''} ({time.time() - t_start:.0f} s)")
                        if not math.isfinite(v):
                            rec.update(status="nan", error=f"valid loss {v} at update {n}")
                    if n >= max_update or rec["status"] != "ok":
                        break
        finally:
            watch.detach()
        maxima = watch.result()
        rec.update(updates=trainer.get_num_updates(), wall_s=round(time.time() - t_start, 1),
                   final_valid=rec["valid_curve"][-1][1] if rec["valid_curve"] else None,
                   best_valid=common.best(rec["valid_curve"])[1], activation_max=maxima,
                   activation_peak=peak_of(maxima), s_per_step=round(statistics.median(times), 4) if times else None,
                   loss_scale=dict(first=first_scale, final=scale(), lowest=lowest, drops=drops) if fp16 else None,
                   precision="fp16 (fairseq --fp16: FP16Optimizer, dynamic loss scale)" if fp16 else "fp32",
                   peak_memory_mib=round(peak_gb * 1024, 1) if cuda else None)
    return rec


def train_bf16(spec: dict, data: pathlib.Path, device: str, threads: int) -> dict:
    """One run of the HuggingFace study (hf.run_one: its model, loop and evaluation) under bf16 autocast."""
    import torch

    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16):
        out = hf.run_one(spec, hf.check_data(data), device, threads)
    return dict(out, precision="bf16 (torch.autocast(dtype=torch.bfloat16) over the loop; fp32 weights, AdamW in fp32)",
                peak_memory_mib=round(torch.cuda.max_memory_allocated() / 2**20, 1) if cuda else None)


def speed_cell(spec: dict, data: pathlib.Path, threads: int) -> dict:
    """speed.py's A/B timing and fresh-process memory of T-Fixup and the stock model at one size and precision."""
    import torch
    torch.set_num_threads(threads)
    size, dtype, device = spec["size"], spec["dtype"], spec["device"]
    peak = speed.peak_for(device, dtype, spec.get("peak_tflops"))
    rec = speed.ab_speed(size, dtype, data, spec, device, peak)
    rec[f"{device}_memory"] = speed.memory(size, dtype, data, spec, device, threads)
    return dict(rec, peak_tflops=peak, status="ok")


def one_main(argv) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.bench.gpu one", description="one run (the study starts these)")
    p.add_argument("--spec", required=True, help="the run's spec.json (written by the study)")
    p.add_argument("--result", required=True)
    a = p.parse_args(argv)
    spec = json.loads(pathlib.Path(a.spec).read_text())
    kind, data, device, threads = spec["kind"], pathlib.Path(spec["data"]), spec["device"], spec["threads"]
    out = (train_fairseq(data, spec["args"], threads) if kind == "fairseq" else
           train_bf16(spec["spec"], data, device, threads) if kind == "hf" else speed_cell(spec["spec"], data, threads))
    atomic.write_json(pathlib.Path(a.result), dict(out, env={**common.machine(), **accelerator(device)}))
    return 0


def execute(run: runlib.Run, work: pathlib.Path, device: str, threads: int, deadline: float = None,
            in_process: bool = False):
    """One run in its own process (``python -m harness.bench.gpu one``; IN_PROCESS: in this one, for the tests),
    its output in WORK/ID/train.log; its record. None, and nothing run, once DEADLINE (time.time()) has passed."""
    if deadline is not None and time.time() > deadline:
        common.log(f"{run.id}: --stop-after reached; left for the next call of the same command")
        return None
    rundir = work / run.id
    shutil.rmtree(rundir, ignore_errors=True)
    rundir.mkdir(parents=True)
    kind, data = run.args[0], pathlib.Path(run.data)
    spec = {"kind": kind, "data": run.data, "device": device, "threads": threads,
            **({"args": run.args[1:]} if kind == "fairseq" else {"spec": json.loads(run.args[1])})}
    atomic.write_json(rundir / "spec.json", spec)
    cmd = [sys.executable, "-m", "harness.bench.gpu", "one", "--spec", rundir / "spec.json",
           "--result", rundir / "result.json"]
    t0 = time.time()
    rc = (_in_process if in_process else runlib.run_logged)(cmd, rundir / "train.log", common.run_env(threads))
    record = {"id": run.id, **run.meta, "key": run.key(), "command": common.command_line(),
              "run_command": shlex.join(map(str, cmd)), "returncode": rc, "process_wall_s": round(time.time() - t0, 1),
              **({"fairseq_train": shlex.join(["fairseq-train", run.data, *map(str, run.args[1:])])}
                 if kind == "fairseq" else {"config": spec["spec"]}),
              "data": common.data_description(data)}
    if rc == 0 and (rundir / "result.json").is_file():
        return {**record, **json.loads((rundir / "result.json").read_text())}
    tail = (rundir / "train.log").read_text(errors="replace").strip().splitlines()[-8:]
    return {**record, "status": "error", "error_tail": tail}


def _in_process(cmd: list, log: pathlib.Path, env: dict) -> int:
    """``one``'s command run in this process, its output in LOG; its exit code (1 on an exception)."""
    with open(log, "w") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        try:
            return one_main([str(c) for c in cmd[cmd.index("one") + 1:]])
        except Exception:
            traceback.print_exc(file=f)
            return 1


def fp32_twin(part: str, rec: dict):
    """The fp32 record of the same run (the depth or HuggingFace study's), where one is committed."""
    store = FP32_RECORDS.get(part)
    twin = store and rec.get("fp32_id") and runlib.read_record(store / f"{rec['fp32_id']}.json")
    if not twin:
        return None
    return {"id": twin["id"], "status": twin.get("status"), "best_valid": common.best(twin.get("valid_curve", []))[1],
            "final_valid": twin["valid_curve"][-1][1] if twin.get("valid_curve") else None,
            "device": twin.get("device") or (twin.get("machine") or {}).get("device")
            or ("cpu" if " --cpu " in twin.get("command", "") else "?")}


def held(pred, peak: dict) -> str:
    """Whether the CPU analysis's prediction (inside fp16's range or not) held for a run's activation maxima."""
    if not pred or peak.get("over_fp16") is None:
        return "-"
    return "yes" if (max(pred["residual"], pred["ffn_hidden"]) > FP16_MAX) == peak["over_fp16"] else "no"


def summarise(cfg: dict, records: dict, planned: int, device: str) -> dict:
    parts = {p: [rid for rid, rec in records.items() if rec["part"] == p] for p in PARTS}
    return {"benchmark": STEM, "mode": cfg["mode"], "device": device, "command": common.command_line(),
            "machine": common.machine(), "data": cfg["data"], "config": {k: cfg[k] for k in PARTS},
            "runs_recorded": len(records), "runs_planned": planned, "complete": len(records) >= planned > 0,
            "devices": sorted({(r.get("env") or {}).get("device", "?") for r in records.values()}), "parts": parts,
            "fp32_twins": {rid: fp32_twin(rec["part"], rec) for rid, rec in records.items()}, "records": records}


def _g(x, fmt="{:.3f}"):
    return "-" if x is None else fmt.format(x)


def report(res: dict) -> str:
    recs, cfg, parts, c = res["records"], res["config"], res["parts"], res["config"]["fp16"]
    analysis = (runlib.read_record(CPU_PREDICTION) or {}).get("runs", {})
    text = runlib.report_head("Mixed precision and speed on a GPU", res, res["runs_planned"], (
        f"Study device: {res['device']}; runs made on: {', '.join(res['devices']) or 'none yet'} (each record names "
        f"its device, driver, torch/CUDA versions and date). fairseq's `--fp16` needs CUDA: where a fairseq part ran "
        f"on CPU its runs are fp32 (their ids end in -fp32), which tests the code, not fp16.\n\n"))
    envs = sorted({f"CPU ({e.get('cpu', '?')}), torch {e.get('torch')}" if e.get("device", "cpu") == "cpu" else
                   f"{e['device']} (driver {e.get('driver')}, compute capability {e.get('capability')}, "
                   f"{e.get('memory_gib')} GiB), torch {e.get('torch')}, CUDA {e.get('cuda')}, cuDNN {e.get('cudnn')}"
                   for e in (r.get("env") or {} for r in recs.values())})
    text += "Environments: " + "; ".join(envs) + ".\n\n" if envs else ""

    def twin(rid):  # the committed fp32 record of the same run
        t = res["fp32_twins"].get(rid)
        return f"{_g(t['best_valid'])} ({t['status']}, {t['device']})" if t else "-"

    def train_row(rid, r):
        pk, ls = r.get("activation_peak") or {}, r.get("loss_scale") or {}
        # the CPU analysis's (fp32) largest residual-stream and FFN-hidden values, same method and depth
        method = FP16_ARMS[r["method"]].method if r["method"] in FP16_ARMS else r["method"]
        p = analysis.get(f"{method}/{r.get('layers') or r.get('depth')}")
        pred = p and {"residual": p["residual"]["max"], "ffn_hidden": p["ffn_hidden"]["max"]}
        scales = " → ".join(_g(ls.get(k), "{:g}") for k in ("first", "lowest", "final")) if ls else "-"
        return ([rid, r["status"], f"{r.get('updates')} / {r.get('steps')}", r.get("overflow_steps"),
                 ls.get("drops", "-"), scales, _g(r.get("final_valid")), _g(r.get("best_valid")),
                 f"{_g(pk.get('value'), '{:.3g}')} ({pk.get('where')})", _g(pk.get("fp16_headroom"), "{:.3g}"),
                 f"{pred['residual']:.3g} / {pred['ffn_hidden']:.3g}" if pred else "-", held(pred, pk)]
                + ([twin(rid)] if r["part"] == "deep" else []))

    def bf16_row(rid, r):
        return [rid, r["status"], r.get("updates"), _g(r["valid_curve"][-1][1] if r.get("valid_curve") else None),
                _g(common.best(r.get("valid_curve", []))[1]), twin(rid), _g(r.get("s_per_update"), "{:.4f}"),
                _g(r.get("peak_memory_mib"), "{:.0f}")]

    def speed_row(rid, r):
        t, s, mem = r["tfixup"], r["stock"], r[f"{r['device']}_memory"]
        return [rid, r["dims"], r["dtype"], _g(t["tokens_per_s"], "{:.0f}"), _g(s["tokens_per_s"], "{:.0f}"),
                f"{r['ratio_tokens_per_s']:.3f} ({r['ratio_per_round']['median']:.3f})",
                f"{mem['tfixup']['train_peak_mib']:.0f} / {mem['stock']['train_peak_mib']:.0f}",
                f"{t['gflop_per_step']:.1f} / {s['gflop_per_step']:.1f}",
                f"{t['mfu']:.3f} / {s['mfu']:.3f}" if t.get("mfu") is not None else "n/a"]

    train = ["run", "status", "updates / steps", "overflow steps", "loss-scale drops",
             "loss scale first → lowest → final", "final valid", "best valid", "max abs activation (where)",
             "fp16 headroom", "CPU analysis: residual / FFN max", "its prediction held"]
    sections = {  # part: its heading and intro, its table's columns, a row of it
        "fp16": (f"## fp16: {c['embed']}-{c['ffn']}-{c['heads']}, {c['layers']}+{c['layers']} layers"
                 + (" (the paper's IWSLT model)" if res["mode"] == "default" else "")
                 + f", {c['updates']} updates of {c['max_tokens']} tokens, in fairseq's --fp16 on CUDA (fp32 on CPU)"
                 f"\n\nArms: {'; '.join(FP16_ARMS[a].label for a in c['arms'])} (warmup: fairseq's inverse_sqrt over "
                 f"{c['warmup']} updates); lr {', '.join(f'{x:g}' for x in c['lrs'])}; valid every {c['valid_every']} "
                 f"updates (bits per token). Steps count the overflow steps fairseq skipped. Activations: the largest "
                 f"|value| of the residual stream and the FFN hidden units over every layer and training step "
                 f"(headroom = 65504 / it; below 1 it leaves fp16's range). The CPU analysis "
                 f"(results/diagnostics/fp16_headroom.md) measured the same quantities in fp32 at its own, smaller "
                 f"setting and depths (its column: the same method at the same depth, where it has one); its "
                 f"prediction held where both stay inside fp16's range, or both leave it.\n\n", train, train_row),
        "deep": ("## deep: T-Fixup at depth, the depth study's runs in fairseq's --fp16 on CUDA (fp32 on CPU)\n\nThe "
                 "fp32 column is the depth study's record of the same run (results/bench/depth/runs/), best valid "
                 "loss.\n\n", train + ["fp32 record: best valid"], train_row),
        "bf16": ("## bf16: the HuggingFace study's causal LMs under torch.autocast(bfloat16)\n\nThe hf study's specs "
                 "and loop (harness/bench/hf.py); the fp32 column is its record of the same spec "
                 "(results/bench/hf/runs/).\n\n", ["run", "status", "updates", "final valid", "best valid",
                                                  "fp32 record: best valid", "s/update", "peak MiB"], bf16_row),
        "speed": ("## speed: T-Fixup / stock transformer of the same shape (harness/bench/speed.py's measurement)\n\n"
                  "fairseq's Trainer.train_step (forward, backward, gradient norm, Adam, the method's schedule), "
                  "alternating blocks on the same real batches; tokens = target tokens; peak memory per model in a "
                  "fresh process; MFU = counted matmul FLOP/s / the device's peak for the precision.\n\n",
                  ["run", "dims", "dtype", "T-Fixup tok/s", "stock tok/s", "ratio tok/s (per-round median)",
                   "peak MiB T-Fixup / stock", "GFLOP/step", "MFU T-Fixup / stock"], speed_row)}
    for part, (intro, headers, row) in sections.items():
        if parts[part]:
            text += intro + common.md_table(headers, [row(rid, recs[rid]) for rid in parts[part]]) + "\n\n"
    return text


def plot(res: dict, path: pathlib.Path) -> None:
    """Valid loss against updates, and log10 of the largest |residual stream| per layer against fp16's 65504, of
    every fairseq run (plain axes and one legend: the figure is redrawn after every run)."""
    plt = common.pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for k, rid in enumerate(res["parts"]["fp16"] + res["parts"]["deep"]):
        r, color = res["records"][rid], f"C{k % 10}"
        if r.get("valid_curve"):
            axes[0].plot(*zip(*r["valid_curve"]), color=color, lw=1.2, label=rid)
        for side, ls in (("encoder", "-"), ("decoder", ":")):
            stream = (r.get("activation_max") or {}).get(side, {}).get("stream") or []
            axes[1].plot(range(1, len(stream) + 1), [math.log10(v) if 0 < v < math.inf else math.nan for v in stream],
                         color=color, ls=ls, lw=1)
    axes[1].axhline(math.log10(FP16_MAX), color="gray", ls="--", lw=1)
    axes[0].set(xlabel="update", ylabel="valid loss (bits)")
    axes[1].set(xlabel="layer (solid: encoder, dotted: decoder)",
                ylabel="log10 largest |residual stream| (dashed: fp16's 65504)")
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=6)
    fig.suptitle(f"Mixed precision on {', '.join(res['devices']) or res['device']}", fontsize=10)
    atomic.save_figure(path, fig)



# what a device call carries: the studies' IWSLT'14 data-bin and the HuggingFace study's exported Multi30k, made
# here as the measurements' docs make them, and fairseq's bundle (tools/device_bundle.py)
IWSLT_BIN = pathlib.Path("work/data-bin/iwslt14-v1000")
PREPARE_IWSLT = f"bash scripts/prepare-iwslt14.sh --out {IWSLT_BIN} --valid-lines 1000"
HF_DATA = pathlib.Path("work/hf-data")
BUNDLE = pathlib.Path("work/device")  # tools/device_bundle.py's BUNDLE


def _shell(command: str, what: str) -> None:
    common.log(f"preparing {what}: {command}")
    proc = subprocess.run(["bash", "-c", "set -euo pipefail; " + command], cwd=common.REPO, capture_output=True,
                          text=True, env=dict(os.environ, TFIXUP_SHARED_DATA=str(common.shared_data_dir())))
    if proc.returncode != 0:
        common.die(f"{command} failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")


def prepare(iwslt: pathlib.Path = IWSLT_BIN, hf_data: pathlib.Path = HF_DATA, bundle: bool = True,
            python: str = "3.12") -> dict:
    """Here, on the CPU, each made once: the IWSLT'14 data-bin (PREPARE_IWSLT), the HuggingFace study's exported
    Multi30k (hf.PREPARE, then hf.export) and fairseq's bundle (python -m tools.device_bundle make). Checks that
    what a device call carries fits in CARRY_LIMIT_MIB and prints the command it runs."""
    iwslt, hf_data, shared = common.REPO / iwslt, common.REPO / hf_data, common.shared_data_dir()
    have_bin, have_hf = (iwslt / "dict.de.txt").is_file(), (hf_data / "meta.json").is_file()
    if not (have_bin and have_hf) and not (shared / "iwslt14-de-en").is_dir():
        common.die(f"shared data not found at {shared} (set TFIXUP_SHARED_DATA)")
    if not have_bin:
        _shell(PREPARE_IWSLT.replace(str(IWSLT_BIN), shlex.quote(str(iwslt))) + " --shared "
               + shlex.quote(str(shared)), str(iwslt))
    if not have_hf:
        data_bin = common.REPO / hf.DATA_BIN
        if not (data_bin / "dict.en.txt").is_file():
            _shell(hf.PREPARE.replace("../shared/data", shlex.quote(str(shared))), str(data_bin))
        common.log(f"exporting {data_bin} to {hf_data}")
        hf.export(data_bin, hf_data)
    hf.check_data(hf_data)
    if bundle and not (common.REPO / BUNDLE / "pylib" / "fairseq").is_dir():
        _shell(f"python3 -m tools.device_bundle make --python {shlex.quote(python)}", str(BUNDLE))
    carried = [iwslt, hf_data] + ([common.REPO / BUNDLE] if bundle else [])  # the paths a device call's carry names
    sizes = {str(p.relative_to(common.REPO)) if p.is_relative_to(common.REPO) else str(p):
             round(sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) / 2**20, 1) for p in carried}
    total = sum(sizes.values())
    if total > CARRY_LIMIT_MIB:
        common.die(f"the carried paths are {total:.0f} MiB ({', '.join(f'{k} {v}' for k, v in sizes.items())}), over "
                   f"a device call's {CARRY_LIMIT_MIB} MiB")
    # what a device call runs from the repository root, those paths carried: the bundle's setup, the study (no run
    # starts after 360 s), then everything it wrote, its records and each run's log, packed into $OUT/gpu.tgz (what
    # comes back), whatever the study's exit
    command = ("python3 -m tools.device_bundle setup && PYTHONPATH=work/device/pylib:. PATH=work/device/bin:$PATH "
               f"python3 -m harness.bench.gpu --device cuda --out results/bench --data {IWSLT_BIN} --hf-data {HF_DATA} "
               "--stop-after 360; rc=$?; tar czf $OUT/gpu.tgz results/bench/gpu results/bench/gpu.json "
               "results/bench/gpu.md results/bench/gpu.png work/bench/gpu; exit $rc")
    print(f"ready: {common.data_description(iwslt)}\n       {common.data_description(hf_data)}\n"
          f"carry: {' '.join(sizes)} ({total:.1f} MiB)\non the GPU, from the repository root: {command}")
    return {"iwslt": str(iwslt), "hf_data": str(hf_data), "carry_mib": sizes, "command": command}


def prepare_main(argv) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.bench.gpu prepare",
                                description="make (here, on the CPU) the data and fairseq bundle a GPU call carries")
    p.add_argument("--iwslt", default=str(IWSLT_BIN), help=f"the IWSLT'14 data-bin to make (default {IWSLT_BIN})")
    p.add_argument("--hf-data", default=str(HF_DATA), help=f"the exported Multi30k to make (default {HF_DATA})")
    p.add_argument("--no-bundle", dest="bundle", action="store_false",
                   help="skip fairseq's bundle (python -m tools.device_bundle make; pip downloads its sources)")
    p.add_argument("--python", default="3.12", help="the GPU machine's Python (for the bundle's bitarray wheel)")
    a = p.parse_args(argv)
    prepare(pathlib.Path(a.iwslt), pathlib.Path(a.hf_data), a.bundle, a.python)
    return 0


def parser():
    p = runlib.study_parser(__doc__.split("\n\n")[0], "gpu.{json,md,png}, gpu/runs/")
    p.add_argument("--device", choices=common.DEVICES, default="cpu",
                   help="cuda: the first GPU, fp16/bf16 (the study's purpose); cpu: the same code in fp32 (tests)")
    p.add_argument("--hf-data", default=str(HF_DATA),
                   help=f"the HuggingFace study's exported data (default {HF_DATA}; made by prepare)")
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                   help="the parts to run now (default all); the report covers every part's records")
    p.add_argument("--jobs", type=int, help="training runs at a time, sharing the device (default 4 on cuda, 1 on "
                                            "cpu); the speed runs go one at a time, after them")
    p.add_argument("--stop-after", type=float, metavar="SECONDS",
                   help="start no run after this many seconds (a run under way finishes); the same command again "
                        "runs the rest")
    p.add_argument("--peak-tflops", type=float, help="the device's peak for MFU (default: speed.py's table of GPUs)")
    p.add_argument("--in-process", action="store_true", help="every run in this process, one at a time (tests)")
    p.epilog = ("first, here: python -m harness.bench.gpu prepare (the data-bins and fairseq's bundle a device call "
                "carries). 'python -m harness.bench.gpu one' runs a single run (the study starts these).")
    for action in p._actions:
        if action.dest == "data":
            action.default = str(IWSLT_BIN)
            action.help = f"the IWSLT'14 data-bin (default {IWSLT_BIN}; made by prepare)"
        if action.dest == "data_root":
            action.help = argparse.SUPPRESS
    return p


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["one"], ["prepare"]):
        return (one_main if argv[0] == "one" else prepare_main)(argv[1:])
    args, t0 = parser().parse_args(argv), time.time()
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            common.die("--device cuda: no CUDA device visible to torch; the CPU mode is --device cpu --smoke")
    elif {"fp16", "deep"} & set(args.parts):
        common.log("fp16 skipped on CPU: fairseq's --fp16 needs CUDA; the fp16 and deep parts train in fp32 here")
    if args.device == "cpu" and "speed" in args.parts:
        common.log("speed on CPU: fp32 only (fp16 needs CUDA)")
    data, hf_data = pathlib.Path(args.data), pathlib.Path(args.hf_data)
    for path, need, what in ((data, "dict.de.txt", "--data {}: not a fairseq data-bin of IWSLT'14 de-en"),
                             (hf_data, "meta.json", "--hf-data {}: not an exported folder")):
        if (path == data or "bf16" in args.parts) and not (path / need).is_file():
            common.die(f"{what.format(path)} (no {need}); make it here with: python -m harness.bench.gpu prepare")
    cfg = {**MODES[args.mode], "mode": args.mode, "data": common.data_description(data)
           + ("; bf16: " + common.data_description(hf_data) if (hf_data / "meta.json").is_file() else "")}
    all_runs = make_runs(cfg, data, hf_data, args.device, args.peak_tflops)  # the report covers every part
    deadline = t0 + args.stop_after if args.stop_after is not None else None
    jobs = 1 if args.in_process else (args.jobs or (4 if args.device == "cuda" else 1))

    summary = lambda records: summarise(cfg, records, len(all_runs), args.device)  # noqa: E731
    # the training runs share the device (``jobs`` at a time); the speed runs go alone, after them
    for speed_part, n in ((False, jobs), (True, 1)):
        todo = [r for r in all_runs if r.meta["part"] in args.parts and (r.meta["part"] == "speed") == speed_part]
        if todo or args.report_only:
            runlib.run_study(STEM + args.tag, args.out, all_runs, summary, plot, report,
                             "valid loss and activation maxima", n, args.threads, todo=todo,
                             execute=lambda r, w: execute(r, w, args.device, args.threads, deadline, args.in_process),
                             report_only=args.report_only, only=args.only, quiet=True)
        if args.report_only:
            break
    store = pathlib.Path(args.out) / (STEM + args.tag) / "runs"
    res = summary({k: v for k, v in runlib.load_records(store).items() if k in {r.id for r in all_runs}})
    print(report(res))
    left = res["runs_planned"] - res["runs_recorded"]
    common.log(f"{res['runs_recorded']} of {res['runs_planned']} runs recorded in {store}"
               + (f"; {left} left: run the same command again" if left else "") + f" ({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
