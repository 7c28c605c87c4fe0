"""Translation quality: T-Fixup (no warmup) vs Post-LN + warmup vs Pre-LN, trained up to a fixed epoch cap.

Every run goes through the project's own chain, as a user runs it:
``scripts/train.sh --cpu`` (the experiment's config, with the study's
overrides) until valid loss stops improving (``--patience`` validations,
one per epoch, capped by ``--max-epoch``), then ``scripts/evaluate.sh --cpu``
(average of the last K epoch checkpoints, K chosen on valid; fairseq-generate
on the whole test set; tokenized BLEU and detokenized sacreBLEU with its
signature). During training fairseq's ``--eval-bleu`` scores the valid set
(greedy) at each validation, which gives the BLEU-vs-updates curves.

Corpora (prepare them first; both offline from ../shared/data):

  multi30k   full Multi30k De-En (29k train, 1014 valid, test_2016_flickr 1000):
             scripts/prepare-corpus.sh (command in docs/measurements.md)
  iwslt      the real IWSLT'14 De-En 18.6k-pair train sample, 1000 valid, the full test set (6750):
             scripts/prepare-iwslt14.sh --valid-lines 1000

Model: one size for every method, the CPU main job's (128-256-4, 6+6 layers,
4096 tokens per update, dropout 0.3). It does not reach its plateau in 30
minutes here: a first one-thread T-Fixup run on a loaded machine took 89
minutes for 8 epochs of Multi30k with valid BLEU still rising (27.0, 27.8 at
epochs 7, 8). The study therefore caps training at ``max_epoch`` (10) with
early stopping (``patience``) kept, and the report says per run whether
patience or the cap stopped it. With a cap the comparison favours whichever
method learns faster early: read the BLEU-vs-updates curves beside the table.
The baselines warm up over ``--warmup`` updates.

    python -m bench.quality --smoke --out /tmp/quality             # < 2 min, for the tests
    python -m bench.quality --out results/bench --multi30k DATA1 --iwslt DATA2
"""

import json
import os
import pathlib
import re
import shlex
import shutil
import sys
import time

from bench import common, runs as runlib
from pipeline import score

METHODS = {  # name: (config in configs/, its METHOD if the config's is not it, label)
    "tfixup": ("iwslt14_de_en_tfixup", None, "T-Fixup, no warmup"),
    "postln": ("iwslt14_de_en_postln", None, "Post-LN + warmup"),
    "preln": ("iwslt14_de_en_preln", None, "Pre-LN + warmup"),
    # the other methods (fairseq_tfixup/presets.py), each with its own paper's warmup
    "radam": ("iwslt14_de_en_postln", "radam", "RAdam (Post-LN), no warmup"),
    "dsinit": ("iwslt14_de_en_postln", "dsinit", "DS-Init + warmup"),
    "rfixup": ("iwslt14_de_en_postln", "rfixup", "R-Fixup + warmup"),
    "dlcl": ("iwslt14_de_en_postln", "dlcl", "DLCL + warmup"),
    "dlcl_preln": ("iwslt14_de_en_postln", "dlcl_preln", "DLCL-Pre-LN + warmup"),
    "deepnorm": ("iwslt14_de_en_postln", "deepnorm", "DeepNorm + warmup"),
    "admin": ("iwslt14_de_en_postln", "admin", "Admin + warmup"),
    "lri": ("iwslt14_de_en_postln", "lri", "LRI + warmup"),
}
BASELINE = "postln"
CORPORA = {"multi30k": "Multi30k De-En (full; test_2016_flickr)", "iwslt": "IWSLT'14 De-En sample (full test set)"}

MODES = {
    "smoke": dict(embed=32, ffn=64, heads=2, layers=2, max_tokens=1024, max_epoch=1, max_update=20,
                  patience=2, warmup=10, dropout=0.1, runs=[("iwslt", "tfixup")], keep_last=2, avg="1 2",
                  beam=1, log_interval=10),
    "default": dict(embed=128, ffn=256, heads=4, layers=6, max_tokens=4096, max_epoch=10, max_update=0,
                    patience=3, warmup=400, dropout=0.3, keep_last=10, avg="1 5 10", beam=4, log_interval=50,
                    runs=[("multi30k", "tfixup"), ("multi30k", "postln"), ("multi30k", "preln"),
                          ("iwslt", "tfixup"), ("iwslt", "postln")]
                    + [("multi30k", m)
                       for m in ("radam", "dsinit", "rfixup", "dlcl", "dlcl_preln", "deepnorm", "admin", "lri")]),
}


