"""T-Fixup's one applier: a plan of what it does to a model, and ``execute``, the one function that does it.

The paper, §3.2 (N = layers of that stack): "Apply Xavier initialization for all parameters excluding input
embeddings. Use Gaussian initialization N(0, d^-1/2) for input embeddings", then scale v and w of each attention,
the MLP weights and the input embeddings by the stack's factor (tfixup/tfixup_init.py: encoder 0.67 N^-1/4,
decoder and embeddings (9N)^-1/4, one stack alone (6N)^-1/4), and no LayerNorm.

A plan is what a model's adapter names: each tensor T-Fixup sets (a ``Draw``: drawn again Xavier-uniform with
gain 1, N(0, d^-1/2) or zero, or kept as the model drew it; then times its factor; and why) and the norms that
become ``nn.Identity``. The adapters: fairseq's layout (``fairseq_layout`` below: the fairseq models of
fairseq_tfixup/models, and HuggingFace's Marian and BART, built like fairseq's), torch's stacks and a user's
layers (tfixup/torch_tfixup.py), the other HuggingFace families (tfixup/hf.py, which also decides which norms
an option keeps). The order of a plan's draws is the order of the random draws.
"""

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from tfixup import tfixup_init


@dataclasses.dataclass
class Draw:
    """One tensor T-Fixup sets: ``how`` is "xavier" (Xavier-uniform, gain 1, of ``weight[index]`` as its own
    matrix), "normal" (N(0, d^-1/2), ``padding_idx`` row zero), "zeros" or "keep" (the model's own draw is the
    paper's already); then times ``scale``. ``why``: the part and stack it plays (``table``)."""

    weight: torch.Tensor
    how: str
    scale: float = 1.0
    why: str = ""
    index: Optional[tuple] = None
    label: str = ""  # suffix of the report name ("[v]": the value part of a fused qkv)
    padding_idx: Optional[int] = None
    name: str = ""  # the report name of a tensor outside the model


@dataclasses.dataclass
class Plan:
    draws: List[Draw]
    norms: List[Tuple[nn.Module, str]] = dataclasses.field(default_factory=list)  # (parent, attribute)
    inputs: List[nn.Module] = dataclasses.field(default_factory=list)  # token embeddings without a sqrt(d)


def is_norm(module: nn.Module) -> bool:
    """A LayerNorm or RMSNorm: torch's, fairseq's (apex's FusedLayerNorm on GPU) or a model's own class."""
    kind = type(module).__name__
    return isinstance(module, (nn.LayerNorm, getattr(nn, "RMSNorm", nn.LayerNorm))) or "LayerNorm" in kind or \
        kind.endswith("RMSNorm")


def norms(model: nn.Module) -> List[Tuple[nn.Module, str]]:
    """Every norm of MODEL, as (parent, attribute)."""
    return [(parent, attr) for parent in model.modules() for attr, child in parent.named_children() if is_norm(child)]


@torch.no_grad()
def execute(model: nn.Module, plan: Plan) -> Dict[str, float]:
    """PLAN carried out on MODEL, in place: its shapes checked before anything changes, its norms replaced by
    nn.Identity, its tensors drawn and scaled in order (a tensor shared by several parts once, by its first);
    returns parameter name (a shared one under its first) -> the factor it was multiplied by."""
    for draw in plan.draws:
        if draw.how in ("xavier", "normal") and _view(draw).dim() != 2:
            raise ValueError(f"apply_tfixup: {type(model).__name__}: a {tuple(_view(draw).shape)} weight where a "
                             "matrix was expected")
    for parent, attr in plan.norms:
        setattr(parent, attr, nn.Identity())
    names = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), name)
    done: Dict[str, float] = {}
    seen = set()
    for draw in plan.draws:
        if (id(draw.weight), draw.label) in seen:
            continue
        seen.add((id(draw.weight), draw.label))
        view = _view(draw)
        if draw.how == "xavier":
            nn.init.xavier_uniform_(view)  # its bound is symmetric in the fans: a Conv1D's (in, out) weight alike
        elif draw.how == "normal":
            nn.init.normal_(view, mean=0.0, std=view.shape[1] ** -0.5)
            if draw.padding_idx is not None:
                view[draw.padding_idx].zero_()
        elif draw.how == "zeros":
            view.zero_()
            continue
        view.mul_(draw.scale)
        done[names.get(id(draw.weight), draw.name) + draw.label] = draw.scale
    return done


