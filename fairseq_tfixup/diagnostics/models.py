"""The diagnostics' model: a method of ``fairseq_tfixup.presets`` at a size, built the way fairseq-train does."""

from dataclasses import dataclass, field
from typing import List, Sequence

from fairseq_tfixup import presets

# what every diagnostic trains with unless its flags say otherwise (they come later and win)
BASE_FLAGS = ["--cpu", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "5e-4",
              "--criterion", "cross_entropy", "--max-tokens", "2048"]


@dataclass
class ModelSpec:
    """The method and size of the model and anything else, as fairseq flags."""

    model: str = "postln"  # a name of presets.METHODS
    dim: int = 128
    ffn_dim: int = 256
    heads: int = 4
    encoder_layers: int = 6
    decoder_layers: int = 6
    dropout: float = 0.0
    extra: List[str] = field(default_factory=list)  # free-form fairseq flags, applied last (they win)

    def flags(self) -> List[str]:
        return [
            *presets.model_flags(self.model),
            *presets.dims_flags(self.dim, self.ffn_dim, self.heads, self.encoder_layers, self.decoder_layers),
            "--dropout", str(self.dropout), "--attention-dropout", "0", "--activation-dropout", "0",
            *self.extra,
        ]


def build(data_bin, spec: ModelSpec, seed: int = 1, device: str = "cpu", extra_flags: Sequence[str] = ()):
    """(args, task, model, criterion), the model seeded with ``seed`` and moved to ``device``."""
    return presets.build(data_bin, [*BASE_FLAGS, *spec.flags(), *extra_flags], seed=seed, device=device)
