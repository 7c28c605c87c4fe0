"""The main job's closing summary (scripts/quickstart.sh): test BLEU, three example translations, the learning curve
as a PNG, where the report is, and the model: its files, how to translate your own text (the command, with one example
it translated), how to train it longer, and how to load it in Python. report.md gets the same model section;
RUN/summary.txt what was printed.

    python3 -m harness.summary --run RUN --png RUN/learning-curve.png --report RUN/report.md [-- QUICKSTART_ARGS]

RUN: a run of scripts/train.sh (``--log-format json``) evaluated by scripts/evaluate.sh; QUICKSTART_ARGS: the job's.
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

from harness import config, main_job, report, translate
from harness.fairseq_log import parse_train_log
from tfixup import atomic
from harness.bench import common
from harness.bench.quality import samples


def learning_curve(train_log: pathlib.Path) -> list:
    """(epoch, updates, valid loss, valid BLEU or None) per epoch; an epoch logged again (resumed) counts once, last."""
    by_epoch = {}
    for r in parse_train_log(train_log.read_text(errors="replace"))["valid"]:
        by_epoch[int(r["epoch"])] = (int(r["valid_num_updates"]), r["valid_loss"], r.get("valid_bleu"))
    return [(e, *by_epoch[e]) for e in sorted(by_epoch)]


def plot(curve: list, title: str, path: pathlib.Path) -> None:
    plt = common.pyplot()
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
    atomic.save_figure(path, fig)


def continue_command(run: pathlib.Path, quickstart_args) -> str:
    """The main job's command again, training twice as long: it resumes from checkpoint_last.pt, then evaluates and
    summarizes again (the overrides this job had in its environment kept)."""
    values = config.read_record(run)["values"]
    key = "MAX_UPDATE" if values.get("MAX_UPDATE", "0") != "0" else "MAX_EPOCH"
    return main_job.job_command(run, quickstart_args, {key: str(2 * int(values[key]))})


def model_lines(use: dict, train_longer: str) -> list:
    """The summary's model section (plain text); report.model_section is its Markdown."""
    lines = ["", "Your model:",
             f"  model:        {translate.shown_path(use['model'])}",
             f"  dictionaries: {', '.join(translate.shown_path(d) for d in use['dictionaries'])}"]
    if use["bpe_codes"]:
        lines.append(f"  BPE codes:    {translate.shown_path(use['bpe_codes'])}")
    lines += [f"  its text was: {use['steps_text']} (scripts/translate.sh does the same to yours)",
              "", f"Train longer (resumes from checkpoint_last.pt, then evaluates again):", f"  {train_longer}",
              "", "In Python (fairseq's hub; import fairseq_tfixup first, or torch refuses the checkpoint):"]
    lines += [f"  {line}" for line in use["hub"].splitlines()]
    lines += ["", f"Translate your own text ({use['src']} -> {use['tgt']}; a file: {use['translate_file_command']}):",
              f"  {use['translate_command']}"]
    if use["example_translation"] is not None:
        lines.append(f"  -> {use['example_translation']}")
    return lines


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    quickstart_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, help="the run's folder (scripts/train.sh OUT_DIR)")
    p.add_argument("--png", required=True, help="where to write the learning curve")
    p.add_argument("--report", required=True, help="the report scripts/report.sh wrote")
    args = p.parse_args(argv)
    run = pathlib.Path(args.run)
    shown = []  # what is printed, also kept in RUN/summary.txt (results/main-job/ publishes it)

    def say(text):
        shown.append(text)
        print(text)

    res = json.loads((run / "eval" / "results.json").read_text())
    cfg = res["config"]
    averaged = (res.get("averaging") or {}).get("chosen") or {}
    say(f"\n{res['row']} ({res['experiment']}): {res['num_updates']} updates, "
          f"model: the average of the last K={averaged.get('k', '?')} checkpoint(s), K chosen on valid")
    say(f"Test BLEU on {res['sentences']} sentences, beam {res['beam']}, lenpen {res['lenpen']}:")
    say(f"  tokenized BLEU {res['bleu_tok']:.2f}  (Moses-tokenized{', lowercased' if cfg['LOWERCASE'] == '1' else ''}"
          f" text, as fairseq-generate scores it)")
    say(f"  sacreBLEU      {res['bleu_detok']:.2f}  {res['sacrebleu_signature']}")
    say("\nExample translations (first three test sentences, BPE removed):")
    for s in samples(run / "eval" / "generate-test.txt", 3):
        say(f"  [{s['id']}] source:     {s['source']}\n      reference:  {s['reference']}\n"
              f"      hypothesis: {s['hypothesis']}")
    curve = learning_curve(run / "train.log")
    if not curve:
        print(f"error: no JSON valid records in {run / 'train.log'} (train with --log-format json)", file=sys.stderr)
        return 1
    plot(curve, f"{res['row']}: valid set after each epoch", pathlib.Path(args.png))
    say("\nLearning curve (valid set, after each epoch):")
    for epoch, updates, loss, bleu in curve:
        say(f"  epoch {epoch:3d}  updates {updates:6d}  valid loss {loss:.3f}"
              + ("" if bleu is None else f"  valid BLEU {bleu:.2f}"))
    say(f"\nLearning curve (PNG): {args.png}\nReport: {args.report}\nAll results: {run / 'eval' / 'results.json'}")
    train_longer = continue_command(run, quickstart_args)
    try:
        use = translate.usage(run, translate.Translator(run))
    except translate.TranslateError as e:  # e.g. a data-bin made before its preprocessing was recorded
        say(f"\nYour model: {translate.shown_path(translate.final_model(run))}\n\n"
            f"Train longer (resumes from checkpoint_last.pt, then evaluates again):\n  {train_longer}\n\n"
            f"Translate your own text: not with this data-bin: {e}")
    else:
        report.add_model_section(pathlib.Path(args.report), use, train_longer)
        say("\n".join(model_lines(use, train_longer)))  # last: the command a user copies next
    atomic.write_text(run / "summary.txt", "\n".join(shown) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
