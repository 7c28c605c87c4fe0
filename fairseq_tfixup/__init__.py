"""fairseq-tfixup: T-Fixup (Huang et al., ICML 2020) as a fairseq plugin.

Importing the package registers, with fairseq:

* the model ``transformer_tfixup`` and its architectures
  (``transformer_tfixup``, ``transformer_tfixup_iwslt_de_en``,
  ``transformer_tfixup_wmt_en_de``, ``transformer_tfixup_vaswani_wmt_en_de_big``,
  ``transformer_tfixup_deep_narrow``);
* the language model ``transformer_lm_tfixup`` (task ``language_modeling``; architectures
  ``transformer_lm_tfixup``, ``transformer_lm_tfixup_small``, ``transformer_lm_tfixup_deep``);
* the learning-rate schedulers ``inverse_sqrt_nowarmup`` (T-Fixup's) and
  ``inverse_sqrt_matched`` (a warmup onto T-Fixup's curve, for baselines);
* the baselines of ``fairseq_tfixup.baselines`` (docs/baselines.md).

It refuses a torch older than 2.6 (whose ``torch.load`` unpickles code by default),
loads every checkpoint fairseq reads with ``weights_only=True`` itself, allows
that safe loader to read fairseq's checkpoints, which pickle an ``argparse.Namespace``; holds every
config string fairseq ``eval()``s to Python literals, in checkpoints fairseq loads
and on command lines (literals.py, docs/security.md); holds every checkpoint's config to an
allow-list of this project's components and plain settings, its paths set back to fairseq's
defaults (tfixup/allowlist.py); and makes fairseq's
checkpoint writes atomic (checkpoints.install_atomic_saves).

Use it with ``fairseq-train --user-dir fairseq_tfixup`` (from a checkout, or
when installed next to fairseq) or ``common.user_dir`` in a hydra config.
"""

__version__ = "0.1.0"

import logging

# Imported before fairseq (tfixup-diagnose, hub users): fairseq's import logs "Please install tensorboardX"
# (an optional dependency nothing here uses) at INFO through a root handler it sets up, as the first line
# of every command, --help included. Only that logger is quieted; under fairseq-train, fairseq is imported first.
logging.getLogger("fairseq.tasks.text_to_speech").setLevel(logging.WARNING)
# The hub's from_pretrained logs the checkpoint's whole config (~12,000 characters, one line) at INFO on
# every load; that is this logger's only INFO line (its warnings still show).
logging.getLogger("fairseq.models.fairseq_model").setLevel(logging.WARNING)

from tfixup import checkpoints, errors, literals  # noqa: E402

# a refusal below ends the command in its one line (errors.py), this one first: a torch that
# unpickles code by default (before 2.6) is refused before fairseq loads anything
errors.one_line_errors()
checkpoints.require_safe_torch()
# torch >= 2.6 loads with weights_only=True: allow the few plain types fairseq's
# checkpoints hold, and nothing that can run code (see checkpoints.py).
checkpoints.register_safe_globals()
# before fairseq builds anything from a checkpoint or a config: the strings it eval()s
# must be literals (literals.py); its checkpoint writes become atomic
literals.install()
checkpoints.install_atomic_saves()
# --fp16 / --bf16 where they cannot run, a language model's missing split: one line naming the flag
from fairseq_tfixup import command_checks  # noqa: E402

command_checks.install()

from fairseq_tfixup.lr_scheduler import inverse_sqrt_nowarmup, inverse_sqrt_matched  # noqa: F401  (registers)
from fairseq_tfixup.models import transformer_tfixup  # noqa: F401  (registers)
from fairseq_tfixup.models import transformer_lm_tfixup  # noqa: F401  (registers)
from fairseq_tfixup import baselines  # noqa: F401  (registers the methods T-Fixup is compared against)
