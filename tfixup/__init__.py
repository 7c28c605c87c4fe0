"""T-Fixup without fairseq: the method table and command builder (``tfixup.methods``) and the atomic
file writer (``tfixup.atomic``) that the fairseq plugin (``fairseq_tfixup``), its diagnostics and this
repository's harness share, and T-Fixup for any PyTorch model (``tfixup.torch_tfixup``, which needs torch
only; HuggingFace models through ``tfixup.hf``, and ``tfixup.hf_auto``, which imports transformers and registers
the T-Fixup model types with its Auto classes: a saved T-Fixup model loads back). Importing the package imports
neither fairseq nor torch."""


def __getattr__(name):
    """``from tfixup import apply_tfixup, Layer``: tfixup.torch_tfixup's, imported (with torch) on first use."""
    if name in ("apply_tfixup", "Layer"):
        from tfixup import torch_tfixup
        return getattr(torch_tfixup, name)
    raise AttributeError(f"module 'tfixup' has no attribute {name!r}")
