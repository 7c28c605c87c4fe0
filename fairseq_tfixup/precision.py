"""fairseq-train's ``--fp16`` and ``--bf16`` where they cannot run, refused in one line when the trainer
is built, before any training: fairseq failed later with messages that name neither flag (``--fp16``
without CUDA: "Torch not compiled with CUDA enabled" from its FP16 optimizer; ``--bf16``, which in
fairseq 0.12 implies ``--tpu``: "'NoneType' object has no attribute 'xla_device'")."""

import importlib.util

import torch

from tfixup import errors


def check(cfg) -> None:
    """``errors.Refused`` naming the flag when CFG (fairseq's config) asks for a precision this machine lacks."""
    common = cfg.common
    if common.bf16 or common.memory_efficient_bf16:
        if importlib.util.find_spec("torch_xla") is None:
            raise errors.Refused("--bf16 needs a TPU: in fairseq 0.12 it implies --tpu (torch_xla, not installed "
                                 "here); on a GPU use --fp16 or --amp, on a CPU drop --bf16")
    elif (common.fp16 or common.memory_efficient_fp16) and (common.cpu or not torch.cuda.is_available()):
        where = "--cpu is given" if common.cpu else "this machine has none"
        raise errors.Refused(f"--fp16 needs a CUDA GPU (fairseq's FP16 optimizer keeps its fp32 copy there) and "
                             f"{where}: drop --fp16")


def install() -> None:
    """``check`` at the start of fairseq's ``Trainer`` (fairseq-train, and anything else that trains). Idempotent."""
    from fairseq import trainer

    build = trainer.Trainer.__init__
    if getattr(build, "tfixup_checked", False):
        return

    def __init__(self, cfg, *args, **kwargs):
        check(cfg)
        build(self, cfg, *args, **kwargs)

    __init__.tfixup_checked = True
    __init__.__wrapped__ = build
    trainer.Trainer.__init__ = __init__
