"""End to end through fairseq's own command lines, on the real IWSLT'14 sample:
fairseq-preprocess (scripts/prepare-iwslt14.sh) -> fairseq-train --user-dir fairseq_tfixup -> fairseq-generate.
The module's model is trained a few updates and translated by those commands' entry points in one interpreter
(PROBE); the resume and the hydra run start the console scripts themselves. That training learns is read
from the session's trained run (conftest.trained_run: fairseq-train through scripts/train.sh, 30 updates)."""

import json
import math
import re
import shutil
import subprocess
import sys

import pytest
import torch
from fairseq import checkpoint_utils

import fairseq_tfixup  # noqa: F401  (registers transformer_tfixup for in-process loading)
from tfixup import checkpoints
from harness import recover
from harness.fairseq_log import records
from conftest import USER_DIR, TRAINED_ENV

MODEL = ["--arch", "transformer_tfixup_iwslt_de_en", "--encoder-embed-dim", "128", "--decoder-embed-dim", "128",
         "--encoder-ffn-embed-dim", "256", "--decoder-ffn-embed-dim", "256", "--encoder-layers", "2",
         "--decoder-layers", "2", "--share-decoder-input-output-embed"]
# the IWSLT recipe of the paper, with a small model and batch for a CPU
RECIPE = ["--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--lr", "5e-4", "--lr-scheduler",
          "inverse_sqrt_nowarmup", "--decay-period", "4000", "--criterion", "label_smoothed_cross_entropy",
          "--label-smoothing", "0.1", "--dropout", "0.1", "--weight-decay", "1e-4", "--max-tokens", "1024"]
# the module's model: a few updates (a multiple of the resume's log interval, 5), enough for a checkpoint
# that is not the initialisation (what it loads and resumes); that training learns is
# test_valid_loss_falls_at_every_validation's, on the trained run
UPDATES = 5
# fairseq-generate as scripts/evaluate.sh runs it: hypotheses capped at 1.2 x source + 10 tokens (an
# undertrained model otherwise writes up to 200 tokens a sentence, and generation takes minutes)
LENGTH_CAP = ["--max-len-a", "1.2", "--max-len-b", "10"]


def train_args(data, save_dir, max_update, *extra, user_dir=USER_DIR):
    return [str(data), "--user-dir", str(user_dir), *MODEL, *RECIPE,
            "--max-update", str(max_update), "--disable-validation",
            "--no-epoch-checkpoints", "--save-dir", str(save_dir), "--cpu", "--seed", "1",
            "--log-format", "json", "--log-interval", "25", *extra]


