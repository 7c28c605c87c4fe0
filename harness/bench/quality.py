"""Translation quality: T-Fixup (no warmup) vs Post-LN + warmup vs Pre-LN, trained up to a fixed epoch cap.

Each run is the project's own chain, as a user runs it: ``scripts/train.sh --cpu`` (the experiment's config with the
study's overrides; fairseq's ``--eval-bleu`` scores valid, greedy, at each epoch: the BLEU-vs-updates curves) until
valid loss stops improving for ``patience`` epochs or ``max_epoch`` (10) ends it, then ``scripts/evaluate.sh --cpu``
(the last K epoch checkpoints averaged, K chosen on valid; tokenized BLEU and sacreBLEU on the whole test set). One
model size for every method, the CPU main job's (128-256-4, 6+6 layers), which does not reach its plateau within an
hour on this CPU (docs/measurements.md): hence the cap, which favours whichever method learns faster early (read
the BLEU-vs-updates curves beside the table). Corpora, prepared offline from ../shared/data:

  multi30k   full Multi30k De-En (29k train, 1014 valid, test_2016_flickr 1000):
             scripts/prepare-corpus.sh (command in docs/measurements.md)
  iwslt      the real IWSLT'14 De-En 18.6k-pair train sample, 1000 valid, the full test set (6750):
             scripts/prepare-iwslt14.sh --valid-lines 1000

    python -m harness.bench.quality --smoke --out /tmp/quality             # < 2 min, for the tests
    python -m harness.bench.quality --out results/bench --multi30k DATA1 --iwslt DATA2
"""

import json
import os
import pathlib
import re
import shlex
import shutil
import sys
import time

from harness.bench import common, runs as runlib
from harness.bench.unigram import unigram_level
from harness import fairseq_log, run_ledger, score
from tfixup import atomic, methods

# The study's configs: T-Fixup's and Pre-LN's own, every other method the Post-LN config with its METHOD.
CONFIGS = {"tfixup": "iwslt14_de_en_tfixup", "preln": "iwslt14_de_en_preln"}


def study_arms() -> dict:
    """arm name -> common.Arm, from tfixup/methods.py: each method of the study on its own paper's schedule, the
    config's, under its name (T-Fixup and RAdam without warmup, P = 4000, the others inverse_sqrt after warmup) and,
    trained with warmup, on the matched one (``NAME_matched``); and T-Fixup with P = W (``tfixup_pw``)."""
    out = []
    for name in methods.studied("quality"):
        warmup = methods.method(name).warmup
        out.append(common.arm(name, "warmup" if warmup else "nowarmup", name=name))
        if warmup:
            out.append(common.arm(name, "matched"))
    out.append(common.arm("tfixup", "nowarmup_w"))
    return common.arm_table(out)


ARMS = study_arms()
BASELINE = "postln"
# the Post-LN baseline on either schedule, with fairseq's initialisation and with transformers' (small init)
BASELINE_SCHEDULES = ("postln", "postln_matched", "postln_si", "postln_si_matched")
CORPORA = {"multi30k": "Multi30k De-En (full; test_2016_flickr)", "iwslt": "IWSLT'14 De-En sample (full test set)"}

MODES = {
    "smoke": dict(embed=32, ffn=64, heads=2, layers=2, max_tokens=1024, max_epoch=1, max_update=20,
                  patience=2, warmup=10, dropout=0.1, runs=[("iwslt", "tfixup")], keep_last=2, avg="1 2",
                  beam=1, log_interval=10),
    "default": dict(embed=128, ffn=256, heads=4, layers=6, max_tokens=4096, max_epoch=10, max_update=0,
                    patience=3, warmup=400, dropout=0.3, keep_last=10, avg="1 5 10", beam=4, log_interval=50,
                    # every arm on Multi30k (runs=None: ARMS when planned); T-Fixup and the baseline on the
                    # IWSLT'14 sample; second seeds of T-Fixup and of Post-LN (the first 10 epochs of plateau.py's
                    # runs) and of the two baselines closest to T-Fixup, on their better (matched) schedule
                    runs=None, more_runs=[("iwslt", "tfixup"), ("iwslt", "postln"), ("multi30k", "tfixup", 2),
                                          ("multi30k", "postln_matched", 2), ("multi30k", "preln_matched", 2),
                                          ("multi30k", "dlcl_matched", 2),
                                          # Post-LN with transformers' initialisation (small init), the other
                                          # Post-LN baseline of every gain: its second seed on the matched warmup
                                          ("multi30k", "postln_si_matched", 2)]),
}


