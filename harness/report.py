"""Results JSON -> Markdown table next to the paper's numbers."""

import json
import math
import os
import pathlib
import sys
from typing import Dict, List, Optional, Sequence

from harness import config, run_ledger
from harness.translate import shown_path
from tfixup import atomic

METRIC_NAMES = {"tok": "tok BLEU", "tok_cs": "tok BLEU (compound split)", "detok": "sacreBLEU"}


def read_train_runs(out: str) -> Dict:
    """Sum the training segments train.sh booked in OUT's run ledger (harness/run_ledger.py)."""
    rows = [parts for parts in run_ledger.rows(out) if len(parts) >= 4]
    seconds = [max(0, int(parts[1]) - int(parts[0])) for parts in rows]
    return {"train_wall_hours": sum((s / 3600 for s in seconds), 0.0),
            "device_hours": sum((s * int(parts[2]) / 3600 for s, parts in zip(seconds, rows)), 0.0),
            "device": ", ".join(sorted({parts[3] for parts in rows})) or "unknown", "train_segments": len(rows)}


def paper_comparable_bleu(result: Dict) -> Optional[float]:
    metric = result.get("paper_metric", "tok")
    return result.get("bleu_detok") if metric == "detok" else result.get("bleu_tok")


def _fmt(x, digits=2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def report_row(name: str, result: Optional[Dict]) -> Dict:
    """A table row: the paper's side from the config the run recorded (or, not run, the experiment's)."""
    cfg = result["config"] if result else config.resolve(name, environ={}).values
    paper = float(cfg["PAPER_BLEU"]) if cfg["PAPER_BLEU"] else None
    row = {"experiment": name, "row": f'{cfg["TABLE"]}: {cfg["ROW"]}', "paper_bleu": paper,
           "metric": METRIC_NAMES[cfg["PAPER_METRIC"]]}
    if result is None:
        row.update(ours=None, delta=None, updates=None, hours=None, signature="not run")
        return row
    ours = paper_comparable_bleu(result)
    row.update(ours=ours, delta=None if (ours is None or paper is None) else ours - paper,
               updates=result.get("num_updates"), hours=result.get("device_hours"), device=result.get("device"),
               signature=result.get("sacrebleu_signature", ""), test_sentences=result.get("sentences"))
    return row


def md_cell(text: str) -> str:
    """A table cell: GitHub Markdown splits cells on '|' even inside backticks."""
    return str(text).replace("|", "\\|")


def render_markdown(rows: Sequence[Dict], title: str = "") -> str:
    lines = [f"### {title}", ""] if title else []
    lines += ["| Row | Paper BLEU | Our BLEU | Δ | Metric | Updates | Device-hours (device) | Test sents "
              "| sacreBLEU signature |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        hours = "—" if r.get("hours") is None else f'{r["hours"]:.3f} ({r.get("device", "?")})'
        delta = "—" if r["delta"] is None else f'{r["delta"]:+.2f}'
        lines.append(f'| {r["row"]} | {_fmt(r["paper_bleu"], 1)} | {_fmt(r["ours"])} | {delta} | {r["metric"]} | '
                     f'{_fmt(r["updates"])} | {hours} | {_fmt(r.get("test_sentences"))} | '
                     f'`{md_cell(r["signature"])}` |')
    return "\n".join(lines) + "\n"


# fields a row shows as numbers: a number or null, nothing else
NUMBER_FIELDS = ("bleu_tok", "bleu_detok", "num_updates", "device_hours", "sentences")


def check_result(r) -> None:
    """``ValueError`` naming the first field of a results JSON that the table cannot show."""
    if not isinstance(r, dict):
        raise TypeError("not a JSON object")
    name, cfg = r["experiment"], r["config"]
    if not isinstance(name, str) or not isinstance(cfg, dict):
        raise ValueError("field experiment or config has the wrong type")
    for key in ("TABLE", "ROW", "PAPER_BLEU", "PAPER_METRIC"):
        if not isinstance(cfg[key], str):
            raise ValueError(f"field config.{key} is not a string")
    if cfg["PAPER_METRIC"] not in METRIC_NAMES:
        raise ValueError(f"field config.PAPER_METRIC is {cfg['PAPER_METRIC']!r}, not one of "
                         f"{', '.join(METRIC_NAMES)}")
    if cfg["PAPER_BLEU"]:
        try:
            float(cfg["PAPER_BLEU"])
        except ValueError:
            raise ValueError(f"field config.PAPER_BLEU is {cfg['PAPER_BLEU']!r}, not a number") from None
    for key in NUMBER_FIELDS:
        value = r.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"field {key} is {value!r}, not a number")


def load_results(paths: Sequence[str]) -> Dict[str, Dict]:
    """Each readable results JSON by experiment; a bad one (unreadable, or a field of the wrong kind) is named on
    stderr with its field and skipped: the rest of the table is still written."""
    results = {}
    for p in paths:
        try:
            r = json.loads(pathlib.Path(p).read_text(encoding="utf-8"))
            check_result(r)
            results[r["experiment"]] = r
        except (OSError, ValueError, KeyError, TypeError) as e:
            why = str(e).splitlines()[0] if str(e) else ""
            print(f"warning: skipping {p}: not a results.json of scripts/evaluate.sh ({type(e).__name__} {why})",
                  file=sys.stderr)
    return results


def build_report(experiments: List[str], result_paths: Sequence[str], title: str = "") -> str:
    results = load_results([p for p in result_paths if os.path.exists(p)])
    return render_markdown([report_row(name, results.get(name)) for name in experiments], title)


MODEL_HEADING = "## Your model"


def model_section(use: Dict, train_longer: str) -> str:
    """Markdown: where the model is and how to use it (harness.translate.usage), how to train longer."""
    lines = [MODEL_HEADING, "", f"- model: `{shown_path(use['model'])}`",
             f"- dictionaries: {', '.join(f'`{shown_path(d)}`' for d in use['dictionaries'])}"]
    if use["bpe_codes"]:
        lines.append(f"- BPE codes: `{shown_path(use['bpe_codes'])}`")
    lines += [f"- its training text was: {use['steps_text']} (scripts/translate.sh does the same to yours)", "",
              f"Translate your own text ({use['src']} -> {use['tgt']}; one sentence per line, or a file: "
              f"`{use['translate_file_command']}`):", "", "```bash", use["translate_command"], "```", ""]
    if use["example_translation"] is not None:
        lines += [f"which prints: `{md_cell(use['example_translation'])}`", ""]
    lines += ["Train longer (resumes from checkpoint_last.pt, then evaluates again):", "", "```bash", train_longer,
              "```", "", "In Python, with fairseq's hub (`import fairseq_tfixup` first, or torch's safe loader "
              "refuses the checkpoint's `argparse.Namespace`; never `weights_only=False`):", "", "```python",
              use["hub"], "```"]
    return "\n".join(lines) + "\n"


def add_model_section(path: pathlib.Path, use: Dict, train_longer: str) -> None:
    """REPORT (report.sh's table) with model_section at its end, replacing one written before."""
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    text = text.split("\n" + MODEL_HEADING + "\n")[0].rstrip("\n") + "\n"
    atomic.write_text(str(path), text + "\n" + model_section(use, train_longer))
