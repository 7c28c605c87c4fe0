"""The Python steps of this repository's experiments, run by ``scripts/*.sh`` (not installed;
``scripts/lib.sh`` puts the repo root on PYTHONPATH):

* ``config``  : read ``configs/`` (the one reader) and give the scripts values, the
  fairseq-train arguments and the run's record ``config.resolved.json``;
* ``average`` : average the last K checkpoints, K chosen on the VALID set;
* ``generate``: fairseq-generate's own code in this process (after the averaging: one import);
* ``score``   : read fairseq-generate output (refusing a partial one) and compute BLEU:
  tokenized (compound-split for En-De) and detokenized sacreBLEU with its signature;
* ``report``  : results JSON -> Markdown table next to the paper's numbers;
* ``corpus``  : small text steps of the data recipes;
* ``fairseq_log``: fairseq's code run in this process, its log captured.

Run as ``python -m pipeline <command> --help`` (``python -m pipeline.config``, ``python -m pipeline.corpus``).
"""

import logging

# fairseq logs "Please install tensorboardX" on import of its tasks (every command, --help
# included): nothing our users need to act on
logging.getLogger("fairseq.tasks.text_to_speech").setLevel(logging.WARNING)