def train(data, save_dir, max_update, *extra, user_dir=USER_DIR, cwd=None):
    proc = subprocess.run(["fairseq-train", *train_args(data, save_dir, max_update, *extra, user_dir=user_dir)],
                          capture_output=True, text=True, cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def generate_args(data, checkpoint):
    """fairseq-generate on the fixture's real test slice, as scripts/evaluate.sh runs it."""
    return [str(data), "--user-dir", str(USER_DIR), "--path", str(checkpoint), "--gen-subset", "test", "--beam", "4",
            "--lenpen", "0.3", "--remove-bpe", "--batch-size", "100", "--required-batch-size-multiple", "1",
            "--cpu", *LENGTH_CAP]


# One fresh interpreter trains the module's model and translates the test slice with fairseq's own
# entry points (fairseq-train's and fairseq-generate's cli_main: what those commands run), recording
# every attempt to import torchaudio on the way (a failed one leaves nothing in sys.modules). One
# process for the three, not three: each start imports fairseq (~5 s of CPU).
PROBE = r"""
import json, sys
attempts = []
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torchaudio":
            attempts.append(name)
        return None
sys.meta_path.insert(0, Spy())
data, train_args, generate_args = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
from fairseq_cli import train  # first: it sets up logging before importing fairseq, as fairseq-train does
from fairseq_cli import generate
import fairseq_tfixup
from fairseq_tfixup.diagnostics.models import build_from_flags
build_from_flags(data, ["-s", "de", "-t", "en", "--arch", "transformer_tfixup_deep_narrow"], seed=1)
sys.argv = ["fairseq-train", *train_args]
train.cli_main()
print("=== GENERATE ===", flush=True)
sys.argv = ["fairseq-generate", *generate_args]
generate.cli_main()
print("TORCHAUDIO", json.dumps({"attempts": attempts, "loaded": "torchaudio" in sys.modules}))
"""


@pytest.fixture(scope="module")
def trained(iwslt_bin, tmp_path_factory):
    """(save dir, training log, generation output, torchaudio record) of the probe above."""
    save_dir = tmp_path_factory.mktemp("ckpt")
    proc = subprocess.run([sys.executable, "-c", PROBE, str(iwslt_bin),
                           json.dumps(train_args(iwslt_bin, save_dir, UPDATES)),
                           json.dumps(generate_args(iwslt_bin, save_dir / "checkpoint_last.pt"))],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    train_out, generate_out = proc.stdout.split("=== GENERATE ===\n", 1)
    generate_out, torchaudio = generate_out.split("TORCHAUDIO ", 1)
    return save_dir, train_out + proc.stderr, generate_out + proc.stderr, json.loads(torchaudio)


def test_valid_loss_falls_at_every_validation(trained_run):
    """fairseq-train learns through the plugin: the trained run (validated at each of its checkpoints, every
    10 updates, the first of them in the run that was killed) has a lower valid loss at each, and more than
    half a bit lower at update 30 than at 10 (most of the fall from the untrained model's level, log2 of a
    10k vocabulary, comes before update 10)."""
    out, _, _, _ = trained_run
    log = (out / "train.log").read_text()  # both runs: train.sh appends
    assert "T-Fixup: no LayerNorm" in log
    valid = records(log, "valid")
    losses = [float(r["valid_loss"]) for r in valid]
    every = int(TRAINED_ENV["SAVE_INTERVAL_UPDATES"])
    assert [int(r["valid_num_updates"]) for r in valid] == list(range(every, 31, every))
    assert all(math.isfinite(x) for x in losses)
    print(f"valid loss (bits) every {every} updates: {losses}")
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert losses[-1] < losses[0] - 0.5, losses  # bits per token
    train_losses = [float(r["loss"]) for r in records(log, "train_inner")]
    assert train_losses and all(math.isfinite(x) for x in train_losses)


def test_generate_translates_the_real_test_slice(trained):
    _, _, out, _ = trained
    hyps = [l for l in out.splitlines() if l.startswith("H-")]
    assert len(hyps) == 60  # the fixture's real test slice
    assert sum(len(h.split("\t")[2].split()) for h in hyps) > 60  # not empty translations
    bleu = re.search(r"Generate test with beam=4: BLEU4 = ([\d.]+)", out)
    assert bleu and math.isfinite(float(bleu.group(1)))


def test_nothing_imports_torchaudio(trained):
    """fairseq-fixed pulls torchaudio, which may not import (a CUDA build beside a CPU torch): the plugin,
    model building, training and generation (the fixture's probe) must not even try it."""
    _, log, out, torchaudio = trained
    assert "done training" in log and "T-Fixup: no LayerNorm" in log and "BLEU4 = " in out  # all the way
    assert torchaudio == {"attempts": [], "loaded": False}


def test_loading_a_checkpoint_does_not_rescale_trained_weights(trained, iwslt_bin):
    save_dir, *_ = trained
    path = save_dir / "checkpoint_last.pt"
    saved = checkpoints.load(path)["model"]
    # fairseq builds the model (which applies T-Fixup to fresh weights), then loads the state dict
    models, _ = checkpoint_utils.load_model_ensemble([str(path)])
    # fairseq 0.12.2's encoder layers also hold copies for a fused inference kernel (in_proj_weight,
    # fc1_weight, ...), refilled from the real weights on load and unused by T-Fixup: skip them
    fused_copy = re.compile(r"\.layers\.\d+\.(in_proj|out_proj|fc1|fc2)_(weight|bias)$")
    loaded = {n: p for n, p in models[0].named_parameters() if not fused_copy.search(n)}
    assert set(loaded) <= set(saved)
    assert "encoder.layers.0.fc1.weight" in loaded and "decoder.embed_tokens.weight" in loaded
    for name, value in loaded.items():
        torch.testing.assert_close(value, saved[name], rtol=0, atol=0, msg=name)
    # the check above means something: building the model alone (T-Fixup init, same seed) gives
    # other weights, so equal weights were loaded, not re-initialised or rescaled
    from fairseq_tfixup.diagnostics.models import build_from_flags

    _, _, fresh, _ = build_from_flags(iwslt_bin, [*MODEL, *RECIPE], seed=1)
    for name in ("encoder.layers.0.fc2.weight", "decoder.layers.1.self_attn.v_proj.weight"):
        assert not torch.allclose(dict(fresh.named_parameters())[name], saved[name]), name


def test_resume_continues_from_checkpoint_last(trained, iwslt_bin, tmp_path):
    """Resumed as from a checkout: cwd the repo root, `--user-dir fairseq_tfixup` by name (the
    installed case is test_hydra_config_with_common_user_dir_by_name)."""
    save_dir, *_ = trained
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(save_dir, resumed_dir)
    # 10 more updates, logged every 5: what is checked is the resume
    log = train(iwslt_bin, resumed_dir, UPDATES + 10, "--disable-validation", "--log-interval", "5",
                user_dir="fairseq_tfixup", cwd=USER_DIR.parent)
    assert "TFixupTransformerModel" in log
    assert re.search(rf"Loaded checkpoint .*checkpoint_last\.pt \(epoch \d+ @ {UPDATES} updates\)", log), log[-2000:]
    inner = records(log, "train_inner")
    assert int(inner[0]["num_updates"]) == UPDATES + 5  # continued, not restarted
    assert int(inner[-1]["num_updates"]) == UPDATES + 10
    # the schedule continues too: lr * sqrt(P / (P + t)) at t = UPDATES + 10
    assert float(inner[-1]["lr"]) == pytest.approx(5e-4 * math.sqrt(4000 / (4000 + UPDATES + 10)), rel=1e-4)


def installed_user_dir() -> str:
    """'fairseq_tfixup' by name where it is installed next to fairseq (scripts/install.sh puts it there;
    fairseq also looks for user dirs beside its own package), else the checkout's path (an editable
    install; CI must have the installed one)."""
    import os

    import fairseq

    if os.path.isdir(os.path.join(os.path.dirname(fairseq.__file__), "..", "fairseq_tfixup")):
        return "fairseq_tfixup"
    if os.environ.get("CI"):
        pytest.fail("fairseq_tfixup is not installed next to fairseq (scripts/install.sh does that)")
    return str(USER_DIR)


def test_hydra_config_with_common_user_dir_by_name(iwslt_bin, tmp_path):
    """fairseq-hydra-train with `common.user_dir: fairseq_tfixup`, relative, from a directory without
    it: the installed copy is found by name (from a checkout: test_resume_continues_from_checkpoint_last)."""
    config = tmp_path / "tfixup.yaml"
    config.write_text(f"""
common: {{user_dir: {installed_user_dir()}, cpu: true, log_format: json, log_interval: 1, seed: 1}}
task: {{_name: translation, data: {iwslt_bin}, source_lang: de, target_lang: en}}
model: {{_name: transformer_tfixup, encoder: {{embed_dim: 64, ffn_embed_dim: 128, layers: 1, attention_heads: 2}},
         decoder: {{embed_dim: 64, ffn_embed_dim: 128, layers: 1, attention_heads: 2}}}}
criterion: {{_name: cross_entropy}}
optimizer: {{_name: adam, adam_betas: [0.9, 0.98]}}
lr_scheduler: {{_name: inverse_sqrt_nowarmup, decay_period: 100}}
optimization: {{lr: [0.0005], max_update: 3}}
dataset: {{max_tokens: 1024, validate_interval_updates: 0, disable_validation: true}}
checkpoint: {{save_dir: {tmp_path / 'ckpt'}, no_epoch_checkpoints: true}}
""")
    proc = subprocess.run(["fairseq-hydra-train", "--config-dir", str(tmp_path), "--config-name", "tfixup",
                           f"hydra.run.dir={tmp_path / 'hydra'}"], capture_output=True, text=True, cwd=tmp_path)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert "TFixupTransformerModel" in log
    assert int(records(log, "train_inner")[-1]["num_updates"]) == 3
    assert float(records(log, "train_inner")[-1]["lr"]) == pytest.approx(5e-4 * math.sqrt(100 / 103), rel=1e-4)
    # a hydra run's checkpoint loads safely (weights_only) with only what the plugin registers
    assert recover.num_updates(tmp_path / "ckpt" / "checkpoint_last.pt") == 3