def overrides(cfg: dict, method: str, seed: int = 1) -> dict:
    """The config values this study sets for the arm METHOD, the same for every arm but its method and schedule."""
    o = {"EMBED_DIM": cfg["embed"], "FFN_DIM": cfg["ffn"], "HEADS": cfg["heads"],
         "ENCODER_LAYERS": cfg["layers"], "DECODER_LAYERS": cfg["layers"], "MAX_TOKENS": cfg["max_tokens"],
         "BATCH_SHARDS": 1, "MAX_EPOCH": cfg["max_epoch"], "MAX_UPDATE": cfg["max_update"],
         "DROPOUT": cfg["dropout"], "KEEP_LAST": cfg["keep_last"], "AVG_CANDIDATES": cfg["avg"],
         "BEAM": cfg["beam"], "SAVE_INTERVAL_UPDATES": 0, "LOG_INTERVAL": cfg["log_interval"], "SEED": seed,
         # pinned here, not left to the configs: one protocol for every run of the study, and
         # the same as the convergence study's (no gradient clipping)
         "CLIP_NORM": 0, "LR": "5e-4"}
    arm = ARMS[method]
    if method != "tfixup":
        o["WARMUP_UPDATES"] = cfg["warmup"]  # the configs' 4000 would not end within a CPU run
    if arm.schedule == "matched":
        o["SCHEDULE"] = "matched"  # onto T-Fixup's curve, DECAY_PERIOD (4000) as T-Fixup's
    elif arm.schedule == "nowarmup_w":
        o["DECAY_PERIOD"] = cfg["warmup"]
        del o["WARMUP_UPDATES"]
    if arm.method not in CONFIGS and arm.method != "postln":  # the Post-LN config, run with another METHOD
        o["METHOD"] = arm.method
    return o


def run_id(corpus: str, method: str, seed: int = 1, width: str = "") -> str:
    """e.g. multi30k-tfixup, multi30k-postln_matched-s2; multi30k-w256-tfixup for another model ``width``."""
    return f"{corpus}{'-' + width if width else ''}-{method}" + (f"-s{seed}" if seed != 1 else "")


def make_run(cfg: dict, data: dict, corpus: str, method: str, seed: int = 1) -> runlib.Run:
    """The run: the config values (KEY=VALUE), then fairseq-train flags: JSON log, patience, valid BLEU each epoch."""
    args = [f"{k}={v}" for k, v in sorted(overrides(cfg, method, seed).items())] + [
        "--log-format", "json", "--patience", str(cfg["patience"]), "--eval-bleu", "--eval-bleu-detok", "moses",
        "--eval-bleu-remove-bpe", "--eval-bleu-args", json.dumps({"beam": 1, "max_len_a": 1.2, "max_len_b": 10}),
        "--required-batch-size-multiple", "1"]
    return runlib.Run(run_id(corpus, method, seed, cfg.get("width", "")),
                      dict(corpus=corpus, method=method, seed=seed), args, str(data[corpus]))


def plan(data: dict, mode: str = "default") -> list:
    """The study's runs (``data``: corpus -> data-bin)."""
    return make_runs(dict(MODES[mode], mode=mode), {c: pathlib.Path(p) for c, p in data.items()})


def make_runs(cfg: dict, data: dict) -> list:
    specs = cfg["runs"] if cfg["runs"] is not None else [("multi30k", arm) for arm in ARMS]
    return [make_run(cfg, data, *spec) for spec in specs + cfg.get("more_runs", []) if spec[0] in data]


def split_args(args: list) -> tuple:
    """(config values, KEY=VALUE for --set; fairseq-train flags) of a run's arguments."""
    sets = [a for a in args if re.match(r"^[A-Z_]+=", a)]
    return sets, [a for a in args if a not in sets]