def table(model: nn.Module, plan: Plan) -> Dict[str, Tuple[str, float, str]]:
    """PLAN read against the paper: parameter name -> (how, factor, why); a shared tensor by its first part."""
    names = {id(p): name for name, p in reversed(list(model.named_parameters(remove_duplicate=False)))}
    out: Dict[str, Tuple[str, float, str]] = {}
    for draw in plan.draws:
        out.setdefault(names.get(id(draw.weight), draw.name) + draw.label, (draw.how, draw.scale, draw.why))
    return out


def _view(draw: Draw) -> torch.Tensor:
    return draw.weight if draw.index is None else draw.weight[draw.index]


# ---------------------------------------------------------------- the parts adapters name


def weight(module: nn.Module, what: str) -> torch.Tensor:
    """MODULE's 2-D weight; a one-line refusal for a module laid out otherwise."""
    w = getattr(module, "weight", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        raise ValueError(f"apply_tfixup: {what} is a {type(module).__name__} without a 2-D weight: not the layout "
                         "of this model type")
    return w


def mlp(linears: Sequence[nn.Module], scale: float, why: str) -> List[Draw]:
    """An MLP's matrices drawn Xavier and scaled, its biases zero (fairseq 0.9's Linear, the authors')."""
    draws = []
    for linear in linears:
        draws.append(Draw(weight(linear, "an MLP matrix"), "xavier", scale, f"{why} MLP"))
        if getattr(linear, "bias", None) is not None:
            draws.append(Draw(linear.bias, "zeros", 1.0, f"{why} MLP bias"))
    return draws


def embedding(module: nn.Module, scale: float, why: str, redraw: bool = True) -> Draw:
    """A token embedding, N(0, d^-1/2) (drawn again, or the model's own), times ``scale``."""
    return Draw(weight(module, "the token embedding"), "normal" if redraw else "keep", scale, f"{why} token embedding",
                padding_idx=getattr(module, "padding_idx", None))


def fairseq_layout(stacks: Sequence[Tuple[nn.Module, str]], redraw: bool) -> List[Draw]:
    """The draws of fairseq's stacks, [(stack, role)] with role "encoder", "decoder" or "single"
    (tfixup_init.stack_factors): each layer's ``self_attn`` and a decoder's ``encoder_attn`` (``v_proj``,
    ``out_proj``), ``fc1``, ``fc2``, then each stack's ``embed_tokens`` (a shared one takes the first's factor).
    fairseq draws ``out_proj`` Xavier and the embedding N(0, d^-1/2) already: ``redraw=False`` keeps both and
    only scales them; ``v_proj`` (gain 1/sqrt(2)) and ``fc1``/``fc2`` (torch's Linear) are drawn again.
    ``redraw=True`` draws all of them (HuggingFace's Marian and BART: their own init is N(0, 0.02))."""
    draws = []
    for stack, role in stacks:
        scale = tfixup_init.stack_factors(role, len(stack.layers))[0]
        for layer in stack.layers:
            for attention in (layer.self_attn, layer.encoder_attn if role == "decoder" else None):
                if attention is not None:
                    draws += [Draw(weight(attention.v_proj, "v_proj"), "xavier", scale, f"{role} v"),
                              Draw(weight(attention.out_proj, "out_proj"), "xavier" if redraw else "keep", scale,
                                   f"{role} w")]
            draws += mlp([layer.fc1, layer.fc2], scale, role)
    for stack, role in stacks:  # after the blocks: no random draw of the blocks moves with an embedding's
        factor = tfixup_init.stack_factors(role, len(stack.layers))[1]
        draws.append(embedding(stack.embed_tokens, factor, role, redraw))
    return draws
