"""Settings of a fairseq command that fairseq rejects late, or with a message naming neither the flag nor
the fix, refused in one line (``errors.Refused``) before fairseq acts on them:

* ``--fp16`` and ``--bf16`` where they cannot run, when the trainer is built (fairseq failed later:
  ``--fp16`` without CUDA with "Torch not compiled with CUDA enabled" from its FP16 optimizer; ``--bf16``,
  which in fairseq 0.12 implies ``--tpu``, with "'NoneType' object has no attribute 'xla_device'");
* a language-model split the data-bin does not have (``fairseq-eval-lm`` reads ``test`` by default; the
  LM study's data-bin has train and valid): the splits it has and the flag to choose one."""

import glob
import importlib.util
import os

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


def splits_of(data_path) -> list:
    """The splits a fairseq data-bin holds (its NAME.idx files; a translation pair's NAME.SRC-TGT.SRC.idx)."""
    return sorted({os.path.basename(p).split(".")[0] for p in glob.glob(os.path.join(data_path, "*.idx"))})


def install() -> None:
    """``check`` at the start of fairseq's ``Trainer`` (fairseq-train, and anything else that trains); the
    language-modeling task's missing split named with the splits there are. Idempotent."""
    from fairseq import trainer
    from fairseq.tasks.language_modeling import LanguageModelingTask

    build = trainer.Trainer.__init__
    if not getattr(build, "tfixup_checked", False):
        def __init__(self, cfg, *args, **kwargs):
            check(cfg)
            build(self, cfg, *args, **kwargs)

        __init__.tfixup_checked = True
        __init__.__wrapped__ = build
        trainer.Trainer.__init__ = __init__

    load = LanguageModelingTask.load_dataset
    if not getattr(load, "tfixup_checked", False):
        def load_dataset(self, split, epoch=1, combine=False, **kwargs):
            try:
                return load(self, split, epoch=epoch, combine=combine, **kwargs)
            except FileNotFoundError as e:
                if not str(e).startswith("Dataset not found"):
                    raise
                data = self.args.data.split(os.pathsep)[(epoch - 1) % len(self.args.data.split(os.pathsep))]
                have = splits_of(data)
                pick = next((s for s in ("valid", "test", *have) if s in have), None)
                choose = f"--gen-subset {pick}" if pick else "another data-bin"
                raise errors.Refused(f"{data} holds no '{split}' split (it has: {', '.join(have) or 'none'}): "
                                     f"choose one it has, e.g. {choose} for fairseq-eval-lm") from None

        load_dataset.tfixup_checked = True
        load_dataset.__wrapped__ = load
        LanguageModelingTask.load_dataset = load_dataset