def _sh(script: str, *args) -> list:
    return ["bash", str(common.REPO / "scripts" / script), *map(str, args)]


def train_wall(out: pathlib.Path, fallback: float) -> tuple:
    """(seconds, segments) of training over the train.sh calls booked in train_runs.tsv; else `fallback`."""
    rows = run_ledger.rows(out)
    return (float(sum(int(r[1]) - int(r[0]) for r in rows)), len(rows)) if rows else (round(fallback, 1), 1)


def wall_curve(epochs: list) -> list:
    """(update, training seconds so far) at each epoch's end, in log order. fairseq's train_wall restarts at 0 with
    each train.sh call: a restart adds the last call's last value (its unfinished epoch, redone, is not counted)."""
    walls, offset, last = {}, 0.0, 0.0
    for r in (r for r in epochs if "train_num_updates" in r):
        if r["train_wall"] < last:  # a new train.sh call
            offset += last
        last = r["train_wall"]
        walls[int(r["train_num_updates"])] = round(offset + last, 1)
    return sorted(walls.items())


def execute(run: runlib.Run, work: pathlib.Path, threads: int, keep: bool = False) -> dict:
    """train.sh then evaluate.sh for one (corpus, method, seed); the record holds curves, results and samples.
    ``keep``: leave the checkpoints, for a run that goes on training (harness/bench/plateau.py)."""
    out = work / run.id
    last = out / "checkpoints" / "checkpoint_last.pt"
    if last.is_file() and (out / "config.resolved.json").is_file():  # interrupted: train.sh resumes from it
        common.log(f"{run.id}: resuming from {last}")
    elif out.exists():
        shutil.rmtree(out)  # cut short before its first checkpoint: start again, cleanly
    out.mkdir(parents=True, exist_ok=True)
    exp = CONFIGS.get(ARMS[run.meta["method"]].method, "iwslt14_de_en_postln")
    sets, extra = split_args(run.args)
    train_cmd = _sh("train.sh", "--cpu", *(x for s in sets for x in ("--set", s)), exp, run.data, out, "--", *extra)
    # evaluation reads the run's recorded config; only evaluation keys may be set there
    eval_flags = [x for s in sets if s.split("=")[0] in ("AVG_CANDIDATES", "BEAM") for x in ("--set", s)]
    eval_cmd = _sh("evaluate.sh", "--cpu", *eval_flags, exp, run.data, out)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONWARNINGS="ignore")
    record = {"id": run.id, **run.meta, "key": run.key(), "config": exp, "overrides": sets, "extra_train_args": extra,
              "train_command": " ".join(map(shlex.quote, train_cmd)),
              "evaluate_command": " ".join(map(shlex.quote, eval_cmd))}
    t0 = time.time()
    rc = runlib.run_logged(train_cmd, out / "train.out", env)
    record["train_wall_s"], record["train_segments"] = train_wall(out, time.time() - t0)
    text = (out / "train.log").read_text(errors="replace") if (out / "train.log").exists() else ""
    parsed = fairseq_log.parse_train_log(text)
    # a resumed run logs again from its last checkpoint: one point per update, the latest
    valid = {int(r["valid_num_updates"]): r for r in parsed["valid"]}
    walls, cmd_file = wall_curve(parsed["epoch"]), out / "train_command.sh"
    record.update(status=runlib.run_status(text, parsed, rc),
                  valid_curve=[(u, valid[u]["valid_loss"]) for u in sorted(valid)],
                  bleu_curve=[(u, valid[u].get("valid_bleu")) for u in sorted(valid)], wall_curve=walls,
                  epochs=len(walls), stopped_by="patience" if "early stop" in text else "max epoch/update",
                  fairseq_train_command=cmd_file.read_text().strip() if cmd_file.exists() else None)
    if record["status"] != "ok":
        record["error_tail"] = (out / "train.out").read_text(errors="replace").strip().splitlines()[-5:]
        return record
    t0 = time.time()
    rc = runlib.run_logged(eval_cmd, out / "evaluate.out", env)
    record["eval_wall_s"] = round(time.time() - t0, 1)
    results = out / "eval" / "results.json"
    if rc != 0 or not results.exists():
        record["status"] = "eval-error"
        record["error_tail"] = (out / "evaluate.out").read_text(errors="replace").strip().splitlines()[-5:]
        return record
    res = json.loads(results.read_text())
    record["test"] = {**{k: res.get(k) for k in ("bleu_tok", "bleu_detok", "sacrebleu_signature", "sentences",
                                                 "num_updates", "beam", "lenpen")},
                      "averaging": res.get("averaging", {}).get("chosen"),
                      "lowercase": res["config"]["LOWERCASE"] == "1"}
    record["samples"] = samples(out / "eval" / "generate-test.txt", 3)
    # the detokenized test hypotheses in sentence-id order, as evaluate.sh scored them: paired bootstrap between
    # runs (harness/bench/plateau.py)
    hyps, _, _ = score.read_generate_output((out / "eval" / "generate-test.txt").read_text(encoding="utf-8"))
    record["test_hypotheses"] = score.detokenize(hyps, res["config"]["TGT"])
    if not keep:
        shutil.rmtree(out / "checkpoints", ignore_errors=True)  # GBs; the record keeps what was measured
        (out / "eval" / "averaged.pt").unlink(missing_ok=True)
    return record


