"""fairseq-generate's own code, run in this process.

evaluate.sh averages the checkpoints and translates in one process (``python -m harness average
... ::: generate ...``): a fairseq-generate process of its own paid fairseq's import (~3-5 s) a
second time. The hypotheses go to OUT as fairseq-generate writes them to stdout (line by line,
so that evaluate.sh can count them for its progress line); its log goes to LOG, as the console
script's stderr did.
"""

import traceback
from typing import Sequence

from harness import fairseq_log


def generate(argv: Sequence[str], out: str, log: str) -> None:
    """``fairseq-generate ARGV > OUT 2> LOG``, in this process. Fails with one line naming LOG."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq_cli import generate as fairseq_generate

    parser = options.get_generation_parser()
    # as fairseq_cli.generate.cli_main (its workaround for tasks that read model args)
    parser.add_argument("--arch", "-a", metavar="ARCH", default="wav2vec2")
    with open(out, "w", buffering=1, encoding="utf-8") as hyps, fairseq_log.captured() as text:
        try:
            args = options.parse_args_and_arch(parser, list(argv))
            fairseq_generate._main(convert_namespace_to_omegaconf(args), hyps)
            error = None
        except (Exception, SystemExit) as e:  # argparse exits on a bad flag
            traceback.print_exc()
            error = e
    with open(log, "w", encoding="utf-8") as f:
        f.write(text.getvalue())
    if error is not None:
        # argparse's SystemExit carries only its exit code; its message is the log's last line
        why = f"{type(error).__name__}: {error}" if isinstance(error, Exception) else text.getvalue().strip().splitlines()[-1]
        raise RuntimeError(f"fairseq-generate failed: {why}; see {log}")
