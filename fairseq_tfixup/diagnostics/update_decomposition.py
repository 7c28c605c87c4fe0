"""One SGD step's output change at initialisation, split by parameter group, against depth.

``update_size`` measures ||Delta f|| / eta after a step of every parameter (or of all but the biases).
This splits that step: for each group G (token embeddings, q/k weights, v weights, ...) it steps G
alone, from the same gradient of the mean token loss, and measures ||Delta f|| / eta. To first order
in eta the change is the sum of the groups' changes (as vectors), so a group whose change grows with
depth is one that makes the whole update grow. Each model variant is a set of fairseq flags (e.g.
T-Fixup as fairseq builds it; with its q/k/v biases zero at init; without positional embeddings),
measured at each depth N (layers per side), averaged over ``inits`` initialisations: every group at the
first eta, and the unions (every weight, every bias, everything) at every eta, which checks that the
first eta is small enough for the first-order picture (||Delta f|| / eta the same at each eta).
"""

import dataclasses
import json
import pathlib
import re
from typing import Callable, Dict, Sequence

import numpy as np

from tfixup import atomic
from tfixup import update_size as us
from fairseq_tfixup.diagnostics.models import ModelSpec, build

# a parameter's group, by the first pattern its fairseq name matches (re.search)
GROUPS = (
    ("embed", r"\.embed_tokens\.weight$"),
    ("output_proj", r"\.output_projection\.weight$"),
    ("positions", r"\.embed_positions\."),
    ("qk_weight", r"\.(q_proj|k_proj)\.weight$"),
    ("v_weight", r"\.v_proj\.weight$"),
    ("out_weight", r"\.out_proj\.weight$"),
    ("ffn_weight", r"\.(fc1|fc2)\.weight$"),
    ("qk_bias", r"\.(q_proj|k_proj)\.bias$"),
    ("v_bias", r"\.v_proj\.bias$"),
    ("out_bias", r"\.out_proj\.bias$"),
    ("ffn_bias", r"\.(fc1|fc2)\.bias$"),
    ("norm", r"layer_norm"),
)
# unions of groups, stepped together: every weight (all but the biases: update-size --no-bias-step), every
# bias, every parameter
UNIONS = us.UNIONS

# the variants of T-Fixup measured by default: name -> fairseq flags
VARIANTS = {
    "as_built": [],
    "zero_attn_bias": ["--tfixup-zero-attn-bias"],
    "no_positions": ["--no-token-positional-embeddings"],
    "zero_attn_bias_no_positions": ["--tfixup-zero-attn-bias", "--no-token-positional-embeddings"],
    "zero_attn_bias_scaled_positions": ["--tfixup-zero-attn-bias", "--tfixup-scale-positions"],
}


def group_of(name: str) -> str:
    for group, pattern in GROUPS:
        if re.search(pattern, name):
            return group
    return "other"


def selections(model) -> Dict[str, list]:
    """Group or union name -> the trainable parameters it steps (groups with no parameter left out)."""
    return us.selections(model, group_of)