def samples(generate_txt: pathlib.Path, n: int) -> list:
    """The first n test sentences (by id): source, reference, hypothesis (BPE removed)."""
    lines = score.generate_lines(generate_txt.read_text(encoding="utf-8"))
    s, t, h = lines["S"], lines["T"], lines["H"]
    return [{"id": i, "source": s.get(i), "reference": t.get(i), "hypothesis": h.get(i)} for i in sorted(h)[:n]]


def bleu_to_best(rec: dict, base) -> tuple:
    """common.to_best of REC's valid BLEU against BASE's (ratio to 2 digits); (None, None) without BASE."""
    return common.to_best(rec.get("bleu_curve", []), (base or {}).get("bleu_curve", []), higher=True, digits=2)


def versus_methods(records: dict) -> dict:
    """corpus -> method -> T-Fixup (seed 1) ``versus`` the method on each schedule it ran (its row's; matched), and
    its better schedule, chosen on valid (the higher best valid BLEU), with its further seeds paired."""
    out = {}
    for rec in (r for r in records.values() if r["method"] == "tfixup" and r.get("seed", 1) == 1):
        for name in (n for n in methods.studied("quality") if n != "tfixup"):
            arms = {arm: versus(rec, records.get(run_id(rec["corpus"], arm))) for arm in (name, f"{name}_matched")}
            arms = {arm: v for arm, v in arms.items() if v}
            if arms:
                better = max(arms, key=lambda a: arms[a]["best_valid_bleu"])
                # further seeds, paired: T-Fixup's seed k against the better schedule's seed k
                seeds = {r["seed"]: versus(records.get(run_id(rec["corpus"], "tfixup", r["seed"])), r)
                         for r in records.values()
                         if r["corpus"] == rec["corpus"] and r["method"] == better and r.get("seed", 1) != 1}
                out.setdefault(rec["corpus"], {})[name] = {
                    "arms": arms, "better": better, "better_seeds": {k: v for k, v in sorted(seeds.items()) if v}}
    return out


def versus(tfixup, base):
    """T-Fixup's run against a baseline's: the baseline's best valid and test BLEU, T-Fixup's ratio to that best
    valid BLEU, the test BLEU gap (tokenized); None without both runs' valid BLEU."""
    b_best = common.best(base.get("bleu_curve", []), higher=True)[1] if base else None
    if tfixup is None or b_best is None:
        return None
    t_test, b_test = ((r.get("test") or {}).get("bleu_tok") for r in (tfixup, base))
    return {"best_valid_bleu": b_best, "test_bleu_tok": b_test, "tfixup_ratio": bleu_to_best(tfixup, base)[1],
            "tfixup_gap": round(t_test - b_test, 2) if None not in (t_test, b_test) else None}


