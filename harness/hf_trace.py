"""The residual stream of a causal LM of the hf study over its first updates, block by block: where T-Fixup's
24-layer Llama blows up, and what its gated-MLP controls change (docs/derivation.md, section 7.6).

    python -m harness.hf_trace --out results/hf
    python -m harness.hf_trace --out results/hf --stem hf_trace_normfree \
        --arms tfixup,tfixup_sigmoid,tfixup_gatescale,tfixup_giadam

Each arm is the hf study's run (harness/bench/hf.py's spec, harness/bench/hf_train.py's model, data and loop) for
``--updates`` updates or until its loss is not finite. Forward hooks record, on each update's batch, the RMS of
every block's output (the stream after block l) and of its attention's and its MLP's output (the two branches that
block adds). Writes STEM.{json,md,png} under --out, checked before anything trains; Ctrl-C writes nothing.
"""

import argparse
import math
import os
import pathlib
import sys
import time

from harness.bench import common, hf, hf_train

# each family's default arms (the gated-MLP controls are Llama's)
ARMS = {"llama": ("tfixup", "tfixup_nogate", "tfixup_mlpnorm", "stock"), "gpt2": ("tfixup", "stock_matched", "stock")}
# each family's blocks and the attention and MLP module of a block
BLOCKS = {"llama": (lambda m: m.model.layers, "self_attn", "mlp"), "gpt2": (lambda m: m.transformer.h, "attn", "mlp")}


def trace(spec: dict, data: pathlib.Path) -> dict:
    """SPEC's run for spec["updates"] updates (no validation); per update: train bits, and the RMS of the stream,
    the attention branch and the MLP branch at every block."""
    import torch
    model, made = hf_train.make_model(spec, data)
    blocks, attn, mlp = BLOCKS[spec["family"]]
    now = {}

    def hook(key, i):  # the RMS of a module's output (its first element if a tuple), None where not finite
        def record(module, args, output):
            if module.training:  # the update's forward pass
                t = output[0] if isinstance(output, tuple) else output
                v = t.detach().double().pow(2).mean().sqrt().item()
                now.setdefault(key, {})[i] = v if math.isfinite(v) else None
        return record

    for i, block in enumerate(blocks(model)):
        block.register_forward_hook(hook("stream", i))
        getattr(block, attn).register_forward_hook(hook("attention", i))
        getattr(block, mlp).register_forward_hook(hook("mlp", i))
    steps = []

    class Traced(hf_train.Trainer):  # the study's loop, each update's RMS kept
        def step(self, loss_fn, batch):
            now.clear()
            ok = super().step(loss_fn, batch)
            bits = self.train_curve[-1][1] if ok else None
            steps.append({"update": len(steps) + 1, "bits": bits,
                          **{k: [v[i] for i in sorted(v)] for k, v in now.items()}})
            top, _ = largest(steps[-1].get("stream", []))
            print(f"[hf-trace] {hf.run_id(spec)} update {len(steps)}: train bits {bits}, largest stream RMS "
                  f"{'not finite' if top is None else f'{top:.3g}'}", flush=True)
            return ok

    tr = Traced(model, spec, torch.device("cpu"))
    # the loop validates only at its last update; one valid line keeps that pass (unused here) cheap
    hf_train.TRAIN[spec["family"]]({**spec, "valid_every": 10 ** 9, "valid_lines": 1}, data, tr)
    return {"id": hf.run_id(spec), "arm": spec["arm"], "label": hf.ARMS[spec["arm"]].label, "status": tr.status,
            "updates": tr.updates, "norm_modules": made["norm_modules"], "steps": steps}


def spec_of(mode: str, family: str, layers: int, arm: str, seed: int, updates: int, lr: float = None) -> dict:
    """The hf study's spec of that run (in MODE) at its first lr, cut to UPDATES updates; LR: at that lr instead
    (its id names the lr where the study's would)."""
    specs = hf.make_specs(hf.make_config(mode))
    for s in specs:
        if (s["family"], s["layers"], s["arm"], s["seed"]) == (family, layers, arm, seed) and not s.get("lr_in_id"):
            if lr is not None and lr != s["lr"]:
                s = {**s, "lr": lr, "lr_in_id": True}
            return {**s, "updates": updates}
    known = ", ".join(hf.run_id(s) for s in specs if s["family"] in BLOCKS)
    raise SystemExit(f"error: the hf study has no run {family}-L{layers}-{arm}-s{seed}; its causal LM runs: {known}")


def largest(values: list):
    """(value, block counted from 1) of the largest finite value, or (None, None)."""
    finite = [(v, i) for i, v in enumerate(values, 1) if v is not None]
    return max(finite) if finite else (None, None)