def overrides(cfg: dict, method: str) -> dict:
    """The config values this study sets, the same for every method but the schedule."""
    o = {"EMBED_DIM": cfg["embed"], "FFN_DIM": cfg["ffn"], "HEADS": cfg["heads"],
         "ENCODER_LAYERS": cfg["layers"], "DECODER_LAYERS": cfg["layers"], "MAX_TOKENS": cfg["max_tokens"],
         "BATCH_SHARDS": 1, "MAX_EPOCH": cfg["max_epoch"], "MAX_UPDATE": cfg["max_update"],
         "DROPOUT": cfg["dropout"], "KEEP_LAST": cfg["keep_last"], "AVG_CANDIDATES": cfg["avg"],
         "BEAM": cfg["beam"], "SAVE_INTERVAL_UPDATES": 0, "LOG_INTERVAL": cfg["log_interval"], "SEED": 1,
         # pinned here, not left to the configs: one protocol for every run of the study, and
         # the same as the convergence study's (no gradient clipping)
         "CLIP_NORM": 0, "LR": "5e-4"}
    if method != "tfixup":
        o["WARMUP_UPDATES"] = cfg["warmup"]  # the configs' 4000 would not end within a CPU run
    if METHODS[method][1]:
        o["METHOD"] = METHODS[method][1]
    return o


def extra_train_args(cfg: dict) -> list:
    """fairseq-train flags added after the config's: JSON log, patience, valid BLEU each epoch."""
    return ["--log-format", "json", "--patience", str(cfg["patience"]),
            "--eval-bleu", "--eval-bleu-detok", "moses", "--eval-bleu-remove-bpe",
            "--eval-bleu-args", json.dumps({"beam": 1, "max_len_a": 1.2, "max_len_b": 10}),
            "--required-batch-size-multiple", "1"]


def make_runs(cfg: dict, data: dict) -> list:
    out = []
    for corpus, method in cfg["runs"]:
        if corpus not in data:
            continue
        args = [f"{k}={v}" for k, v in sorted(overrides(cfg, method).items())] + extra_train_args(cfg)
        out.append(runlib.Run(f"{corpus}-{method}", dict(corpus=corpus, method=method), args, str(data[corpus])))
    return out


def _sh(script: str, *args) -> list:
    return ["bash", str(common.REPO / "scripts" / script), *map(str, args)]


def train_wall(out: pathlib.Path, fallback: float) -> tuple:
    """(seconds, segments) of training: a run resumed after a session's end trained in several
    train.sh calls, each booked in train_runs.tsv (start, end, ...); without that file, `fallback`."""
    booked = out / "train_runs.tsv"
    rows = [line.split("\t") for line in booked.read_text().splitlines() if line.strip()] if booked.exists() else []
    if not rows:
        return round(fallback, 1), 1
    return float(sum(int(r[1]) - int(r[0]) for r in rows)), len(rows)


def wall_curve(epochs: list) -> list:
    """(update, training seconds so far) at each epoch's end, from fairseq's end-of-epoch records in log
    order. fairseq's train_wall counts from the start of each train.sh call, so a resumed run's clock
    starts again at 0: each restart adds the previous call's last value (its unfinished epoch, redone
    after the resume, is not counted)."""
    walls, offset, last = {}, 0.0, 0.0
    for r in epochs:
        if "train_num_updates" not in r:
            continue
        if r["train_wall"] < last:  # a new train.sh call
            offset += last
        last = r["train_wall"]
        walls[int(r["train_num_updates"])] = round(offset + last, 1)
    return sorted(walls.items())


def execute(run: runlib.Run, work: pathlib.Path, threads: int) -> dict:
    """train.sh then evaluate.sh for one (corpus, method); the record holds curves, results and samples."""
    out = work / run.id
    resumable = (out / "checkpoints" / "checkpoint_last.pt").is_file() and (out / "config.resolved.json").is_file()
    if out.exists() and not resumable:
        shutil.rmtree(out)  # cut short before its first checkpoint: start again, cleanly
    if resumable:  # cut short (a session's end): train.sh resumes from checkpoint_last.pt
        common.log(f"{run.id}: resuming from {out / 'checkpoints' / 'checkpoint_last.pt'}")
    out.mkdir(parents=True, exist_ok=True)
    exp = METHODS[run.meta["method"]][0]
    sets = [a for a in run.args if re.match(r"^[A-Z_]+=", a)]
    extra = [a for a in run.args if a not in sets]
    set_flags = [x for s in sets for x in ("--set", s)]
    train_cmd = _sh("train.sh", "--cpu", *set_flags, exp, run.data, out, "--", *extra)
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
    parsed = common.parse_train_log(text)
    record["status"] = runlib.run_status(text, parsed, rc)
    # a resumed run logs again from its last checkpoint: one point per update, the latest
    valid = {int(r["valid_num_updates"]): r for r in parsed["valid"]}
    record["valid_curve"] = [(u, valid[u]["valid_loss"]) for u in sorted(valid)]
    record["bleu_curve"] = [(u, valid[u].get("valid_bleu")) for u in sorted(valid)]
    record["wall_curve"] = wall_curve(parsed["epoch"])
    record["epochs"] = len(record["wall_curve"])
    record["stopped_by"] = "patience" if "early stop" in text else "max epoch/update"
    cmd_file = out / "train_command.sh"
    record["fairseq_train_command"] = cmd_file.read_text().strip() if cmd_file.exists() else None
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
    record["test"] = {k: res.get(k) for k in ("bleu_tok", "bleu_detok", "sacrebleu_signature", "sentences",
                                              "num_updates", "beam", "lenpen")}
    record["test"]["averaging"] = res.get("averaging", {}).get("chosen")
    record["samples"] = samples(out / "eval" / "generate-test.txt", 3)
    shutil.rmtree(out / "checkpoints", ignore_errors=True)  # GBs; the record keeps what was measured
    (out / "eval" / "averaged.pt").unlink(missing_ok=True)
    return record


