"""The main job's closing summary (scripts/quickstart.sh): test BLEU, three example
translations, the learning curve as a PNG, and where the report is.

    python3 -m harness.summary --run RUN --png RUN/learning-curve.png --report RUN/report.md

RUN is a run of scripts/train.sh (JSON log, ``--log-format json``) evaluated by
scripts/evaluate.sh (RUN/eval/results.json, RUN/eval/generate-test.txt).
"""

import argparse
import json
import logging
import pathlib
import sys

# where fairseq is imported, it logs "Please install tensorboardX" (optional, unused) and leaves the
# root logger at DEBUG, so matplotlib's import would print its debug lines: quiet both first
logging.getLogger("fairseq.tasks.text_to_speech").setLevel(logging.WARNING)
logging.getLogger("matplotlib").setLevel(logging.WARNING)

from harness.fairseq_log import parse_train_log
from tfixup.atomic import save_figure
from harness.bench.quality import samples


def learning_curve(train_log: pathlib.Path) -> list:
    """(epoch, updates, valid loss, valid BLEU or None) per epoch; a resumed run that logs
    an epoch again counts once, with its last record."""
    by_epoch = {}
    for r in parse_train_log(train_log.read_text(errors="replace"))["valid"]:
        by_epoch[int(r["epoch"])] = (int(r["valid_num_updates"]), r["valid_loss"], r.get("valid_bleu"))
    return [(e, *by_epoch[e]) for e in sorted(by_epoch)]


def plot(curve: list, title: str, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (loss_ax, bleu_ax) = plt.subplots(1, 2, figsize=(10, 3.8))
    epochs = [c[0] for c in curve]
    loss_ax.plot(epochs, [c[2] for c in curve], marker="o", color="C3")
    loss_ax.set_ylabel("valid loss (bits, label-smoothed)")
    bleu = [(c[0], c[3]) for c in curve if c[3] is not None]
    if bleu:
        bleu_ax.plot(*zip(*bleu), marker="o", color="C0")
    bleu_ax.set_ylabel("valid BLEU (greedy)" if bleu else "valid BLEU: not logged (no --eval-bleu)")
    for ax in (loss_ax, bleu_ax):
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    save_figure(path, fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, help="the run's folder (scripts/train.sh OUT_DIR)")
    p.add_argument("--png", required=True, help="where to write the learning curve")
    p.add_argument("--report", required=True, help="the report scripts/report.sh wrote")
    args = p.parse_args(argv)
    run = pathlib.Path(args.run)
    res = json.loads((run / "eval" / "results.json").read_text())
    cfg = res["config"]
    averaged = (res.get("averaging") or {}).get("chosen") or {}
    print(f"\n{res['row']} ({res['experiment']}): {res['num_updates']} updates, "
          f"model: the average of the last K={averaged.get('k', '?')} checkpoint(s), K chosen on valid")
    print(f"Test BLEU on {res['sentences']} sentences, beam {res['beam']}, lenpen {res['lenpen']}:")
    print(f"  tokenized BLEU {res['bleu_tok']:.2f}  (Moses-tokenized{', lowercased' if cfg['LOWERCASE'] == '1' else ''}"
          f" text, as fairseq-generate scores it)")
    print(f"  sacreBLEU      {res['bleu_detok']:.2f}  {res['sacrebleu_signature']}")
    print("\nExample translations (first three test sentences, BPE removed):")
    for s in samples(run / "eval" / "generate-test.txt", 3):
        print(f"  [{s['id']}] source:     {s['source']}\n      reference:  {s['reference']}\n"
              f"      hypothesis: {s['hypothesis']}")
    curve = learning_curve(run / "train.log")
    if not curve:
        print(f"error: no JSON valid records in {run / 'train.log'} (train with --log-format json)", file=sys.stderr)
        return 1
    plot(curve, f"{res['row']}: valid set after each epoch", pathlib.Path(args.png))
    print("\nLearning curve (valid set, after each epoch):")
    for epoch, updates, loss, bleu in curve:
        print(f"  epoch {epoch:3d}  updates {updates:6d}  valid loss {loss:.3f}"
              + ("" if bleu is None else f"  valid BLEU {bleu:.2f}"))
    print(f"\nLearning curve (PNG): {args.png}\nReport: {args.report}\nAll results: {run / 'eval' / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
