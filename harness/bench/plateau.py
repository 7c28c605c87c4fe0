"""Final quality at CPU scale (paper Table 1's claim): Multi30k runs trained until valid BLEU stops improving.

The quality study (harness/bench/quality.py) stops every run at 10 epochs, all still improving. Here each run
**continues** the quality study's run of the same method and seed in its folder (``execute``): scripts/train.sh
resumes it with MAX_EPOCH = ``--cap`` and fairseq's patience on valid BLEU (greedy, every epoch); then
scripts/evaluate.sh averages the last K epoch checkpoints, translates the test set and scores it. Runs (``MODES``):
T-Fixup without warmup, Post-LN and Pre-LN on the matched warmup, Post-LN with transformers' small init; two seeds,
the same model (128-256-4, 6+6), data, batch, lr and evaluation. The report gives test BLEU per method over seeds,
epochs to the plateau, updates and minutes to each baseline's final valid BLEU, and each same-seed T-Fixup vs
baseline sacreBLEU gap with its 95% paired-bootstrap interval. Resumable: runs are recorded under
OUT/plateau/runs/; a run cut short resumes from its last checkpoint. ``--wide``: the three methods at 256-512-4,
one seed (plateau-wide.*), whether the ordering holds as the model grows (an update takes about 2.1x as long).

    python -m harness.bench.plateau --smoke --out /tmp/plateau --iwslt DATA      # < 2 min, for the tests
    python -m harness.bench.plateau --out results/bench --multi30k work/data-bin/multi30k.de-en
    python -m harness.bench.plateau --wide --out results/bench --multi30k work/data-bin/multi30k.de-en --jobs 3
"""

import json
import pathlib
import statistics
import sys

from harness.bench import common, quality, runs as runlib
from harness import run_ledger, score
from tfixup import atomic

BASELINES = ("postln_matched", "preln_matched", "postln_si_matched")
THREE = ("postln_matched", "tfixup", "preln_matched")  # the baseline first: its 10 epochs are the quality study's
MODES = {
    "smoke": dict(cap=2, patience=1, max_update=40, runs=[("iwslt", "tfixup", 1)]),
    # cap: 40 epochs, 4x the quality study's budget (about 2.4 min an epoch on one CPU thread). Post-LN with
    # transformers' initialisation (small init) last: every Post-LN gap is stated against the better of the two
    "default": dict(cap=40, patience=5, max_update=0, runs=[("multi30k", m, s) for s in (1, 2) for m in THREE]
                    + [("multi30k", "postln_si_matched", s) for s in (1, 2)]),
    "wide": dict(cap=40, patience=5, max_update=0, model=dict(embed=256, ffn=512, heads=4, width="w256"),
                 runs=[("multi30k", m, 1) for m in THREE]),
}


def continued(cfg: dict, qrun: runlib.Run) -> runlib.Run:
    """The quality run ``qrun`` trained on: MAX_EPOCH = the cap, patience on valid BLEU; its id names its seed."""
    sets, extra = quality.split_args(qrun.args)
    i = extra.index("--patience")
    extra = extra[:i] + extra[i + 2:] + ["--patience", str(cfg["patience"]), "--best-checkpoint-metric", "bleu",
                                         "--maximize-best-checkpoint-metric"]
    longer = {"MAX_EPOCH": cfg["cap"], "MAX_UPDATE": cfg["max_update"]}
    sets = [s for s in sets if s.split("=", 1)[0] not in longer] + [f"{k}={v}" for k, v in longer.items()]
    rid = qrun.id if qrun.meta["seed"] != 1 else qrun.id + "-s1"
    return runlib.Run(rid, dict(qrun.meta), sorted(sets) + extra, qrun.data)


def make_runs(cfg: dict, qcfg: dict, data: dict) -> list:
    """(plateau run, the quality run it continues) per (corpus, method, seed) of the mode."""
    qruns = [quality.make_run(qcfg, data, *spec) for spec in cfg["runs"] if spec[0] in data]
    return [(continued(cfg, qrun), qrun) for qrun in qruns]


def configs(mode: str) -> tuple:
    """(this study's config, the quality config its runs start from: for ``wide``, the default at its model size)."""
    cfg = dict(MODES[mode], mode=mode)
    return cfg, dict(quality.MODES["smoke" if mode == "smoke" else "default"], **cfg.get("model", {}), mode=mode)


def plan(data: dict, mode: str = "default") -> list:
    """The study's runs (``data``: corpus -> data-bin), without the quality runs they continue."""
    return [run for run, _ in make_runs(*configs(mode), {c: pathlib.Path(p) for c, p in data.items()})]


