"""How close each method's tensors come to the largest half-precision number during real training.

fairseq's ``--fp16`` keeps activations in IEEE half precision, whose largest finite value is 65504;
bfloat16 has float32's exponent (largest finite 3.39e38) and 8 bits of mantissa. A LayerNorm-free model
such as T-Fixup has nothing that bounds its residual stream, so whether it fits fp16 is a question of
measured magnitudes. During each of the first ``steps`` updates of fairseq-train's own update
(``train.train``; fp32 on CPU), forward and backward hooks record the largest |value| of:

* ``residual``: the residual stream: every encoder/decoder layer's input and output, and the input of
  every LayerNorm (for Post-LN, the sum x + branch before it is normalised; for T-Fixup the same
  modules are identities, so the stream itself);
* ``attn_logits``: every attention's logits q k^T / sqrt(d_head), recomputed from the attention's own
  projections and inputs (fairseq's attention hands the product to a fused torch kernel);
* ``ffn_hidden``: every FFN's hidden units, the output of ``fc1`` before the activation;
* ``grad``: the largest parameter gradient of the summed token loss, the one fairseq's backward
  computes before dividing by the sample size (in fp16 it is further multiplied by the loss scale,
  which fairseq lowers when it overflows); ``grad_mean`` is the same divided by the sample size.

The headroom of a quantity is 65504 / its maximum: below 1 it overflows fp16.
"""

import dataclasses
import json
import math
import pathlib
from typing import Callable, Sequence

from tfixup import atomic
from fairseq_tfixup.diagnostics.models import ModelSpec

FP16_MAX = 65504.0
BF16_MAX = 3.3895313892515355e38  # (2 - 2^-7) * 2^127
QUANTITIES = ("residual", "attn_logits", "ffn_hidden", "grad")


def is_attention(module) -> bool:
    return hasattr(module, "q_proj") and hasattr(module, "k_proj") and hasattr(module, "scaling")


def attention_logit_max(module, query, key) -> float:
    """max |q k^T| * scaling over heads, queries and keys ((T, B, C) inputs, fairseq's layout)."""
    import torch.nn.functional as F

    key = query if key is None else key
    q = F.linear(query, module.q_proj.weight, module.q_proj.bias) * module.scaling
    k = F.linear(key, module.k_proj.weight, module.k_proj.bias)
    h = module.num_heads
    q = q.reshape(q.shape[0], q.shape[1] * h, -1).transpose(0, 1)  # (B*H, Tq, dh)
    k = k.reshape(k.shape[0], k.shape[1] * h, -1).transpose(0, 1)
    return float(q.bmm(k.transpose(1, 2)).detach().abs().max())


class Headroom:
    """A ``train.Recorder``: per update, the largest |value| of each of QUANTITIES."""

    def __init__(self):
        self.steps = {q: [] for q in (*QUANTITIES, "grad_mean")}
        self.handles = []

    def _keep(self, quantity, value):
        self.current[quantity] = max(self.current.get(quantity, 0.0), value)

    def attach(self, model, task):
        import torch

        self.current = {}

        def tensor_max(x):
            return float(x.detach().abs().max()) if torch.is_tensor(x) and x.numel() else 0.0

        def stream_in(module, inputs):
            if inputs:
                self._keep("residual", tensor_max(inputs[0]))

        def stream_out(module, inputs, output):
            self._keep("residual", tensor_max(output[0] if isinstance(output, tuple) else output))

        def logits(module, args, kwargs):
            query = kwargs.get("query", args[0] if args else None)
            key = kwargs.get("key", args[1] if len(args) > 1 else None)
            with torch.no_grad():
                self._keep("attn_logits", attention_logit_max(module, query, key))

        def hidden(module, inputs, output):
            self._keep("ffn_hidden", tensor_max(output))

        for name, module in model.named_modules():
            leaf = name.rsplit(".", 1)[-1]
            if name.rsplit(".", 2)[-2:-1] == ["layers"]:  # encoder.layers.3, decoder.layers.0
                self.handles += [module.register_forward_pre_hook(stream_in),
                                 module.register_forward_hook(stream_out)]
            elif leaf.endswith("layer_norm"):
                self.handles.append(module.register_forward_pre_hook(stream_in))
            elif is_attention(module):
                self.handles.append(module.register_forward_pre_hook(logits, with_kwargs=True))
            elif leaf == "fc1":
                self.handles.append(module.register_forward_hook(hidden))

    def before_forward(self, step, sample):
        self.current = {}
        self.sample_size = float(sample["ntokens"])  # fairseq's sample size for token-level criteria

    def after_backward(self, step, model):
        # fairseq has divided the summed loss's gradients by the sample size by now
        g = max((float(p.grad.detach().abs().max()) for p in model.parameters() if p.grad is not None), default=0.0)
        self.current["grad_mean"] = g
        self.current["grad"] = g * self.sample_size
        for q in self.steps:
            self.steps[q].append(self.current.get(q, float("nan")))

    def after_update(self, step, model): ...

    def detach(self):
        for h in self.handles:
            h.remove()
        self.handles = []