def run_update_decomposition(data_bin, out, model: str = "tfixup", variants: Dict[str, Sequence[str]] = None,
                             spec=None, depths=(1, 4, 16, 64), etas=(1e-4, 1e-5), split: str = "valid",
                             n_sentences: int = 64, inits: int = 2, seed: int = 1, device: str = "cpu",
                             written_by: dict = None, log: Callable[[str], None] = print) -> dict:
    """Measures each variant not yet recorded under OUT/update_decomposition/ with these settings (one
    JSON record per variant, so variants can be measured by separate processes), then writes
    update_decomposition.{json,md,png} to ``out`` from every record of these settings: per variant, eta,
    group and depth, ||Delta f|| / eta (mean over inits) and its log-log slope against depth."""
    from fairseq_tfixup.diagnostics import data, plots  # matplotlib: only when measuring

    variants = dict(variants or VARIANTS)
    spec = dataclasses.replace(spec or ModelSpec(), dropout=0.0, model=model)
    out = pathlib.Path(out)
    store = out / "update_decomposition"
    settings = {"data_bin": str(data_bin), "split": split, "sentences": n_sentences, "inits": inits, "seed": seed,
                "model": model, "depths": list(depths), "etas": list(etas), "spec": dataclasses.asdict(spec)}
    for vname, flags in variants.items():
        if recorded(store / f"{vname}.json", settings, flags):
            log(f"[update-decomposition] {vname}: recorded in {store}")
            continue

        def measure(n, s):
            vspec = dataclasses.replace(spec, encoder_layers=n, decoder_layers=n, extra=[*spec.extra, *flags])
            args, task, m, criterion = build(data_bin, vspec, seed=s, device=device)
            m.train()  # dropout is 0
            batches = data.fixed_batches(task, args, split, n_sentences, device=device)
            loss, outputs = us.fairseq_adapter(criterion)
            us.gradient(m, batches, loss)
            before = us.outputs_now(m, batches, outputs)
            return {(sel, e): us.step_change(m, batches, outputs, params, us.sgd(eta), before)["logits"] / eta
                    for sel, params in selections(m).items() for e, eta in enumerate(etas)
                    if e == 0 or sel in UNIONS}  # the groups at the first eta; the unions at every eta

        def progress(n, at, vname=vname):
            log(f"[update-decomposition] {vname} N={n}: " + ", ".join(
                f"{sel} {np.nanmean(a):.3g}" for (sel, e), a in at.items() if e == 0))

        swept = us.sweep(depths, inits, seed, measure, progress)  # (selection, eta) -> [depth, init]
        sizes = {sel: np.stack([swept.get((sel, e), np.full((len(depths), inits), np.nan)) for e in range(len(etas))])
                 for sel, _ in swept}  # selection -> [eta, depth, init]
        rec = {"settings": settings, "flags": list(flags), "etas": {}}
        for e, eta in enumerate(etas):
            per = {}
            for sel, arr in sizes.items():
                if np.isnan(arr[e]).all():
                    continue
                mean = np.nanmean(arr[e], axis=1)
                per[sel] = {"df_over_eta": dict(zip(map(str, depths), mean.tolist())),
                            "loglog_slope": us.loglog_slope(depths, mean), "per_init": arr[e].tolist()}
            rec["etas"][f"{eta:g}"] = per
        atomic.write_json(store / f"{vname}.json", rec)
        w = rec["etas"][f"{etas[0]:g}"]
        log(f"[update-decomposition] {vname}: slopes (eta {etas[0]:g}): weights {w['weights']['loglog_slope']:+.2f}, "
            f"all {w['all']['loglog_slope']:+.2f}")
    result = {}
    for path in sorted(store.glob("*.json"), key=lambda p: (list(VARIANTS) + [p.stem]).index(p.stem)):
        rec = json.loads(path.read_text())
        if rec["settings"] == settings:
            result[path.stem] = {"flags": rec["flags"], "etas": rec["etas"]}
    meta = {**(written_by or {}), **settings, "groups": {g: p for g, p in GROUPS}, "variants": result}
    atomic.write_json(out / "update_decomposition.json", meta)
    atomic.write_text(out / "update_decomposition.md", markdown(meta))
    title = (f"one SGD step at initialisation, split by parameter group: {model}, d={spec.dim}, "
             f"{n_sentences} pairs of {split}, mean over {inits} inits, eta = {etas[0]:g}")
    atomic.save_figure(out / "update_decomposition.png",
                       plots.update_decomposition(list(depths), result, f"{etas[0]:g}", title))
    log(f"[update-decomposition] wrote {out}/update_decomposition.{{json,md,png}} ({len(result)} variants)")
    return meta


def recorded(path: pathlib.Path, settings: dict, flags) -> bool:
    """A record at ``path`` measured with these settings and flags."""
    if not path.is_file():
        return False
    rec = json.loads(path.read_text())
    return rec.get("settings") == settings and rec.get("flags") == list(flags)


def markdown(meta: dict) -> str:
    """One table per variant and eta: ||Delta f|| / eta per selection and depth, and the log-log slope."""
    depths = [str(d) for d in meta["depths"]]
    lines = [f"# One SGD step's output change, by parameter group: {meta['model']}", "",
             f"||Δf|| / η (RMS over the target tokens of {meta['sentences']} pairs of `{meta['split']}` of the "
             "change "
             f"of the logits), mean over {meta['inits']} initialisations; slope: log-log against N (0: independent "
             f"of depth). Model: {meta['spec']['dim']}-{meta['spec']['ffn_dim']}-{meta['spec']['heads']}, N layers "
             "per side, dropout 0. Groups are stepped alone from the same gradient; `weights` = every parameter but "
             "the biases, `biases` = every bias, `all` = everything.", ""]
    lines[1:1] = ["", *(f"- {k}: `{meta[k]}`" if k == "command" else f"- {k}: {meta[k]}"
                        for k in ("command", "machine", "date_utc") if k in meta)]
    for vname, v in meta["variants"].items():
        for eta, per in v["etas"].items():
            lines += [f"## {vname} (`{' '.join(v['flags']) or 'as fairseq builds it'}`), η = {eta}", "",
                      "| step | " + " | ".join(f"N={d}" for d in depths) + " | slope |",
                      "|---|" + "---|" * (len(depths) + 1)]
            for sel, r in per.items():
                lines.append(f"| {sel} | " + " | ".join(f"{r['df_over_eta'][d]:.4g}" for d in depths)
                             + f" | {r['loglog_slope']:+.2f} |")
            lines.append("")
    return "\n".join(lines)