def execute(run: runlib.Run, qrun: runlib.Run, out: pathlib.Path, threads: int) -> dict:
    """The quality run (its record into OUT/quality/runs/ unless there), kept, then trained on to the plateau."""
    qwork, qrec_path = runlib.work_dir("quality"), out / "quality" / "runs" / f"{qrun.id}.json"
    qrec = json.loads(qrec_path.read_text()) if qrec_path.is_file() else None
    recorded = qrec is not None and qrec.get("key") == qrun.key()
    if recorded and _finished(qwork / qrun.id):
        common.log(f"{run.id}: continuing {qwork / qrun.id} past the quality study's cap")
        at_cap = qrec
    else:  # the first epochs (or the rest of them): the quality study's run, its checkpoints kept
        at_cap = quality.execute(qrun, qwork, threads, keep=True)
        if at_cap["status"] != "ok":
            return {**at_cap, "id": run.id, "key": run.key(), "stage": "the quality run"}
        if not recorded:
            atomic.write_json(qrec_path, at_cap)
    rec = quality.execute(runlib.Run(qrun.id, run.meta, run.args, run.data), qwork, threads)
    rec.update(id=run.id, key=run.key(), continues=qrun.id, at_cap={k: at_cap.get(k) for k in ("test", "epochs")})
    return rec


def _finished(run_dir: pathlib.Path) -> bool:
    """RUN_DIR's training ended by itself (train.sh booked outcome 0 last) and left its checkpoints:
    a quality run interrupted on its way to the cap is resumed as the quality run, not continued."""
    booked = run_ledger.rows(run_dir)
    return bool(booked) and booked[-1][-1] == "0" and (run_dir / "checkpoints" / "checkpoint_last.pt").is_file()


def summarise(cfg: dict, records: dict, data: dict, n_runs: int) -> dict:
    rows = []
    for rec in records.values():
        test, walls = rec.get("test") or {}, dict(rec.get("wall_curve", []))
        bleu = [(u, b) for u, b in rec.get("bleu_curve", []) if b is not None]
        best_u, best_b = common.best(bleu, higher=True)
        per_epoch = rec["wall_curve"][0][0] if rec.get("wall_curve") else None  # updates per epoch
        row = {"id": rec["id"], "method": rec["method"], "seed": rec.get("seed", 1), "status": rec["status"],
               "test_bleu_tok": test.get("bleu_tok"), "test_bleu_detok": test.get("bleu_detok"),
               "at_cap_bleu_tok": ((rec.get("at_cap") or {}).get("test") or {}).get("bleu_tok"),
               "best_valid_bleu": best_b, "best_valid_bleu_epoch":
                   best_u // per_epoch if best_u and per_epoch else None,
               "final_valid_bleu": bleu[-1][1] if bleu else None, "epochs": rec.get("epochs"),
               "updates": rec["valid_curve"][-1][0] if rec.get("valid_curve") else None,
               "stopped_by": rec.get("stopped_by"), "train_wall_min": round(rec.get("train_wall_s", 0) / 60, 1),
               "averaged_k": (test.get("averaging") or {}).get("k")}
        # updates and minutes to reach each baseline's final (plateau) best valid BLEU, same seed
        for b in BASELINES:
            upd = row[f"updates_to_{b}_best"] = quality.bleu_to_best(
                rec, records.get(rec["id"].replace(f"-{rec['method']}-", f"-{b}-")))[0]
            row[f"min_to_{b}_best"] = round(walls[upd] / 60, 1) if upd in walls else None
        rows.append(row)
    per_method = {}
    for m in dict.fromkeys(r["method"] for r in rows):
        got = [r["test_bleu_detok"] for r in rows if r["method"] == m and r["test_bleu_detok"] is not None]
        per_method[m] = {"seeds": len(got), "sacrebleu_mean": round(statistics.mean(got), 2) if got else None,
                         "sacrebleu_min": min(got, default=None), "sacrebleu_max": max(got, default=None),
                         "epochs": [r["epochs"] for r in rows if r["method"] == m]}
    gaps = []
    paths = {c: pathlib.Path(p) / "test.raw.en" for c, p in data.items()}
    refs = {c: f.read_text(encoding="utf-8").splitlines() if f.is_file() else None for c, f in paths.items()}
    for rec in records.values():
        if rec["method"] != "tfixup" or not rec.get("test_hypotheses"):
            continue
        for b in BASELINES:
            base = records.get(rec["id"].replace("-tfixup-", f"-{b}-"))
            if base and base.get("test_hypotheses") and refs.get(rec["corpus"]):
                gaps.append({"tfixup": rec["id"], "baseline": base["id"], **score.paired_bootstrap(
                    rec["test_hypotheses"], base["test_hypotheses"], refs[rec["corpus"]],
                    lowercase=(rec.get("test") or {}).get("lowercase", True))})
    return {**common.study_result("plateau", cfg, data, records, quality.CORPORA, n_runs), "n_runs": n_runs,
            "rows": sorted(rows, key=lambda r: (list(quality.ARMS).index(r["method"]), r["seed"])),
            "per_method": per_method, "gaps": gaps, "records": records}


