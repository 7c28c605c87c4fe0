"""T-Fixup's HuggingFace models as transformers' own custom models: ``import tfixup.hf_auto``.

``apply_tfixup(model)`` records what it chose in the model's config (``config.tfixup``: the family, the input
multiplier, ``keep_mlp_norm``) and turns the model and its config into T-Fixup classes of their own: a
``LlamaForCausalLM`` becomes a ``TFixupLlamaForCausalLM`` (a subclass, nothing else changed) whose config is a
``TFixupLlamaConfig`` of model type ``tfixup_llama``. ``save_pretrained`` writes that model type and the record to
config.json; importing this module registers each T-Fixup config and model class with transformers' Auto classes
(``AutoConfig.register``, ``AutoModel*.register``: its documented way for custom models), so that
``AutoModelForCausalLM.from_pretrained(folder)``, ``pipeline(..., model=folder)`` and Trainer's checkpoints give
back the saved model: the class removes the same norms and adds the same multiplier (``tfixup.hf.rebuild``), and
the weights are the folder's, never drawn again. No code is read from the folder (no ``trust_remote_code``); the
record is read by an allow-list (``tfixup.hf.check_record``).

Without this module, transformers does not know the model type ``tfixup_llama``: its Auto classes and
``pipeline`` refuse the folder, and an explicit ``LlamaForCausalLM.from_pretrained(folder)`` warns that the folder
is of type ``tfixup_llama`` (and reports the norms it finds missing), rather than giving a stock Llama silently.

A T-Fixup class built from its config (``AutoModelForCausalLM.from_config(config)``, ``TFixupLlamaForCausalLM(
config)``) is a fresh T-Fixup model: the stock class's initialisation, then T-Fixup's draws. Built on the meta device
it draws nothing; after ``model.to_empty(device=...)``, ``model.init_weights()`` draws both.
"""

import copy
import sys
from typing import Dict, Type

import torch
import transformers
from transformers.models.auto import configuration_auto, modeling_auto

from tfixup import hf

PREFIX = "tfixup_"
_CONFIGS: Dict[str, type] = {}  # family -> T-Fixup config class
_MODELS: Dict[type, type] = {}  # stock model class -> T-Fixup model class


def _materialised(model: torch.nn.Module) -> bool:
    """Every parameter allocated: not on the meta device (from_pretrained's build, accelerate's empty init), not
    partitioned away (DeepSpeed ZeRO-3's zero.Init)."""
    return all(not p.is_meta and p.numel() > 0 for p in model.parameters())


class TFixupConfigMixin:
    """A family's config with T-Fixup's record: ``tfixup`` (a mapping; apply_tfixup's defaults when left out),
    read by an allow-list when the config is made, from config.json or by hand."""

    def __post_init__(self, **kwargs):
        record = kwargs.pop("tfixup", None)
        super().__post_init__(**kwargs)
        family = type(self).model_type[len(PREFIX):]
        if record is None:  # what apply_tfixup does by default (Marian and BART keep their own multiplier)
            record = {"format": hf.RECORD_FORMAT, "family": family, **hf.OPTIONS,
                      "input_scale": family not in hf.ENCODER_DECODER}
        options = hf.check_record(record, family)
        self.tfixup = {"format": hf.RECORD_FORMAT, "family": family, **options}


class TFixupModelMixin:
    """A stock model class with T-Fixup's layout: its norms removed (or kept) and the input multiplier added as the
    config's record says. Its weights: the folder's (from_pretrained), or T-Fixup's draws (built from a config)."""

    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        hf.rebuild(self, hf.check_record(hf.record_of(config), config.model_type[len(PREFIX):]))
        if _materialised(self):  # a new model: the stock initialisation ran in __init__; T-Fixup's draws now
            hf.redraw(self)

    def init_weights(self):
        """The stock initialisation, then T-Fixup's draws, where transformers initialises: a model materialised from
        the meta device. A model initialised already (built, or loaded from a folder) is left as it is, as
        transformers leaves it."""
        fresh = not getattr(self, "_is_hf_initialized", False)
        super().init_weights()
        if fresh and getattr(self, "tfixup_applied", False) and _materialised(self):
            hf.redraw(self)


def config_class(family: str) -> type:
    """The T-Fixup config class of FAMILY (``TFixupLlamaConfig``, model type ``tfixup_llama``)."""
    if family not in _CONFIGS:
        base = configuration_auto.CONFIG_MAPPING[family]
        name = "TFixup" + base.__name__
        cls = type(name, (TFixupConfigMixin, base), {"model_type": PREFIX + family, "__module__": __name__,
                                                     "__qualname__": name})
        setattr(sys.modules[__name__], name, cls)  # importable by name (pickle, copy)
        _CONFIGS[family] = cls
    return _CONFIGS[family]


def model_class(base: Type[torch.nn.Module], family: str) -> type:
    """The T-Fixup subclass of the stock model class BASE of FAMILY (``TFixupLlamaForCausalLM``)."""
    if base not in _MODELS:
        name = "TFixup" + base.__name__
        cls = type(name, (TFixupModelMixin, base), {"config_class": config_class(family), "__module__": __name__,
                                                    "__qualname__": name})
        setattr(sys.modules[__name__], name, cls)
        _MODELS[base] = cls
    return _MODELS[base]


def adopt(model: torch.nn.Module, record: dict) -> None:
    """MODEL (just changed by apply_tfixup) and its config become T-Fixup classes, the config holding RECORD. The
    config is copied first: models built from one config object share it, and the others are not T-Fixup's."""
    family, stock = record["family"], model.config
    config = copy.deepcopy(stock)
    config.__class__ = config_class(family)
    config.tfixup = dict(record)
    for module in model.modules():  # the model, its base model, and the layers that keep a reference
        if getattr(module, "config", None) is stock:
            module.config = config
    model.__class__ = model_class(type(model), family)


def register() -> None:
    """Each family's T-Fixup config with AutoConfig, and the T-Fixup class of each of its stock heads with the Auto
    class that maps the stock config to that head (AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM,
    AutoModelForSeq2SeqLM, ...). Idempotent."""
    autos = [getattr(modeling_auto, n) for n in dir(modeling_auto) if n.startswith("AutoModel")]
    autos = [a for a in autos if isinstance(a, type) and getattr(a, "_model_mapping", None) is not None]
    for family in hf.SUPPORTED:
        tfixup_config = config_class(family)
        transformers.AutoConfig.register(PREFIX + family, tfixup_config, exist_ok=True)
        stock = configuration_auto.CONFIG_MAPPING[family]
        for auto in autos:
            head = auto._model_mapping[stock] if stock in auto._model_mapping else None
            if isinstance(head, type) and head.config_class is stock:  # not another model type's class
                auto.register(tfixup_config, model_class(head, family), exist_ok=True)


register()