def samples(generate_txt: pathlib.Path, n: int) -> list:
    """The first n test sentences (by id): source, reference, hypothesis (BPE removed)."""
    lines = score.generate_lines(generate_txt.read_text(encoding="utf-8"))
    s, t, h = lines["S"], lines["T"], lines["H"]
    return [{"id": i, "source": s.get(i), "reference": t.get(i), "hypothesis": h.get(i)} for i in sorted(h)[:n]]


def first_reaching(curve: list, target: float):
    return next((u for u, v in curve if v is not None and v >= target), None)


def summarise(cfg: dict, records: dict, data: dict, n_runs: int) -> dict:
    rows = []
    for rec in records.values():
        test = rec.get("test") or {}
        bleus = [b for _, b in rec.get("bleu_curve", []) if b is not None]
        base = records.get(f"{rec['corpus']}-{BASELINE}")
        base_best = max((b for _, b in base.get("bleu_curve", []) if b is not None), default=None) if base else None
        upd = first_reaching(rec.get("bleu_curve", []), base_best) if base_best is not None else None
        walls = dict(rec.get("wall_curve", []))
        rows.append({
            "corpus": rec["corpus"], "method": rec["method"], "status": rec["status"],
            "test_bleu_tok": test.get("bleu_tok"), "test_bleu_detok": test.get("bleu_detok"),
            "signature": test.get("sacrebleu_signature"), "test_sentences": test.get("sentences"),
            "best_valid_bleu": max(bleus, default=None),
            "best_valid_loss": min((l for _, l in rec.get("valid_curve", [])), default=None),
            "updates": rec["valid_curve"][-1][0] if rec.get("valid_curve") else None,
            "epochs": rec.get("epochs"), "stopped_by": rec.get("stopped_by"),
            "train_wall_min": round(rec.get("train_wall_s", 0) / 60, 1), "train_segments": rec.get("train_segments", 1),
            "updates_to_baseline_best_valid_bleu": upd,
            "wall_min_to_baseline_best_valid_bleu": round(walls[upd] / 60, 1) if upd in walls else None,
            "averaged_k": (test.get("averaging") or {}).get("k"),
        })
    return {
        "benchmark": "quality", "mode": cfg["mode"], "command": common.command_line(),
        "machine": common.machine(), "threads": 1,
        "data": "; ".join(f"{CORPORA[c]}: {p} ({common.data_counts(pathlib.Path(p))})" for c, p in data.items()),
        "config": cfg, "complete": len(records) == n_runs, "runs_recorded": len(records), "n_runs": n_runs,
        "rows": sorted(rows, key=lambda r: (r["corpus"], list(METHODS).index(r["method"]))), "records": records,
    }


