"""fairseq-tfixup: T-Fixup (Huang et al., ICML 2020) as a fairseq plugin.

Importing the package registers, with fairseq:

* the model ``transformer_tfixup`` and its architectures
  (``transformer_tfixup``, ``transformer_tfixup_iwslt_de_en``,
  ``transformer_tfixup_wmt_en_de``, ``transformer_tfixup_vaswani_wmt_en_de_big``,
  ``transformer_tfixup_deep_narrow``);
* the learning-rate scheduler ``inverse_sqrt_nowarmup``;
* the baselines of ``fairseq_tfixup.baselines`` (docs/baselines.md).

Use it with ``fairseq-train --user-dir fairseq_tfixup`` (from a checkout, or
when installed next to fairseq) or ``common.user_dir`` in a hydra config.
"""

__version__ = "0.1.0"

import os

# fairseq 0.12 checkpoints pickle argparse/omegaconf objects, which torch >= 2.6
# refuses to load by default (weights_only=True): fairseq-generate, resuming and
# averaging would all fail. Restore the old default in processes that load this
# plugin, unless the user chose otherwise. Load only checkpoints you trust.
if "TORCH_FORCE_WEIGHTS_ONLY_LOAD" not in os.environ:
    os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")

from fairseq_tfixup.lr_scheduler import inverse_sqrt_nowarmup  # noqa: F401  (registers)
from fairseq_tfixup.models import transformer_tfixup  # noqa: F401  (registers)
from fairseq_tfixup import baselines  # noqa: F401  (registers the methods T-Fixup is compared against)
