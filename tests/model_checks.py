"""Checks shared by the model tests (T-Fixup's and the baselines'): incremental decoding against the
full forward pass, a state-dict round trip, and a short fairseq-train run on real data."""

import math

import torch

from conftest import USER_DIR, build_model, fairseq_command
from harness.fairseq_log import records

# a model small enough for a few dozen CPU updates in seconds
TINY = ["--encoder-embed-dim", "64", "--decoder-embed-dim", "64", "--encoder-ffn-embed-dim", "128",
        "--decoder-ffn-embed-dim", "128", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]
UPDATES = 25  # on the main job's data-bin at 512 tokens and lr 1e-3, every method's loss falls by 0.8-3.3 bits
LOG_INTERVAL = 5


def build_tiny(dict_dir, arch, n_enc, n_dec, *flags, seed=1):
    """A TINY model of n_enc + n_dec layers, built like fairseq-train builds it: (model, task, args)."""
    return build_model(dict_dir, arch, "--encoder-layers", n_enc, "--decoder-layers", n_dec, *TINY, *flags, seed=seed)


def trained_looking_(model):
    """Perturb every weight (so that, e.g., a wrong decoding cache would show: an initialisation
    may make layers near-identity) and switch to eval mode."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


def assert_incremental_decoding_matches_full(model, vocab=500):
    """Decoding one token at a time (fairseq's incremental state) gives the full pass's outputs."""
    torch.manual_seed(0)
    src = torch.randint(4, vocab, (3, 9))
    prev = torch.cat([torch.full((3, 1), 2), torch.randint(4, vocab, (3, 7))], dim=1)
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=torch.full((3,), 9))
        full, _ = model.decoder(prev, encoder_out=enc)
        state = {}
        steps = [model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)[0]
                 for t in range(prev.size(1))]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-4, atol=1e-5)


def assert_encoder_survives_state_dict_round_trip(model, vocab=500):
    """fairseq 0.12.2 switches encoder layers to a fused post-LN kernel (plain LayerNorm(x + G(x)))
    once a state dict is loaded; a model must compute the same function after loading its own."""
    src = torch.randint(4, vocab, (2, 9))
    with torch.no_grad():
        before = model.encoder(src, src_lengths=torch.full((2,), 9))["encoder_out"][0]
        model.load_state_dict(model.state_dict())
        after = model.encoder(src, src_lengths=torch.full((2,), 9))["encoder_out"][0]
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-6)


def falling_losses(log, count: int, by: float = 0.5) -> list:
    """The COUNT training losses (bits) of LOG's train_inner lines: finite, the last BY below the first."""
    losses = [float(r["loss"]) for r in records(log, "train_inner")]
    assert len(losses) == count and all(math.isfinite(x) for x in losses), losses
    assert losses[-1] < losses[0] - by, losses
    return losses


def train_briefly(data, method):
    """fairseq-train --user-dir fairseq_tfixup for UPDATES updates of a TINY 2+2-layer ``method`` (a row of
    tfixup/methods.py, trained as the project's one builder trains it: its own optimizer, warmup over 10
    updates or none) on CPU; returns the log after checking that the training loss is finite and falls."""
    from tfixup import methods

    recipe = methods.Recipe(method, 64, 128, 2, 2, 2, lr="1e-3", warmup=10, share="none", max_tokens=512,
                            max_update=UPDATES)
    log = fairseq_command("train", data, *methods.train_args(recipe, USER_DIR, cpu=True, log_format="json", num_workers=0),
                          "--disable-validation", "--no-save", "--log-interval", LOG_INTERVAL)
    assert [int(r["num_updates"]) for r in records(log, "train_inner")] == list(range(LOG_INTERVAL, UPDATES + 1,
                                                                                     LOG_INTERVAL))
    print(f"train loss (bits) every {LOG_INTERVAL} updates: {falling_losses(log, UPDATES // LOG_INTERVAL)}")
    return log


def train_lm_briefly(lm_bin, method, schedule: str = "auto") -> str:
    """The LM study's command (tfixup.methods.train_args) for a 2-layer 64-dim language model of ``method``,
    20 updates on ``lm_bin``; returns the log after checking that the training loss is finite and falls."""
    from tfixup import methods

    recipe = methods.Recipe(method, 64, 128, 4, 0, 2, lr="1e-3", schedule=schedule, warmup=5, max_tokens=512,
                            max_update=20, task="language_modeling", tokens_per_sample=32)
    log = fairseq_command("train", lm_bin, *methods.train_args(recipe, USER_DIR, cpu=True, log_format="json",
                                                               num_workers=0),
                          "--no-save", "--disable-validation", "--log-interval", "5")
    falling_losses(log, 4)
    return log