def report(res: dict) -> str:
    cfg = res["config"]
    text = runlib.report_head(f"Translation quality, at most {cfg['max_epoch']} epochs (CPU)", res, res["n_runs"])
    text += (
        f"Model {cfg['embed']}-{cfg['ffn']}-{cfg['heads']}, {cfg['layers']}+{cfg['layers']} layers, "
        f"{cfg['max_tokens']} tokens per update, dropout {cfg['dropout']}, lr 5e-4, Adam (0.9, 0.98); "
        f"T-Fixup: no LayerNorm, no warmup (lr*sqrt(4000/(4000+t))); baselines: warmup {cfg['warmup']} updates, "
        f"then inverse sqrt. Training stops when valid loss has not improved for {cfg['patience']} epochs "
        f"(at most {cfg['max_epoch']} epochs); train min: wall clock of all its train.sh calls (a run in N parts "
        f"was resumed from its last checkpoint N-1 times, on a machine whose load differed), min to it: fairseq's "
        f"train_wall (training only, over all its calls) when it got there. Test: average of the last K epoch checkpoints (K chosen on valid), "
        f"beam {cfg['beam']}, whole test set; tokenized BLEU on the lowercased tokenized text and detokenized "
        f"sacreBLEU (signature below). Valid BLEU: greedy, every epoch (fairseq --eval-bleu).\n\n")
    text += common.md_table(
        ["corpus", "method", "status", "test BLEU (tok)", "test sacreBLEU", "best valid BLEU", "best valid loss",
         "updates", "epochs", "stopped by", "train min", "updates to baseline's best valid BLEU", "min to it", "K"],
        [[r["corpus"], METHODS[r["method"]][2], r["status"], r["test_bleu_tok"], r["test_bleu_detok"],
          r["best_valid_bleu"], r["best_valid_loss"], r["updates"], r["epochs"], r["stopped_by"],
          f"{r['train_wall_min']}" + (f" ({r['train_segments']} parts)" if r["train_segments"] > 1 else ""),
          r["updates_to_baseline_best_valid_bleu"], r["wall_min_to_baseline_best_valid_bleu"],
          r["averaged_k"]] for r in res["rows"]]) + "\n\n"
    sigs = sorted({r["signature"] for r in res["rows"] if r["signature"]})
    text += "sacreBLEU signature: " + ", ".join(f"`{s}`" for s in sigs) + "\n\n## Test translations (first three test sentences)\n\n"
    for rec in sorted(res["records"].values(), key=lambda r: (r["corpus"], list(METHODS).index(r["method"]))):
        for s in rec.get("samples", []):
            text += (f"- **{rec['corpus']}, {METHODS[rec['method']][2]}**, sentence {s['id']}\n"
                     f"  - source: {s['source']}\n  - reference: {s['reference']}\n  - hypothesis: {s['hypothesis']}\n")
    return text


def plot(res: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    corpora = sorted({r["corpus"] for r in res["records"].values()})
    fig, axes = plt.subplots(2, max(1, len(corpora)), figsize=(5.5 * max(1, len(corpora)), 7), squeeze=False)
    for j, corpus in enumerate(corpora):
        for rec in res["records"].values():
            if rec["corpus"] != corpus:
                continue
            label, color = METHODS[rec["method"]][2], common.METHOD_COLORS[rec["method"]]
            if rec.get("valid_curve"):
                axes[0][j].plot(*zip(*rec["valid_curve"]), color=color, label=label, marker=".")
            pts = [(u, b) for u, b in rec.get("bleu_curve", []) if b is not None]
            if pts:
                axes[1][j].plot(*zip(*pts), color=color, label=label, marker=".")
        axes[0][j].set_title(CORPORA[corpus], fontsize=9)
        axes[0][j].set_ylabel("valid loss (bits, label-smoothed)")
        axes[1][j].set_ylabel("valid BLEU (greedy)")
        for ax in (axes[0][j], axes[1][j]):
            ax.set_xlabel("updates")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    common.save_figure(fig, path)
    plt.close(fig)


def main(argv=None):
    p = runlib.study_parser(__doc__.split("\n\n")[0], "quality.{json,md,png}, quality/runs/")
    p.add_argument("--multi30k", help="data-bin of the full Multi30k De-En (scripts/prepare-corpus.sh)")
    p.add_argument("--iwslt", help="data-bin of the IWSLT'14 sample (scripts/prepare-iwslt14.sh --valid-lines 1000)")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2, one thread each)")
    p.add_argument("--only", nargs="+", help="run ids to run now (e.g. multi30k-tfixup); the rest stay as recorded")
    args = p.parse_args(argv)
    if args.mode == "quick":
        p.error("quality has --smoke and the default mode only")
    cfg = dict(MODES[args.mode], mode=args.mode)
    data = {}
    if args.mode == "smoke" and not args.iwslt:  # its own tiny test set: an untrained model translates slowly
        data["iwslt"] = common.prepare_data(100, 20, None, args.data_root)
    for corpus in ("multi30k", "iwslt"):
        if getattr(args, corpus):
            data[corpus] = pathlib.Path(getattr(args, corpus))
    if not data:
        p.error("give --multi30k DATA and/or --iwslt DATA (see the module docstring for how to prepare them)")
    for corpus, path in data.items():
        if not (path / "dict.de.txt").is_file():
            p.error(f"--{corpus} {path}: not a fairseq data-bin for de-en (no dict.de.txt)")
    all_runs = make_runs(cfg, data)
    paths = {c: str(p) for c, p in data.items()}
    runlib.run_study("quality" + args.tag, args.out, all_runs, lambda recs: summarise(cfg, recs, paths, len(all_runs)),
                     plot, report, "valid loss and valid BLEU vs updates", args.jobs,
                     execute=lambda r, work: execute(r, work, args.threads),
                     todo=[r for r in all_runs if not args.only or r.id in args.only], report_only=args.report_only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
