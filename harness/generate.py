"""fairseq-generate's own code, run in this process (``python -m harness average ... ::: generate ...``: a
fairseq-generate process of its own paid fairseq's import, ~3-5 s, again): the hypotheses go to OUT line by line
as fairseq-generate writes them to stdout, its log to LOG as the console script's stderr did. While it translates,
a progress line every PROGRESS_SECONDS (environment; default 30), hypotheses written / the subset's sentences, and
a last count when done: a thread of this process, not a shell loop beside it, so that it ends with the process
however that ends (a killed evaluate.sh once left its progress loop logging forever)."""

import os
import threading
import time
import traceback
from typing import Sequence

from harness import fairseq_log


def _say_translated(out: str, total: str, message: str = "") -> None:
    """MESSAGE (if any), then the count of fairseq-generate's hypotheses (H- lines) in OUT so far, on the real
    stderr (fairseq's output to sys.stderr is captured meanwhile), as scripts/lib.sh's log."""
    try:
        with open(out, encoding="utf-8", errors="replace") as f:
            n = sum(line.startswith("H-") for line in f)
    except OSError:
        n = 0
    for text in filter(None, (message, f"translated {n} / {total} sentences")):
        os.write(2, f"[{time.strftime('%H:%M:%S')}] {text}\n".encode())


def generate(argv: Sequence[str], out: str, log: str, message: str = "") -> None:
    """``fairseq-generate ARGV > OUT 2> LOG`` in this process, with progress lines (MESSAGE before the first);
    fails with one line naming LOG."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq_cli import generate as fairseq_generate

    from harness import manifest

    parser = options.get_generation_parser()
    # as fairseq_cli.generate.cli_main (its workaround for tasks that read model args)
    parser.add_argument("--arch", "-a", metavar="ARCH", default="wav2vec2")
    subset = argv[argv.index("--gen-subset") + 1] if "--gen-subset" in argv[:-1] else "test"
    try:  # the subset's sentences (the data-bin's manifest or index)
        total = str(manifest.sentence_counts(argv[0]).get(subset, "?"))
    except Exception:  # a count line only: the translation itself names what is wrong with the data
        total = "?"
    done = threading.Event()
    every = float(os.environ.get("PROGRESS_SECONDS") or 30)

    def progress(message):  # every EVERY seconds until DONE: MESSAGE (before the first count), then the count
        while not done.wait(every):
            _say_translated(out, total, message)
            message = ""

    thread = threading.Thread(target=progress, args=(message,), daemon=True)
    with open(out, "w", buffering=1, encoding="utf-8") as hyps, fairseq_log.captured() as text:
        thread.start()
        try:
            args = options.parse_args_and_arch(parser, list(argv))
            fairseq_generate._main(convert_namespace_to_omegaconf(args), hyps)
            error = None
        except (Exception, SystemExit) as e:  # argparse exits on a bad flag
            traceback.print_exc()
            error = e
        finally:
            done.set()
            thread.join()  # its last line before the failure's, which must be the last
    with open(log, "w", encoding="utf-8") as f:
        f.write(text.getvalue())
    if error is not None:
        # argparse's SystemExit carries only its exit code; its message is the log's last line
        why = (f"{type(error).__name__}: {error}" if isinstance(error, Exception)
               else text.getvalue().strip().splitlines()[-1])
        raise RuntimeError(f"fairseq-generate failed: {why}; see {log}")
    _say_translated(out, total)  # also when it took less than PROGRESS_SECONDS