def report(res: dict) -> str:
    cfg, q = res["config"], res["config"]["quality"]
    text = runlib.report_head("Final quality: Multi30k De-En, trained to the plateau (CPU)", res, res["n_runs"], (
        f"Model {q['embed']}-{q['ffn']}-{q['heads']}, {q['layers']}+{q['layers']} layers, {q['max_tokens']} tokens "
        f"per update, dropout {q['dropout']}, lr 5e-4, Adam (0.9, 0.98). T-Fixup: no LayerNorm, no warmup, "
        f"lr*sqrt(4000/(4000+t)); baselines: linear warmup over {q['warmup']} updates onto the same curve "
        f"(matched schedule). Each run continues the quality study's {q['max_epoch']}-epoch run (its row there), "
        f"then trains until valid BLEU (greedy, every epoch) has not improved for {cfg['patience']} epochs, at most "
        f"{cfg['cap']} epochs. Test: average of the last K epoch checkpoints (K in {q['avg']}, chosen on valid "
        f"loss), beam {q['beam']}, length penalty 0.3 (the IWSLT recipe's), the whole test set; sacreBLEU on "
        f"lowercased text (signature below).\n\n"
        "## Final test BLEU per method\n\n"))
    text += common.md_table(
        ["method", "seeds", "test sacreBLEU mean", "min", "max", "epochs run"],
        [[quality.ARMS[m].label, v["seeds"], _bleu(v["sacrebleu_mean"], 2), _bleu(v["sacrebleu_min"]),
          _bleu(v["sacrebleu_max"]), ", ".join(str(e) for e in v["epochs"])]
         for m, v in res["per_method"].items()]) + "\n\n"
    from tfixup.schedules import mean_lr  # each run's mean lr over its own updates

    fracs = [(r, mean_lr(quality.ARMS[r["method"]].schedule, 5e-4, r["updates"], q["warmup"], 4000) / 5e-4)
             for r in res["rows"] if r["updates"]]
    if fracs:
        text += ("**Mean lr over each run's own updates**, as a fraction of the peak 5e-4 (tfixup/schedules.py): "
                 + "; ".join(f"{r['id']} {f:.3f} ({r['updates']} updates)" for r, f in fracs) + ".\n\n")
    capped = [r for r in res["rows"] if r["status"] == "ok" and r["stopped_by"] != "patience"]
    if capped:
        text += ("**Not at a plateau:** " + "; ".join(
            f"{r['id']} was stopped by the {cfg['cap']}-epoch cap (best valid BLEU at epoch "
            f"{r['best_valid_bleu_epoch']})" for r in capped)
            + ": its test BLEU is where the cap left it, not where it would end.\n\n")
    if res["gaps"]:
        text += ("## T-Fixup vs each baseline, same seed: sacreBLEU gap with its 95% paired-bootstrap interval\n\n"
                 + common.md_table(["T-Fixup run", "baseline run", "gap", "95% interval", "p(gap <= 0)", "samples"],
                                   [[g["tfixup"], g["baseline"], g["gap"], f"[{g['ci95'][0]}, {g['ci95'][1]}]",
                                     g["p_gap_le_0"], g["samples"]] for g in res["gaps"]]) + "\n\n")
        text += seed_spread(res)

    def upd_min(row, baseline):
        upd = row.get(f"updates_to_{baseline}_best")
        return None if upd is None else f"{upd} ({row.get(f'min_to_{baseline}_best')})"

    text += "## Every run\n\n" + common.md_table(
        ["run", "status", "test BLEU (tok)", "test sacreBLEU", f"tok BLEU at {q['max_epoch']} epochs",
         "best valid BLEU", "at epoch", "epochs", "stopped by", "train min",
         "updates (min) to Post-LN's final best valid BLEU", "updates (min) to Pre-LN's", "K"],
        [[r["id"], r["status"], _bleu(r["test_bleu_tok"]), _bleu(r["test_bleu_detok"]), _bleu(r["at_cap_bleu_tok"]),
          _bleu(r["best_valid_bleu"]), r["best_valid_bleu_epoch"], r["epochs"], r["stopped_by"], r["train_wall_min"],
          upd_min(r, "postln_matched"), upd_min(r, "preln_matched"), r["averaged_k"]] for r in res["rows"]]) + "\n\n"
    sigs = sorted({(rec.get("test") or {}).get("sacrebleu_signature") for rec in res["records"].values()} - {None})
    return text + "sacreBLEU signature: " + ", ".join(f"`{s}`" for s in sigs) + "\n"