def summarise(steps: dict, losses: list) -> dict:
    """Per quantity: the maximum over the updates, the update it came at, fp16 headroom, first update over
    65504 (None: never); the updates recorded and the last loss."""
    out = {"updates": len(steps["grad"]), "last_loss_bits": losses[-1] if losses else None}
    for q in (*QUANTITIES, "grad_mean"):
        vals = [v for v in steps[q]]
        finite = [v for v in vals if math.isfinite(v)]
        peak = max(finite) if finite else float("nan")
        over = next((i + 1 for i, v in enumerate(vals) if not math.isfinite(v) or v > FP16_MAX), None)
        out[q] = {"max": peak, "at_update": vals.index(peak) + 1 if finite else None,
                  "fp16_headroom": FP16_MAX / peak if finite and peak > 0 else float("nan"),
                  "bf16_headroom": BF16_MAX / peak if finite and peak > 0 else float("nan"),
                  "first_update_over_fp16": over}
    return out


def run_fp16_headroom(data_bin, out, models: Sequence[str] = ("tfixup", "postln", "preln"), spec=None,
                      depths: Sequence[int] = (6, 24, 100), steps: Sequence[int] = (200,), lr: float = 1e-3,
                      warmup_updates: int = 200, decay_period: int = 4000, split: str = "train", seed: int = 1,
                      device: str = "cpu", written_by: dict = None, log: Callable[[str], None] = print) -> dict:
    """Train each method at each depth (``steps``: updates per depth, or one number for all) on its own
    schedule (a method trained with warmup: the matched warmup over ``warmup_updates`` onto T-Fixup's
    curve; the others: no warmup; decay period ``decay_period``), recording the maxima. One JSON record
    per run under OUT/fp16_headroom/ (a run recorded with the same settings is not run again, so
    separate processes can share a sweep); then fp16_headroom.{json,md,png} from every record of these
    settings, whichever process wrote them."""
    from tfixup import methods
    from fairseq_tfixup.diagnostics import plots
    from fairseq_tfixup.diagnostics.train import train

    steps = list(steps) * len(depths) if len(steps) == 1 else list(steps)
    if len(steps) != len(depths):
        raise ValueError(f"--steps: give one number or one per depth ({len(depths)}), got {len(steps)}")
    spec = spec or ModelSpec()
    out = pathlib.Path(out)
    store = out / "fp16_headroom"
    settings = {"data_bin": str(data_bin), "split": split, "seed": seed, "lr": lr, "warmup_updates": warmup_updates,
                "decay_period": decay_period, "spec": dataclasses.asdict(spec)}
    for n, budget in zip(depths, steps):
        for m in models:
            path = store / f"{m}-{n}.json"
            if path.is_file() and json.loads(path.read_text()).get("settings") == {**settings, "steps": budget}:
                log(f"[fp16-headroom] {m} N={n}: recorded in {path}")
                continue
            warm = methods.method(m).warmup
            schedule = "matched" if warm else "nowarmup"
            s = dataclasses.replace(spec, model=m, encoder_layers=n, decoder_layers=n,
                                    extra=[*spec.extra, "--lr", f"{lr:g}", *(
                                        ["--decay-period", str(decay_period)] if warm else [])])
            rec = Headroom()
            log(f"[fp16-headroom] {m} N={n}: {budget} updates ({schedule})")
            hist = train(data_bin, s, schedule, budget, [rec], warmup_updates=warmup_updates if warm else decay_period,
                         split=split, seed=seed, device=device, log=log)
            run = {"method": m, "layers": n, "schedule": schedule, **summarise(rec.steps, hist["loss"])}
            atomic.write_json(path, {"settings": {**settings, "steps": budget}, "run": run,
                                     "curves": {**rec.steps, "loss": hist["loss"]}})
            log(f"[fp16-headroom] {m}/{n}: " + ", ".join(f"{q} {run[q]['max']:.3g}" for q in QUANTITIES))
    runs, curves = {}, {}
    for n, budget in zip(depths, steps):
        for m in models:
            path = store / f"{m}-{n}.json"
            rec = json.loads(path.read_text()) if path.is_file() else {}
            if rec.get("settings") == {**settings, "steps": budget}:
                runs[f"{m}/{n}"], curves[f"{m}/{n}"] = rec["run"], rec["curves"]
    meta = {**(written_by or {}), **settings, "depths": list(depths), "steps": steps, "models": list(models),
            "fp16_max": FP16_MAX, "bf16_max": BF16_MAX, "runs": runs, "first_over_fp16": first_over(runs)}
    atomic.write_json(out / "fp16_headroom.json", {**meta, "curves": curves})
    atomic.write_text(out / "fp16_headroom.md", markdown(meta))
    title = (f"largest |value| per update, {spec.dim}-{spec.ffn_dim}-{spec.heads}, lr {lr:g}, "
             f"{spec.dropout:g} dropout, --max-tokens {max_tokens(spec)} (dashed: fp16's 65504)")
    atomic.save_figure(out / "fp16_headroom.png", plots.fp16_headroom(list(models), list(depths), curves,
                                                                     QUANTITIES, FP16_MAX, title))
    log(f"[fp16-headroom] wrote {out}/fp16_headroom.{{json,md,png}} ({len(runs)} runs)")
    return meta


