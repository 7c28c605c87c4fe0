"""``python -m fairseq_tfixup.pipeline {average,results,report}``: the Python steps of scripts/*.sh."""

import argparse
import datetime
import json
import math
import os
import pathlib
import pickle
import sys

from fairseq_tfixup.pipeline import config as config_mod
from fairseq_tfixup.pipeline import report as report_mod


def cmd_average(args, validate_args):
    from fairseq_tfixup.pipeline import average

    candidates = [int(k) for k in args.candidates.split()]
    choice = average.choose_and_average(args.ckpt_dir, candidates, args.data, args.out, validate_args)
    report_mod.write_json_atomic(choice, args.json)
    print(f"averaged last {choice['chosen']['k']} checkpoints (valid loss {choice['chosen']['valid_loss']:.3f})",
          file=sys.stderr)


def cmd_results(args, _):
    from fairseq_tfixup.pipeline import average, score

    cfg = config_mod.load_config(args.experiment)
    text = pathlib.Path(args.generate).read_text(encoding="utf-8")
    raw_refs = None
    if args.raw_refs and os.path.exists(args.raw_refs):
        raw_refs = pathlib.Path(args.raw_refs).read_text(encoding="utf-8").splitlines()
    scores = score.score_generate_output(
        text, cfg["TGT"], split_compounds=cfg.get("COMPOUND_SPLIT") == "1",
        lowercase=cfg.get("LOWERCASE") == "1", raw_refs=raw_refs)
    for key in ("bleu_tok", "bleu_detok"):
        if not math.isfinite(scores[key]):
            raise SystemExit(f"error: {key} is not a finite number")
    result = {
        "experiment": cfg["NAME"], "table": cfg["TABLE"], "row": cfg["ROW"],
        "paper_bleu": float(cfg["PAPER_BLEU"]) if cfg.get("PAPER_BLEU") else None,
        "paper_metric": cfg.get("PAPER_METRIC", "tok"),
        "beam": int(cfg["BEAM"]), "lenpen": float(cfg["LENPEN"]),
        "checkpoint": os.path.abspath(args.checkpoint),
        "num_updates": average.num_updates(args.checkpoint),
        "generate_output": os.path.abspath(args.generate),
        "subset": args.subset,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **scores,
        **report_mod.read_train_runs(os.path.join(args.train_dir, "train_runs.tsv")),
    }
    result["bleu"] = report_mod.paper_comparable_bleu(result)
    if args.average_json and os.path.exists(args.average_json):
        result["averaging"] = json.loads(pathlib.Path(args.average_json).read_text())
    cmd_file = os.path.join(args.train_dir, "train_command.sh")
    if os.path.exists(cmd_file):
        result["train_command"] = pathlib.Path(cmd_file).read_text().strip()
    report_mod.write_json_atomic(result, args.out)
    print(f"{cfg['NAME']}: BLEU {result['bleu']:.2f} ({result['paper_metric']}), "
          f"tok {result['bleu_tok']:.2f}, detok {result['bleu_detok']:.2f} -> {args.out}", file=sys.stderr)


def cmd_report(args, _):
    text = report_mod.build_report(args.experiments, args.results, args.title)
    if args.out:
        tmp = args.out + ".tmp"
        pathlib.Path(tmp).write_text(text, encoding="utf-8")
        os.replace(tmp, args.out)
    print(text, end="")


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = []
    if "--" in argv:  # after "--": arguments for fairseq-validate
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    parser = argparse.ArgumentParser(prog="python -m fairseq_tfixup.pipeline")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("average", help="average the last K checkpoints, K chosen on valid loss")
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--candidates", default="1 5 10", help="values of K to try (space separated)")
    p.add_argument("--data", required=True, help="fairseq data-bin (its valid subset is used)")
    p.add_argument("--out", required=True, help="averaged checkpoint")
    p.add_argument("--json", required=True, help="where to record the choice")
    p.set_defaults(func=cmd_average)

    p = sub.add_parser("results", help="score a fairseq-generate output and write the results JSON")
    p.add_argument("--experiment", required=True)
    p.add_argument("--generate", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--train-dir", required=True)
    p.add_argument("--raw-refs", default="")
    p.add_argument("--average-json", default="")
    p.add_argument("--subset", default="test")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_results)

    p = sub.add_parser("report", help="Markdown table: paper BLEU next to ours")
    p.add_argument("--experiments", nargs="+", required=True)
    p.add_argument("--results", nargs="*", default=[], help="results JSON files (missing ones: 'not run')")
    p.add_argument("--title", default="")
    p.add_argument("--out", default="")
    p.set_defaults(func=cmd_report)

    args = parser.parse_args(argv)
    try:
        args.func(args, extra)
    except (FileNotFoundError, ValueError, RuntimeError, pickle.UnpicklingError) as e:
        raise SystemExit(f"error: {str(e).splitlines()[0]}")


if __name__ == "__main__":
    main()
