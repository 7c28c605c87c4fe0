"""What the baselines' layer subclasses share with fairseq's own stacks: the stacks that build them
(``LayerClassEncoder``, ``LayerClassDecoder``) and the wrapping fairseq gives its own layers."""

from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import TransformerDecoderBase, TransformerEncoderBase
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase


def wrap_layer(layer, cfg):
    """Wrap a layer the way fairseq 0.12's ``build_encoder_layer``/``build_decoder_layer`` do.

    Those builders construct fairseq's own layer class, so a stack that builds a
    subclass must apply activation checkpointing and FSDP itself.
    """
    if cfg.checkpoint_activations:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    # like fairseq: a checkpointed layer is always wrapped by FSDP, whatever its size
    return fsdp_wrap(layer, min_num_params=0 if cfg.checkpoint_activations else cfg.min_params_to_wrap)


class LayerClassEncoder(TransformerEncoderBase):
    """fairseq's encoder, its layers of class ``layer_class`` (a subclass of fairseq's encoder layer)."""

    layer_class = TransformerEncoderLayerBase

    def build_encoder_layer(self, cfg):
        return wrap_layer(self.layer_class(cfg, return_fc=self.return_fc), cfg)


class LayerClassDecoder(TransformerDecoderBase):
    """fairseq's decoder, its layers of class ``layer_class`` (a subclass of fairseq's decoder layer)."""

    layer_class = TransformerDecoderLayerBase

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return wrap_layer(self.layer_class(cfg, no_encoder_attn), cfg)
