"""The HuggingFace tests' one gate: transformers, imported and able to build its models, or the test file skipped
with one line saying why. ``import transformers`` alone succeeds even where its models cannot load (its imports
are lazy: a torchaudio built for another torch fails at the first model class), which gave one failure per test."""

import pytest


def require_transformers():
    """The transformers module; skips the calling test file (one line) when it or its model classes cannot
    import."""
    try:
        import transformers

        for name in ("LlamaForCausalLM", "GPT2LMHeadModel", "MarianMTModel", "BertForMaskedLM"):
            getattr(transformers, name)  # the lazy import of each family's modeling code
    except Exception as e:  # noqa: BLE001  (ImportError, RuntimeError, OSError of a broken extension: any)
        reason = (str(e).strip().splitlines() or [""])[-1][:200]  # transformers' lazy import: the cause last
        pytest.skip(f"transformers cannot be imported ({type(e).__name__}: {reason}): HuggingFace tests skipped",
                    allow_module_level=True)
    return transformers
