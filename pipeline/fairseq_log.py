"""Run fairseq's code in this process and keep what it says: its log lines, formatted as its
console scripts format them, go to a string instead of the terminal.

    with fairseq_log.captured() as log:
        validate.main(cfg)
    text = log.getvalue()

While the block runs, the root logger has only the capturing handler (fairseq's import leaves a
DEBUG handler on stderr: wav2vec2_classification calls ``logging.basicConfig(level=DEBUG)``),
fairseq's loggers log at INFO (whatever a caller set before: tfixup-diagnose quiets them), what
is printed goes to the same string, and warnings (hydra's schema-matching deprecation) are
dropped. Everything is restored afterwards.
"""

import contextlib
import io
import logging
import warnings

FORMAT = "%(asctime)s | %(levelname)s | %(name)s | %(message)s"  # fairseq_cli's own
LOGGERS = ("", "fairseq", "fairseq_cli", "fairseq_tfixup")


@contextlib.contextmanager
def captured():
    text = io.StringIO()
    handler = logging.StreamHandler(text)
    handler.setFormatter(logging.Formatter(FORMAT))
    loggers = [logging.getLogger(name) for name in LOGGERS]
    root = loggers[0]
    handlers, levels = root.handlers[:], [lg.level for lg in loggers]
    root.handlers[:] = [handler]
    for lg in loggers:
        lg.setLevel(logging.INFO)
    try:
        with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield text
    finally:
        root.handlers[:] = handlers
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