def summarise(cfg: dict, records: dict, data: dict, n_runs: int) -> dict:
    rows = []
    for rec in records.values():
        test = rec.get("test") or {}
        walls, arm = dict(rec.get("wall_curve", [])), ARMS[rec["method"]]
        row = {"id": rec["id"], "corpus": rec["corpus"], "method": rec["method"], "seed": rec.get("seed", 1),
               # its method's own paper's schedule, its config's, is "config"
               "schedule": "config" if arm.name == arm.method else arm.schedule, "status": rec["status"],
               "test_bleu_tok": test.get("bleu_tok"), "test_bleu_detok": test.get("bleu_detok"),
               "signature": test.get("sacrebleu_signature"), "test_sentences": test.get("sentences"),
               "best_valid_bleu": common.best(rec.get("bleu_curve", []), higher=True)[1],
               "best_valid_loss": common.best(rec.get("valid_curve", []))[1],
               "updates": rec["valid_curve"][-1][0] if rec.get("valid_curve") else None,
               "epochs": rec.get("epochs"), "stopped_by": rec.get("stopped_by"),
               "train_wall_min": round(rec.get("train_wall_s", 0) / 60, 1),
               "train_segments": rec.get("train_segments", 1), "averaged_k": (test.get("averaging") or {}).get("k")}
        # updates to each Post-LN baseline's (seed 1) best valid BLEU, and as a fraction of the baseline's own
        for b in BASELINE_SCHEDULES:
            upd, row[f"ratio_to_{b}"] = bleu_to_best(rec, records.get(run_id(rec["corpus"], b)))
            row[f"updates_to_{b}_best_valid_bleu"] = upd
            row[f"wall_min_to_{b}_best_valid_bleu"] = round(walls[upd] / 60, 1) if upd in walls else None
        # kept under the old names: against fairseq's inverse_sqrt baseline
        row["updates_to_baseline_best_valid_bleu"] = row[f"updates_to_{BASELINE}_best_valid_bleu"]
        row["wall_min_to_baseline_best_valid_bleu"] = row[f"wall_min_to_{BASELINE}_best_valid_bleu"]
        rows.append(row)
    return {**common.study_result("quality", cfg, data, records, CORPORA, n_runs), "n_runs": n_runs,
            "unigram_level": {c: unigram_level(pathlib.Path(p), "de", "en") for c, p in data.items()},
            "rows": sorted(rows, key=lambda r: (r["corpus"], list(ARMS).index(r["method"]), r["seed"])),
            "per_method": versus_methods(records), "records": records}