def report(res: dict) -> str:
    text = (f"# The residual stream over the first updates: {res['family']}, {res['layers']} layers\n\n"
            f"- command: `{res['command']}`\n- machine: {res['machine']['cpu']} ({res['machine']['cores']} cores), "
            f"torch {res['machine']['torch']}, 1 thread\n- date: {res['machine']['date_utc']}\n- data: {res['data']}\n"
            f"- runs: the hf study's (harness/bench/hf.py) of each arm, seed {res['seed']}"
            + (f", peak lr {res['lr']:g}" if res.get("lr") else "") + f", for their first "
            f"{res['updates']} updates; RMS on each update's batch, in its forward pass\n\n")
    for r in res["arms"]:
        rows = []
        for s in r["steps"]:
            tops = [x for k in ("stream", "attention", "mlp") for x in largest(s.get(k, []))]  # value, block of each
            rows.append([s["update"], s["bits"], (s.get("stream") or [None])[-1], *tops])
        end = f"not finite at update {len(r['steps'])}" if r["status"] == "nan" else f"{r['updates']} updates, finite"
        text += (f"## {r['label']} (`{r['id']}`): {end}\n\n" + common.md_table(
            ["update", "train bits", "stream RMS after the last block", "largest stream RMS", "at block",
             "largest attention branch RMS", "at block", "largest MLP branch RMS", "at block"], rows) + "\n\n")
    return text


def plot(res: dict, path: pathlib.Path) -> None:
    fig, axes = common.panel_grid(len(res["arms"]), 2, 5.5, 3.8)
    for ax, r in zip(axes, res["arms"]):
        steps = r["steps"]
        picks = sorted({1, *range(5, len(steps), 5), len(steps)} & set(range(1, len(steps) + 1)))
        cmap = common.pyplot().get_cmap("viridis")
        for k, u in enumerate(picks):
            s = steps[u - 1]
            colour = cmap(k / max(1, len(picks) - 1))
            x = range(1, len(s.get("stream", [])) + 1)
            for key, ls, what in (("stream", "-", "stream"), ("mlp", ":", "MLP branch")):
                ax.plot(x, [float("nan") if v is None else v for v in s.get(key, [])], color=colour, ls=ls,
                        label=f"update {u}: {what}")
        ax.set_yscale("log")
        end = f"not finite at update {len(steps)}" if r["status"] == "nan" else "finite"
        common.finish_axes(ax, "block", "RMS on the update's batch", f"{r['label']}\n({end})", title_size=8,
                           grid={"which": "both"}, legend={"fontsize": 6, "ncol": 2})
    common.save_titled_figure(path, fig, f"{res['family']}, {res['layers']} layers: the residual stream after each "
                              "block (solid) and the MLP branch (dotted) over the first updates")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m harness.hf_trace", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="writes STEM.{json,md,png} here")
    p.add_argument("--stem", default="hf_trace", help="the output files' name (default hf_trace)")
    p.add_argument("--data", default="work/hf-data", help="the hf study's exported data (python -m harness.bench.hf "
                   "--export)")
    p.add_argument("--family", default="llama", choices=sorted(BLOCKS))
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--arms", help="comma-separated arms of the hf study (default: the family's, "
                   + "; ".join(f"{f}: {','.join(a)}" for f, a in ARMS.items()) + ")")
    p.add_argument("--lr", type=float, help="peak lr of every arm (default: the study's, 1e-3)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--updates", type=int, default=20)
    p.add_argument("--smoke", dest="mode", action="store_const", const="smoke", default="default",
                   help="the study's smoke sizes (for the tests)")
    return p.parse_args(argv)


def check_out(out: pathlib.Path) -> pathlib.Path:
    """OUT as a folder this process can write in (made if missing), or a one-line error before any training."""
    if out.exists() and not out.is_dir():
        common.die(f"--out {out}: a file, not a folder; name a folder to write the trace in")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        common.die(f"--out {out}: cannot make the folder ({e.strerror}); name a folder you can write in")
    if not os.access(out, os.W_OK | os.X_OK):
        common.die(f"--out {out}: not writable; name a folder you can write in")
    return out


def main(argv=None) -> dict:
    a = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = check_out(pathlib.Path(a.out))
    data = hf.check_data(pathlib.Path(a.data))
    arms = a.arms.split(",") if a.arms else ARMS[a.family]
    specs = [spec_of(a.mode, a.family, a.layers, arm, a.seed, a.updates, a.lr) for arm in arms]
    import torch
    torch.set_num_threads(1)
    t0 = time.time()
    res = {"command": "python -m harness.hf_trace " + " ".join(sys.argv[1:] if argv is None else argv),
           "machine": common.machine(), "data": common.data_description(data), "family": a.family, "layers": a.layers,
           "seed": a.seed, "updates": a.updates, "lr": specs[0]["lr"] if specs else None}
    try:
        res["arms"] = [trace(s, data) for s in specs]
    except KeyboardInterrupt:
        print("[hf-trace] interrupted: nothing written", file=sys.stderr)
        raise SystemExit(130)
    res["seconds"] = round(time.time() - t0, 1)
    common.write_outputs(out, a.stem, res, plot, report(res), "the stream's RMS after each block")
    print(f"[hf-trace] wrote {out}/{a.stem}.{{json,md,png}} ({res['seconds']} s)")
    return res


if __name__ == "__main__":
    main()