def seed_spread(res: dict) -> str:
    """Beside the paired-bootstrap intervals (which resample the test set of one pair of runs): how much
    T-Fixup's gap to each baseline moves from seed to seed."""
    rows = []
    for b in BASELINES:
        gaps = [g for g in res["gaps"] if res["records"][g["baseline"]]["method"] == b]
        if gaps:
            values = [g["gap"] for g in gaps]
            half = statistics.mean((g["ci95"][1] - g["ci95"][0]) / 2 for g in gaps)
            rows.append([quality.ARMS[b].label, len(values), ", ".join(f"{v:+.2f}" for v in values),
                         f"{statistics.mean(values):+.2f}", f"[{min(values):+.2f}, {max(values):+.2f}]",
                         f"{statistics.stdev(values):.2f}" if len(values) > 1 else "- (one seed)", f"{half:.2f}"])
    return ("Across seeds, beside those intervals: the gap of each seed, their mean, range and standard deviation "
            "(seed to seed: initialisation and data order), and the mean half-width of the seeds' 95% "
            "paired-bootstrap intervals (test-set resampling only).\n\n"
            + common.md_table(["baseline", "seeds", "gap per seed", "mean gap", "range over seeds",
                               "SD over seeds", "mean bootstrap half-width"], rows) + "\n\n") if rows else ""


def _bleu(v, digits: int = 1):
    """A BLEU score as the table shows it (one decimal, as sacreBLEU prints it; the mean over seeds two)."""
    return None if v is None else f"{v:.{digits}f}"


def plot(res: dict, path: pathlib.Path) -> None:
    fig, (loss_ax, bleu_ax) = common.pyplot().subplots(1, 2, figsize=(12, 4.5))
    quality.draw_curves(loss_ax, bleu_ax, res["records"].values(),
                        lambda rec, arm: "-" if rec.get("seed", 1) == 1 else "--", markersize=3)
    quality.finish_axes(loss_ax, bleu_ax, title="solid: seed 1, dashed: seed 2", title_fontsize=7)
    q = res["config"]["quality"]
    fig.suptitle(f"Multi30k De-En, {q['embed']}-{q['ffn']}-{q['heads']}, {q['layers']}+{q['layers']}: trained until "
                 "valid BLEU stops improving", fontsize=10)
    atomic.save_figure(path, fig)


def main(argv=None):
    p = runlib.study_parser(__doc__.split("\n\n")[0], "plateau.{json,md,png}, plateau/runs/, quality/runs/")
    p.add_argument("--multi30k", help="data-bin of the full Multi30k De-En (scripts/prepare-corpus.sh)")
    p.add_argument("--iwslt", help="data-bin of the IWSLT'14 sample (smoke mode)")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1, one thread each)")
    p.add_argument("--cap", type=int, help="the most epochs a run trains (default: the mode's)")
    p.add_argument("--patience", type=int, help="epochs without a better valid BLEU that end a run")
    p.add_argument("--wide", action="store_true",
                   help="the three methods at 256-512-4, one seed (plateau-wide.{json,md,png}, plateau-wide/runs/)")
    args = p.parse_args(argv)
    if args.wide and args.mode == "smoke":
        p.error("--wide and --smoke: give one of them")
    cfg, qcfg = configs("wide" if args.wide else args.mode)
    cfg = dict(runlib.with_overrides(cfg, args, ("cap", "patience")), quality=qcfg)
    data = {c: pathlib.Path(getattr(args, c)) for c in ("multi30k", "iwslt") if getattr(args, c)}
    if not data:
        p.error("give --multi30k DATA (or --iwslt DATA with --smoke)")
    pairs = make_runs(cfg, qcfg, data)
    continues, runs = {run.id: qrun for run, qrun in pairs}, [run for run, _ in pairs]
    out = pathlib.Path(args.out)
    runlib.run_study("plateau" + ("-wide" if args.wide else "") + args.tag, out, runs,
                     lambda recs: summarise(cfg, recs, {c: str(v) for c, v in data.items()}, len(runs)),
                     plot, report, "valid loss and valid BLEU vs updates, to the plateau", args.jobs,
                     execute=lambda r, work: execute(r, continues[r.id], out, args.threads),
                     report_only=args.report_only, only=args.only,
                     run_dir=lambda rid: runlib.work_dir("quality") / continues[rid].id)  # where it trains
    return 0


if __name__ == "__main__":
    sys.exit(main())