def report(res: dict) -> str:
    cfg = res["config"]
    text = runlib.report_head(f"Translation quality, at most {cfg['max_epoch']} epochs (CPU)", res, res["n_runs"], (
        f"Model {cfg['embed']}-{cfg['ffn']}-{cfg['heads']}, {cfg['layers']}+{cfg['layers']} layers, "
        f"{cfg['max_tokens']} tokens per update, dropout {cfg['dropout']}, lr 5e-4, Adam (0.9, 0.98); "
        f"T-Fixup: no LayerNorm, no warmup (lr*sqrt(4000/(4000+t))); baselines: linear warmup over "
        f"{cfg['warmup']} updates, then either fairseq's inverse_sqrt (lr*sqrt({cfg['warmup']}/t)) or, **matched**, "
        f"T-Fixup's curve lr*sqrt(4000/(4000+t)) (inverse_sqrt_matched: after warmup the same rate as T-Fixup at "
        f"every update); P = W: T-Fixup without warmup, P = {cfg['warmup']}. "
        f"Training stops when valid loss has not improved for {cfg['patience']} epochs "
        f"(at most {cfg['max_epoch']} epochs); train min: wall clock of all its train.sh calls (a run in N parts "
        f"was resumed from its last checkpoint N-1 times, on a machine whose load differed), min to it: fairseq's "
        f"train_wall (training only, over all its calls) when it got there. Test: average of the last K epoch "
        f"checkpoints (K chosen on valid), beam {cfg['beam']}, whole test set; tokenized BLEU on the lowercased "
        f"tokenized text and detokenized sacreBLEU (signature below). Valid BLEU: greedy, every epoch (fairseq "
        f"--eval-bleu). Updates to a baseline's best valid BLEU (seed 1's), and that as a fraction of the updates "
        f"the baseline took to it.\n\n"
        + "".join(f"Unigram level of the {CORPORA[c]} valid set (harness/bench/unigram.py, label-smoothed loss in "
                  f"bits of the best unigram model fit on train): **{lv['train_fit']}** ({lv['oracle']} fit on valid "
                  f"itself).\n" for c, lv in sorted(res.get("unigram_level", {}).items())) + "\n"))
    w = cfg["warmup"]
    for corpus in dict.fromkeys(r["corpus"] for r in res["rows"]):
        budget = max((r["updates"] for r in res["rows"] if r["corpus"] == corpus and r["updates"]), default=0)
        if budget:
            text += common.mean_lr_text(
                [("no warmup", "nowarmup", w, 4000), ("matched warmup", "matched", w, 4000),
                 ("warmup", "warmup", w, 4000), ("P = W", "nowarmup", w, w)], budget, 5e-4,
                f"{budget}-update ({CORPORA[corpus]}, the longest run's)")
    text += common.md_table(
        ["corpus", "method", "status", "test BLEU (tok)", "test sacreBLEU", "best valid BLEU", "best valid loss",
         "updates", "epochs", "stopped by", "train min", "to Post-LN + warmup's best valid BLEU (updates, x)",
         "min to it", "to Post-LN + matched warmup's (updates, x)", "K"],
        [[r["corpus"], ARMS[r["method"]].label + (f" (seed {r['seed']})" if r["seed"] != 1 else ""), r["status"],
          r["test_bleu_tok"], r["test_bleu_detok"], r["best_valid_bleu"], r["best_valid_loss"], r["updates"],
          r["epochs"], r["stopped_by"],
          f"{r['train_wall_min']}" + (f" ({r['train_segments']} parts)" if r["train_segments"] > 1 else ""),
          _to_cell(r, "postln"), r["wall_min_to_postln_best_valid_bleu"], _to_cell(r, "postln_matched"),
          r["averaged_k"]] for r in res["rows"]]) + "\n\n"
    text += common.versus_methods_md(
        res.get("per_method"),
        "Seed 1 of each (seed k: T-Fixup's seed k against the better schedule's seed k, where both ran). Ratio: "
        "T-Fixup's updates to reach the method's best valid BLEU / the method's updates to it; gap: T-Fixup's test "
        "BLEU (tok) minus the method's. The better schedule is chosen on seed 1's valid (the higher best valid BLEU); "
        "- : not run on that schedule.\n\n",
        ["corpus", "method", "test BLEU, config's schedule (warmup, or none in its paper)", "T-Fixup vs it",
         "test BLEU, matched warmup", "T-Fixup vs it", "better schedule (valid)", "T-Fixup vs the better"],
        _versus_cells)
    sigs = sorted({r["signature"] for r in res["rows"] if r["signature"]})
    text += ("sacreBLEU signature: " + ", ".join(f"`{s}`" for s in sigs)
             + "\n\n## Test translations (first three test sentences)\n\n")
    for rec in sorted(res["records"].values(), key=lambda r: (r["corpus"], list(ARMS).index(r["method"]),
                                                              r.get("seed", 1))):
        for s in rec.get("samples", []):
            text += (f"- **{rec['corpus']}, {ARMS[rec['method']].label}**, sentence {s['id']}\n"
                     f"  - source: {s['source']}\n  - reference: {s['reference']}\n  - hypothesis: {s['hypothesis']}\n")
    return text


def _versus_cells(name: str, v: dict) -> list:
    """A method's cells in the T-Fixup-against-every-method table: on its config's schedule (its paper's), on the
    matched warmup, on the better one (with its further seeds)."""
    cells = []
    for arm in (name, f"{name}_matched"):
        a = v["arms"].get(arm)
        cells += [None, None] if a is None else [a["test_bleu_tok"], _versus_text(a)]
    more = "".join(f"; seed {k}: {_versus_text(a)}" for k, a in v.get("better_seeds", {}).items())
    better = {"matched": "matched warmup", "nowarmup": "no warmup"}.get(ARMS[v["better"]].schedule,
                                                                       "the config's warmup")
    return cells + [better, _versus_text(v["arms"][v["better"]]) + more]


