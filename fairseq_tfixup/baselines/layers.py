"""What the baselines' layer subclasses share with fairseq's own stacks."""

from fairseq.distributed import fsdp_wrap
from fairseq.modules.checkpoint_activations import checkpoint_wrapper


def wrap_layer(layer, cfg):
    """Wrap a layer the way fairseq 0.12's ``build_encoder_layer``/``build_decoder_layer`` do.

    Those builders construct fairseq's own layer class, so a stack that builds a
    subclass must apply activation checkpointing and FSDP itself.
    """
    if cfg.checkpoint_activations:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    # like fairseq: a checkpointed layer is always wrapped by FSDP, whatever its size
    return fsdp_wrap(layer, min_num_params=0 if cfg.checkpoint_activations else cfg.min_params_to_wrap)
