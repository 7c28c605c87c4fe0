"""``python -m harness {average,generate,results,report,updates,train-failure}``: the Python steps of
scripts/*.sh. Steps separated by ``:::`` run one after the other in one process (evaluate.sh's
average and generate: fairseq is imported once)."""

import argparse
import datetime
import json
import math
import os
import pathlib
import pickle
import shlex
import sys

from harness import config as config_mod


def cmd_average(args, validate_args):
    from tfixup import atomic
    from harness import average

    candidates = [int(k) for k in args.candidates.split()]
    choice = average.choose_and_average(args.ckpt_dir, candidates, args.data, args.out, validate_args)
    atomic.write_json(args.json, choice)
    print(f"averaged last {choice['chosen']['k']} checkpoints (valid loss {choice['chosen']['valid_loss']:.3f})",
          file=sys.stderr)


def cmd_generate(args, generate_args):
    from harness import generate

    generate.generate(generate_args, args.out, args.log, args.message)


def cmd_results(args, _):
    """results.json: the scores, and the config the run trained with (plus evaluation overrides)."""
    from tfixup import atomic
    from harness import manifest, report, score

    cfg = config_mod.resolve_run(args.run, config_mod.parse_sets(args.set))
    v = cfg.values
    raw_refs = (pathlib.Path(args.raw_refs).read_text(encoding="utf-8").splitlines()
                if args.raw_refs and os.path.exists(args.raw_refs) else None)
    scores = score.score_generate_output(pathlib.Path(args.generate).read_text(encoding="utf-8"), v["TGT"],
                                         split_compounds=v["COMPOUND_SPLIT"] == "1", lowercase=v["LOWERCASE"] == "1",
                                         raw_refs=raw_refs)
    for key in ("bleu_tok", "bleu_detok"):
        if not math.isfinite(scores[key]):
            raise ValueError(f"{key} is not a finite number")
    record = config_mod.read_record(args.run)
    averaging = json.loads(pathlib.Path(args.average_json).read_text())
    # what was evaluated on: this data-bin (its dictionaries' and manifest.json's sha256, None without one)
    data, manifest_json = config_mod.data_identity(args.data), pathlib.Path(args.data) / "manifest.json"
    data["manifest_sha256"] = manifest.sha256(manifest_json) if manifest_json.is_file() else None
    result = {
        "experiment": cfg.name, "table": v["TABLE"], "row": v["ROW"],
        "paper_bleu": float(v["PAPER_BLEU"]) if v["PAPER_BLEU"] else None,
        "paper_metric": v["PAPER_METRIC"], "beam": int(v["BEAM"]), "lenpen": float(v["LENPEN"]),
        "checkpoint": os.path.abspath(args.checkpoint),
        "num_updates": averaging["num_updates"],  # recorded by the average step (no torch import here)
        "generate_output": os.path.abspath(args.generate), "subset": args.subset,
        "data": data, "train_data": record.get("data"),  # and what trained
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **scores,
        **report.read_train_runs(args.run),
        "config": v, "config_file": cfg.path, "train_commands": record["train_commands"],
    }
    result["bleu"] = report.paper_comparable_bleu(result)
    result["averaging"] = averaging
    atomic.write_json(args.out, result, sort_keys=True)
    print(f"{cfg.name}: BLEU {result['bleu']:.2f} ({result['paper_metric']}), "
          f"tok {result['bleu_tok']:.2f}, detok {result['bleu_detok']:.2f} -> {args.out}", file=sys.stderr)


def cmd_report(args, _):
    from tfixup import atomic
    from harness import report

    text = report.build_report(args.experiments, args.results, args.title)
    if args.out:
        folder = os.path.dirname(os.path.abspath(args.out))
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"--out {args.out}: no folder {folder}")
        atomic.write_text(args.out, text)
    print(text, end="")


