"""Methods the T-Fixup paper compares against, registered with fairseq on import."""

from fairseq_tfixup.baselines import radam  # noqa: F401  (--optimizer radam)
from fairseq_tfixup.baselines import ds_init  # noqa: F401  (--arch transformer_dsinit*)
from fairseq_tfixup.baselines import deepnorm  # noqa: F401  (--arch transformer_deepnorm*)
from fairseq_tfixup.baselines import rfixup  # noqa: F401  (--arch transformer_rfixup*)
from fairseq_tfixup.baselines import dlcl  # noqa: F401  (--arch transformer_dlcl*)
from fairseq_tfixup.baselines import admin  # noqa: F401  (--arch transformer_admin*)
from fairseq_tfixup.baselines import lri  # noqa: F401  (--arch transformer_lri*)
from fairseq_tfixup.baselines import ablations  # noqa: F401  (--arch transformer_noln*, transformer_tfixup_ln*)
from fairseq_tfixup.baselines import dyt  # noqa: F401  (--arch transformer_dyt*, transformer_lm_dyt)
from fairseq_tfixup.baselines import rezero  # noqa: F401  (--arch transformer_rezero*, transformer_lm_rezero)
