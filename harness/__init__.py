"""The harness that runs this repository's experiments (not installed; ``scripts/lib.sh`` puts the repo root on
PYTHONPATH). The plugin (``fairseq_tfixup``) and its fairseq-free core (``tfixup``) are what users install;
everything here drives them. The steps of ``scripts/*.sh``:

* ``config``: read ``configs/`` (the one reader) and give the scripts values, the fairseq-train arguments
  (through ``tfixup.methods.train_args``) and the run's record ``config.resolved.json``;
* ``manifest``: a data-bin's manifest (what made it; its sentence counts: the one reader of data-bin sizes);
* ``corpus``: small text steps of the data recipes;
* ``average``: average the last K checkpoints, K chosen on the VALID set;
* ``generate``: fairseq-generate's own code in this process (after the averaging: one import);
* ``score``: read fairseq-generate output (refusing a partial one) and compute BLEU: tokenized (compound-split
  for En-De) and detokenized sacreBLEU with its signature;
* ``report``: results JSON -> Markdown table next to the paper's numbers;
* ``recover``: why a training run failed, in one line, and the next command;
* ``fairseq_log``: fairseq's code run in this process, its log captured; the one reader of fairseq's logs; what
  the scripts show of a training (``python -m harness.fairseq_log quiet``);
* ``summary``: the main job's closing summary; ``run_ledger``: train.sh's runs (train_runs.tsv: wall time,
  devices and outcome of each call); ``proc``: the one process-tree stopper (studies' runner, scripts' supervise).

The studies of ``results/bench`` are ``harness.bench`` (``python -m harness.bench.NAME --help``). Run as
``python -m harness <command> --help`` (``python -m harness.config``, ``python -m harness.corpus``).
"""