def cmd_updates(args, _):
    """The update count of a checkpoint_last.pt about to be resumed; else one line: what is wrong
    with it and the commands that go on (the newest intact checkpoint, or a new OUT_DIR)."""
    from harness import recover
    from tfixup import checkpoints

    try:
        state = checkpoints.load(args.checkpoint, mmap=True, check_crc=args.check_crc)
        updates = recover.updates_of(state, args.checkpoint)
    except recover.LOAD_ERRORS as e:
        raise ValueError(recover.corrupt_last_advice(args.checkpoint, e, args.advise)) from None
    if args.expect:
        lines = pathlib.Path(args.expect).read_text(encoding="utf-8").splitlines()
        differ = recover.model_mismatch(state, shlex.split(lines[0])) if lines else None
        if differ:
            raise ValueError(recover.foreign_model_advice(args.checkpoint, differ))
    print(updates)


def cmd_train_failure(args, argv):
    from harness import recover

    text = pathlib.Path(args.log).read_text(encoding="utf-8", errors="replace") if os.path.exists(args.log) else ""
    print(recover.train_failure(text, args.exit, args.run, argv))


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m harness")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("average", help="average the last K checkpoints, K chosen on valid loss")
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--candidates", default="1 5 10", help="values of K to try (space separated)")
    p.add_argument("--data", required=True, help="fairseq data-bin (its valid subset is used)")
    p.add_argument("--out", required=True, help="averaged checkpoint")
    p.add_argument("--json", required=True, help="where to record the choice")
    p.set_defaults(func=cmd_average)

    p = sub.add_parser("generate", help="fairseq-generate ARGS (after '--') in this process")
    p.add_argument("--out", required=True, help="the hypotheses (fairseq-generate's stdout)")
    p.add_argument("--log", required=True, help="its log (fairseq-generate's stderr)")
    p.add_argument("--message", default="", help="a line before the first progress line (when translating has begun)")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("results", help="score a fairseq-generate output and write the results JSON")
    p.add_argument("--run", required=True, help="the training OUT_DIR (its config.resolved.json)")
    p.add_argument("--set", action="append", default=[], help="evaluation overrides KEY=VALUE")
    p.add_argument("--data", required=True, help="the data-bin evaluated on (recorded with its sha256s)")
    for option in ("--generate", "--checkpoint"):
        p.add_argument(option, required=True)
    p.add_argument("--raw-refs", default="")
    p.add_argument("--average-json", required=True, help="the average step's record (K, num_updates)")
    p.add_argument("--subset", default="test")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_results)

    p = sub.add_parser("report", help="Markdown table: paper BLEU next to ours")
    p.add_argument("--experiments", nargs="+", required=True)
    p.add_argument("--results", nargs="*", default=[], help="results JSON files (missing ones: 'not run')")
    p.add_argument("--title", default="")
    p.add_argument("--out", default="")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("updates", help="the update count of a checkpoint (read safely and cheaply)")
    p.add_argument("checkpoint")
    p.add_argument("--advise", default="the same command",
                   help="the training command, for the advice when the checkpoint is corrupt")
    p.add_argument("--check-crc", action="store_true", help="also test the zip's CRCs (reads the whole file)")
    p.add_argument("--expect", help="a file whose first line is the fairseq-train command the checkpoint must "
                                    "fit (its --arch and sizes)")
    p.set_defaults(func=cmd_updates)

    p = sub.add_parser("train-failure", help="one line: why fairseq-train failed and what to run next "
                                             "(after '--': the training command, which resumes)")
    p.add_argument("--log", required=True)
    p.add_argument("--exit", type=int, required=True)
    p.add_argument("--run", required=True, help="the run's OUT_DIR")
    p.set_defaults(func=cmd_train_failure)

    try:
        # STEP ARGS [-- FAIRSEQ ARGS] [::: STEP ARGS [-- FAIRSEQ ARGS] ...]; after "--", the arguments for
        # fairseq-validate (average) or fairseq-generate (generate)
        while True:
            i = argv.index(":::") if ":::" in argv else len(argv)
            step, argv = argv[:i], argv[i + 1:]
            j = step.index("--") if "--" in step else len(step)
            args = parser.parse_args(step[:j])
            args.func(args, step[j + 1:])
            if not argv:
                break
    except (FileNotFoundError, ValueError, RuntimeError, pickle.UnpicklingError) as e:
        raise SystemExit(f"error: {str(e).splitlines()[0]}")


if __name__ == "__main__":
    main()