def _versus_text(arm: dict) -> str:
    return (("not reached" if arm["tfixup_ratio"] is None else f"{arm['tfixup_ratio']:.2f}x")
            + ("" if arm["tfixup_gap"] is None else f", {arm['tfixup_gap']:+.1f} BLEU"))


def _to_cell(row: dict, baseline: str):
    upd, ratio = row.get(f"updates_to_{baseline}_best_valid_bleu"), row.get(f"ratio_to_{baseline}")
    return None if upd is None else f"{upd} ({ratio:.2f}x)" if ratio is not None else str(upd)


def plot(res: dict, path: pathlib.Path) -> None:
    corpora = sorted({r["corpus"] for r in res["records"].values()})
    n = max(1, len(corpora))
    fig, axes = common.pyplot().subplots(2, n, figsize=(5.5 * n, 7), squeeze=False)
    for j, corpus in enumerate(corpora):
        draw_curves(axes[0][j], axes[1][j], [r for r in res["records"].values() if r["corpus"] == corpus])
        axes[0][j].set_title(CORPORA[corpus], fontsize=9)
        finish_axes(axes[0][j], axes[1][j])
        handles, labels = axes[0][j].get_legend_handles_labels()
        if len(labels) > 6:  # too many to sit on the curves: one legend, right of this corpus's plots
            for ax in (axes[0][j], axes[1][j]):
                ax.get_legend().remove()
            axes[0][j].legend(handles, labels, fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    atomic.save_figure(path, fig)


def draw_curves(loss_ax, bleu_ax, recs, linestyle=lambda rec, arm: arm.linestyle, **style) -> None:
    """The runs' valid loss and BLEU against updates, in their arm's color (labelled once), ``linestyle(rec, arm)``."""
    labelled = set()
    for rec in sorted(recs, key=lambda r: r["id"]):
        arm = ARMS[rec["method"]]
        kw = dict(color=arm.color, label=None if arm.name in labelled else arm.label, marker=".",
                  ls=linestyle(rec, arm), **style)
        labelled.add(arm.name)
        if rec.get("valid_curve"):
            loss_ax.plot(*zip(*rec["valid_curve"]), **kw)
        pts = [(u, b) for u, b in rec.get("bleu_curve", []) if b is not None]
        if pts:
            bleu_ax.plot(*zip(*pts), **kw)


def finish_axes(loss_ax, bleu_ax, **legend) -> None:
    common.finish_axes(loss_ax, "updates", "valid loss (bits, label-smoothed)", legend=legend)
    common.finish_axes(bleu_ax, "updates", "valid BLEU (greedy)", legend=legend)


def main(argv=None):
    p = runlib.study_parser(__doc__.split("\n\n")[0], "quality.{json,md,png}, quality/runs/")
    p.add_argument("--multi30k", help="data-bin of the full Multi30k De-En (scripts/prepare-corpus.sh)")
    p.add_argument("--iwslt", help="data-bin of the IWSLT'14 sample (scripts/prepare-iwslt14.sh --valid-lines 1000)")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2, one thread each)")
    args = p.parse_args(argv)
    cfg = dict(MODES[args.mode], mode=args.mode)
    data = {}
    if args.mode == "smoke" and not args.iwslt:  # its own tiny test set: an untrained model translates slowly
        data["iwslt"] = common.prepare_data(100, 20, None, args.data_root)
    data.update({c: pathlib.Path(getattr(args, c)) for c in ("multi30k", "iwslt") if getattr(args, c)})
    if not data:
        p.error("give --multi30k DATA and/or --iwslt DATA (see the module docstring for how to prepare them)")
    for corpus, path in data.items():
        if not (path / "dict.de.txt").is_file():
            p.error(f"--{corpus} {path}: not a fairseq data-bin for de-en (no dict.de.txt)")
    all_runs = make_runs(cfg, data)
    paths = {c: str(p) for c, p in data.items()}
    runlib.run_study("quality" + args.tag, args.out, all_runs,
                     lambda recs: summarise(cfg, recs, paths, len(all_runs)), plot, report,
                     "valid loss and valid BLEU vs updates", args.jobs, report_only=args.report_only,
                     execute=lambda r, work: execute(r, work, args.threads), only=args.only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