def max_tokens(spec) -> str:
    """The --max-tokens a spec trains with (its last one wins, as in fairseq's parser)."""
    flags = spec.flags()
    return flags[len(flags) - 1 - flags[::-1].index("--max-tokens") + 1]


def first_over(runs: dict) -> list:
    """(method, layers, quantity, update) of every run that left fp16's range, shallowest first, then earliest."""
    hits = [(r["layers"], r[q]["first_update_over_fp16"], r["method"], q) for r in runs.values() for q in QUANTITIES
            if r[q]["first_update_over_fp16"] is not None]
    return [{"method": m, "layers": n, "quantity": q, "update": u} for n, u, m, q in sorted(hits)]


def markdown(meta: dict) -> str:
    s = meta["spec"]
    lines = ["# fp16 headroom: the largest |value| in the first updates", "",
             *(f"- {k}: `{meta[k]}`" if k == "command" else f"- {k}: {meta[k]}"
               for k in ("command", "machine", "date_utc") if k in meta), "",
             f"{s['dim']}-{s['ffn_dim']}-{s['heads']}, N layers per side, dropout {s['dropout']}, lr {meta['lr']:g} "
             f"(warmup methods: matched warmup over {meta['warmup_updates']} updates onto lr sqrt(P / (P + t)), "
             f"P = {meta['decay_period']}; the others: no warmup, the same curve), "
             + ", ".join(f"{u} updates at N = {n}" for n, u in zip(meta["depths"], meta["steps"]))
             + f" of fairseq-train's update on `{meta['split']}` of `{meta['data_bin']}`, "
             f"seed {meta['seed']}, fp32. Each cell: the maximum over the updates (headroom 65504 / max in "
             "parentheses; below 1 it overflows fp16). bf16's largest value is 3.39e38: every cell's bf16 "
             "headroom is above 1e30.", "",
             "| method | N | residual | attn logits | FFN hidden | grad (summed loss) | grad (mean loss) | updates | "
             "last loss (bits) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in meta["runs"].values():
        cells = [f"{r[q]['max']:.3g} ({r[q]['fp16_headroom']:.3g})" for q in QUANTITIES]
        lines.append(f"| {r['method']} | {r['layers']} | " + " | ".join(cells) + f" | {r['grad_mean']['max']:.3g} | "
                     f"{r['updates']} | {r['last_loss_bits']:.3f} |")
    lines += ["", "Runs that left fp16's range (shallowest first, then earliest): "
              + ("; ".join(f"{h['method']} at N = {h['layers']}, {h['quantity']}, update {h['update']}"
                           for h in meta["first_over_fp16"]) or "none") + ".", ""]
    return "\n".join(lines)
