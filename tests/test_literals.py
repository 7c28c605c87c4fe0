"""Config strings fairseq eval()s. A real checkpoint (a tiny T-Fixup model, saved
as fairseq saves it) holding only dicts, a Namespace, strings and tensors, whose
encoder_xformers_att_config, adaptive_softmax_cutoff or adam_betas is
"(__import__('os').system('touch X'), None)[1]", ran that command through fairseq-generate, evaluate.sh
and the hub; ADAM_BETAS in a config did the same through train.sh. Here each entry point refuses it in
one line naming the file and the field, X is never made, and real checkpoints still load."""

import copy
import os
import subprocess

import sys

import pytest
import torch

from conftest import REPO, USER_DIR, fairseq_command

import fairseq_tfixup  # noqa: F401  (installs the checks, as --user-dir does)
from tfixup import checkpoints, literals
from tfixup.errors import Refused

SCRIPTS = REPO / "scripts"


def payload(marker) -> str:
    """Runs `touch MARKER` when eval()'d, and evaluates to None, so a model builds as usual."""
    return f"(__import__('os').system('touch {marker}'), None)[1]"


@pytest.mark.parametrize("text, value", [
    ("(0.9,0.98)", (0.9, 0.98)), ("(0.9, 0.999)", (0.9, 0.999)), ("(1e-30, 1e-3)", (1e-30, 1e-3)),
    ("[(512, 3)] * 2", [(512, 3), (512, 3)]),  # fairseq's fconv default form
    ("[(512, 10, 5)] + [(512, 3, 2)] * 2", [(512, 10, 5), (512, 3, 2), (512, 3, 2)]),  # wav2vec's
    ("{'name': 'scaled_dot_product', 'dropout': -0.0}", {"name": "scaled_dot_product", "dropout": 0.0}),
    ("None", None), ("True", True), ("-1e-3", -1e-3), ("'x' * 3", "xxx"),
])
def test_literals_fairseq_itself_uses_are_accepted(text, value):
    assert literals.literal(text, "f") == value


@pytest.mark.parametrize("text", [
    "(__import__('os').system('true'), None)[1]", "(0.9,0.98) if __import__('os') else 0", "open('x')",
    "lambda: 0", "[x for x in ()]", "().__class__", "f'{1}'", "[0] * 10 ** 9", "[0] * 10000000", "'a' * 99999999",
    "9" * 50 + " * " + "9" * 50 + " * " + "9" * 50 + " * 9" * 1000, "{**{}}", "...", "x",
])
def test_anything_else_is_refused_in_one_line_naming_the_field(text):
    with pytest.raises(literals.NotALiteral) as e:
        literals.literal(text, "adam_betas")
    line = str(e.value)
    assert "\n" not in line and line.startswith("adam_betas=")
    assert "is not a Python literal" in line or "is refused: " in line and "(the limit, MAX_" in line


def _nested(levels: int, width: int = 2) -> str:
    text = "0"
    for _ in range(levels):
        text = f"[{text}] * {width}"
    return text


@pytest.mark.parametrize("text, limit", [
    ("(" + "[0]*1000000," * 300 + ")", "MAX_ITEMS"),  # 300 lists of a million: 2.4 GB when built
    ("(" + "[0]*1000000," * 8000 + ")", "MAX_TEXT"),  # a 96 KB field asking for ~63 GB
    (_nested(30), "MAX_NESTING"),  # 2**30 leaves in shared lists: small to build, endless to walk
    ("[[[0] * 1024] * 1024] * 1024", "MAX_ITEMS"),  # the same, shallow
    ("[[0] * 1000] * 1001", "MAX_ITEMS"),
    ("'" + "a" * 9_000 + "' * 112", "MAX_ITEMS"), ("b'ab' * 600000", "MAX_ITEMS"),
    ("[" + "0," * 3_000 + "]", "MAX_NODES"), ("[" * 40 + "]" * 40, "MAX_NESTING"),
    ("9" * 1300 + " * " + "9" * 1300, "MAX_BITS"), ("'x' * " + "9" * 10_001, "MAX_TEXT"),
])
def test_sizes_are_bounded_from_the_syntax_before_anything_is_built(text, limit):
    """The guard capped each sequence, not the total: these were accepted (the first took 2.4 GB and
    5 s; nested shared lists kept fairseq-generate busy ~40 min). Each is refused from its syntax, in one
    line naming the field and the limit, having allocated next to nothing (no clock: a walk of the value
    would not return here at all)."""
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(literals.TooLarge) as e:
            literals.literal(text, "encoder_xformers_att_config")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    line = str(e.value)
    assert "\n" not in line and line.startswith("encoder_xformers_att_config=") and f"(the limit, {limit})" in line
    assert peak < 20e6, peak  # the parse tree of a 96 KB text: a few MB, not the value it describes


def test_the_largest_literals_within_the_limits_still_build():
    assert len(literals.literal("[0] * 1000000")) == literals.MAX_ITEMS
    assert len(literals.literal("[[0] * 999] * 1000")) == 1000
    assert literals.literal(_nested(15)) == eval(_nested(15))  # noqa: S307  (the test's own text)


@pytest.mark.parametrize("field, text", [
    ("adam_betas", "(1,2,3)"), ("adam_betas", "'abc'"), ("adam_betas", "b'ab'"),
    ("adam_betas", "(0.9,1.0)"),  # trained flat: a second moment that never moves
    ("adam_betas", "(0.9, -0.1)"), ("lamb_betas", "(0.9, 1e9)"), ("adafactor_eps", "(1e-30,)"),
    ("encoder_xformers_att_config", "'abc'"),  # said "install xFormers"
    ("adaptive_softmax_cutoff", "(100, 'a')"), ("adaptive_softmax_cutoff", "-5"),
])
def test_wrong_types_and_ranges_are_refused_up_front(field, text):
    """These failed late, at update 1 with a traceback, or trained flat; now one line naming the flag
    and what it takes, on a command line (check_args), in a config's EXTRA_TRAIN_ARGS and where fairseq
    evaluates it."""
    import argparse

    from harness import config

    flag = "--" + field.replace("_", "-")
    with pytest.raises(literals.BadValue) as e:
        literals.check_args(argparse.Namespace(**{field: text}))
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"{flag}=") and " must be " in line
    with pytest.raises(config.ConfigError, match=f"EXTRA_TRAIN_ARGS: {flag}=.* must be "):
        config.evaluated_flags([flag, text], "x.conf: EXTRA_TRAIN_ARGS")
    with pytest.raises(literals.BadValue):
        literals.field_value(text, field)


@pytest.mark.parametrize("field, text", [
    ("adam_betas", "(0.9, 0.98)"), ("adam_betas", "[0, 0.999]"), ("adafactor_eps", "(1e-30, 1e-3)"),
    ("encoder_xformers_att_config", "{'name': 'scaled_dot_product'}"), ("adaptive_softmax_cutoff", "10000,50000"),
    ("adaptive_softmax_cutoff", "5000"), ("wer_args", "('a', 'b', 1.0)"),
])
def test_right_types_pass(field, text):
    literals.field_value(text, field)


def test_fairseq_train_refuses_wrong_betas_in_one_line(dict_dir):
    """fairseq-train's own entry point, in process (conftest.fairseq_command): the plugin's refusal, which
    the console prints as its one line (tfixup/errors.py)."""
    with pytest.raises(Refused) as e:
        fairseq_command("train", dict_dir, "--user-dir", USER_DIR, "--arch", "transformer_tfixup", "--optimizer",
                        "adam", "--adam-betas", "(0.9,1.0)", "-s", "de", "-t", "en", "--cpu")
    assert str(e.value).startswith("--adam-betas='(0.9,1.0)' must be two numbers in [0, 1)")


@pytest.fixture(scope="module")
def crafted(tiny_checkpoint, tmp_path_factory):
    """The real checkpoint (cfg form, as fairseq 0.12 saves: plain containers, the model's Namespace) and
    three crafted from it: the payload in cfg.model.encoder_xformers_att_config, in the legacy args form's
    adaptive_softmax_cutoff, and in cfg.optimizer.adam_betas."""
    real, data, state = tiny_checkpoint
    root = tmp_path_factory.mktemp("crafted")
    marker = root / "X"
    paths = {"real": real}
    evil = copy.deepcopy(state)
    evil["cfg"]["model"].encoder_xformers_att_config = payload(marker)
    paths["encoder_xformers_att_config"] = root / "xformers.pt"
    torch.save(evil, paths["encoder_xformers_att_config"])
    evil = copy.deepcopy(state)
    legacy = copy.deepcopy(state["cfg"]["model"])  # the training arguments, as a legacy checkpoint's args
    legacy.adaptive_softmax_cutoff = payload(marker)
    evil.update(cfg=None, args=legacy)
    paths["adaptive_softmax_cutoff"] = root / "cutoff.pt"
    torch.save(evil, paths["adaptive_softmax_cutoff"])
    evil = copy.deepcopy(state)
    evil["cfg"]["optimizer"]["adam_betas"] = payload(marker)
    paths["adam_betas"] = root / "betas.pt"
    torch.save(evil, paths["adam_betas"])
    return paths, data, marker


FIELDS = ("encoder_xformers_att_config", "adaptive_softmax_cutoff", "adam_betas")


def refused(error, path, field):
    line = str(error)
    assert "\n" not in line and line.startswith(f"{path}: refused: ") and f"{field}=" in line, line


def test_the_crafted_checkpoints_really_run_the_command_without_the_checks(crafted, monkeypatch):
    """The fixture is live: with the checkpoint check bypassed, building the model reaches fairseq's
    eval of each model field (the literal-only helper refuses it there, naming the field); with
    fairseq's own helpers back, it runs the command."""
    from fairseq import checkpoint_utils
    from fairseq.dataclass import utils as dataclass_utils
    import fairseq.utils

    paths, data, marker = crafted
    monkeypatch.setattr(checkpoint_utils, "torch", torch)  # torch's own load: the state is not checked
    monkeypatch.setattr(dataclass_utils, "override_module_args", dataclass_utils.override_module_args.__wrapped__)
    for field, helper in (("encoder_xformers_att_config", "eval_str_dict"), ("adaptive_softmax_cutoff", "eval_str_list")):
        with pytest.raises(literals.NotALiteral, match=field.replace("encoder_", "")):
            checkpoint_utils.load_model_ensemble_and_task([str(paths[field])], arg_overrides={"data": str(data)})
        assert not marker.exists()
        with monkeypatch.context() as m:
            m.setattr(fairseq.utils, helper, literals.FAIRSEQ_ORIGINALS[("fairseq.utils", helper)])
            try:
                checkpoint_utils.load_model_ensemble_and_task([str(paths[field])], arg_overrides={"data": str(data)})
            except TypeError:  # eval_str_list: the payload's None is no list of cutoffs, but it has run
                assert field == "adaptive_softmax_cutoff"
        assert marker.exists(), field
        marker.unlink()


def test_fairseq_loader_and_hub_refuse_them_and_load_the_real_one(crafted):
    """fairseq's one checkpoint loader (fairseq-train's resume, generate, interactive, validate, the hub)
    and the hub's from_pretrained, after `import fairseq_tfixup`; also the plugin's own loader and
    averaging (evaluate.sh)."""
    from fairseq import checkpoint_utils
    from fairseq.models.transformer import TransformerModel

    from harness import average, recover

    paths, data, marker = crafted
    for field in FIELDS:
        path = paths[field]
        with pytest.raises(literals.UnsafeCheckpoint) as e:
            checkpoint_utils.load_model_ensemble_and_task([str(path)], arg_overrides={"data": str(data)})
        refused(e.value, path, field)
        with pytest.raises(literals.UnsafeCheckpoint) as e:
            TransformerModel.from_pretrained(str(path.parent), checkpoint_file=path.name, data_name_or_path=str(data))
        refused(e.value, path, field)
        # fairseq-train's resume (Trainer.load_checkpoint) calls the loader itself; then the plugin's own
        for load in (checkpoint_utils.load_checkpoint_to_cpu, checkpoints.load, recover.num_updates,
                     lambda p: average.average_checkpoints([p])):
            with pytest.raises(literals.UnsafeCheckpoint) as e:
                load(str(path))
            refused(e.value, path, field)
    assert not marker.exists()
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task([str(paths["real"])], arg_overrides={"data": str(data)})
    assert type(models[0]).__name__ == "TFixupTransformerModel"
    hub = TransformerModel.from_pretrained(str(paths["real"].parent), checkpoint_file=paths["real"].name,
                                           data_name_or_path=str(data))
    assert hub.models[0].encoder.embed_tokens.weight.shape == (40 + 4, 16)


def test_fairseq_generate_with_the_plugin_refuses_in_one_line(crafted):
    paths, data, marker = crafted
    path = paths["encoder_xformers_att_config"]
    proc = subprocess.run(["fairseq-generate", str(data), "--user-dir", str(USER_DIR), "--path", str(path),
                           "--task", "translation", "-s", "de", "-t", "en", "--cpu"], capture_output=True, text=True)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {path}: refused: cfg.model.encoder_xformers_att_config=") and "Traceback" not in proc.stderr
    assert not marker.exists()


def run_dir(tmp_path, checkpoint, data):
    """A run folder as train.sh leaves it (its record), holding CHECKPOINT as checkpoint_last.pt."""
    from harness import config

    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    config.record(config.resolve("iwslt14_de_en_tfixup", environ={}), ["fairseq-train ..."], out / config.RECORD, data)
    (out / "checkpoints" / "checkpoint_last.pt").write_bytes(checkpoint.read_bytes())
    return out


@pytest.mark.parametrize("script", ["train.sh", "evaluate.sh"])
def test_train_sh_resume_and_evaluate_sh_refuse_before_fairseq_starts(crafted, tmp_path, script):
    paths, data, marker = crafted
    out = run_dir(tmp_path, paths["encoder_xformers_att_config"], data)
    proc = subprocess.run(["bash", str(SCRIPTS / script), "--cpu", "iwslt14_de_en_tfixup", str(data), str(out)],
                          capture_output=True, text=True)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {out}/checkpoints/checkpoint_last.pt: refused: cfg.model.encoder_xformers_att_config=")
    assert "mv " in last  # and how to go on without it
    assert not marker.exists() and not (out / "eval").exists() and not (out / "train.log").exists()


def test_adam_betas_from_a_config_or_a_command_line_is_held_to_a_literal(tmp_path, dict_dir):
    """Case 2: ADAM_BETAS reached fairseq's Adam, which eval()s it. train.sh refuses it (and any
    EXTRA_TRAIN_ARGS flag fairseq evaluates) at its config check; a command line given to fairseq-train
    itself meets the literal-only eval in fairseq's optimizer."""
    from fairseq.optim.adam import FairseqAdam
    from omegaconf import OmegaConf

    marker = tmp_path / "X"
    for key, value in (("ADAM_BETAS", f"(0.9,0.98) if {payload(marker)} is None else 0"),
                       ("EXTRA_TRAIN_ARGS", f"--adaptive-softmax-cutoff \"{payload(marker)}\"")):
        proc = subprocess.run(["bash", str(SCRIPTS / "train.sh"), "--cpu", "--set", f"{key}={value}",
                               "iwslt14_de_en_tfixup", str(dict_dir), str(tmp_path / "run")], capture_output=True, text=True)
        last = proc.stderr.strip().splitlines()[-1]
        assert proc.returncode == 1 and last.startswith("error: ") and "is not a Python literal" in last, proc.stderr
        assert f"(--set {key})" in last
    cfg = OmegaConf.create({"adam_betas": payload(marker), "adam_eps": 1e-8, "weight_decay": 0.0, "lr": [1e-3],
                            "use_old_adam": False, "fp16_adam_stats": False, "tpu": False})
    with pytest.raises(literals.NotALiteral, match="^adam_betas="):
        FairseqAdam(cfg, [torch.nn.Parameter(torch.zeros(2))])
    assert not marker.exists() and not (tmp_path / "run").exists()
    assert FairseqAdam(OmegaConf.create({**OmegaConf.to_container(cfg), "adam_betas": "(0.9, 0.98)"}),
                       [torch.nn.Parameter(torch.zeros(2))]).optimizer_config["betas"] == (0.9, 0.98)
    # a command line given to fairseq-train itself: refused once parsed, before anything is built
    from fairseq import options
    import fairseq_cli.train

    literals.install()  # as --user-dir does in fairseq-train (whose module is loaded by then)
    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(dict_dir), "--user-dir", str(USER_DIR), "--arch", "transformer_tfixup", "--optimizer", "adam",
        "--adam-betas", payload(marker), "-s", "de", "-t", "en"])
    with pytest.raises(literals.NotALiteral, match=r"^--adam-betas=\"\(__import__"):
        fairseq_cli.train.convert_namespace_to_omegaconf(args)
    # fairseq-validate's eval() of --model-overrides: a command's module, held once it is loaded
    # (by its console script before --user-dir; by averaging, which calls install() again)
    from fairseq_cli import validate

    literals.install()
    assert validate.eval is literals.literal_only_eval
    overrides = "{'beam': " + payload(marker) + "}"
    with pytest.raises(literals.NotALiteral, match="is not a Python literal"):
        validate.eval(overrides)
    assert validate.eval("{'beam': 5}") == {"beam": 5} and not marker.exists()


# ---------------------------------------------------------------- checkpoint fields that name files


@pytest.fixture(scope="module")
def naming_files(tiny_checkpoint, tmp_path_factory):
    """The real checkpoint with its fields naming files set as an attacker would: pretrained embeddings
    (fairseq read /dev/zero until memory ran out), the hub's BPE codes (/etc/passwd: its first line came
    back in the error), a user_dir; and one whose BPE codes are a URL (fairseq tried a download)."""
    real, data, state = tiny_checkpoint
    root = tmp_path_factory.mktemp("naming_files")
    secret = root / "secret.txt"
    secret.write_text("root:x:0:0:secret\n", encoding="utf-8")
    evil = copy.deepcopy(state)
    evil["cfg"]["model"].encoder_embed_path = str(secret)
    evil["cfg"]["model"].decoder_embed_path = str(root / "embeddings-that-are-not-there.txt")
    evil["cfg"]["bpe"] = {"_name": "subword_nmt", "bpe_codes": str(secret), "bpe_separator": "@@"}
    evil["cfg"]["common"]["user_dir"] = str(root / "plugin")
    paths = {"files": root / "files.pt"}
    torch.save(evil, paths["files"])
    evil = copy.deepcopy(state)
    evil["cfg"]["bpe"] = {"_name": "subword_nmt", "bpe_codes": "https://example.invalid/codes", "bpe_separator": "@@"}
    paths["url"] = root / "url.pt"
    torch.save(evil, paths["url"])
    (data / "code").write_text("#version: 0.2\na b\n", encoding="utf-8")  # the caller's own codes
    return paths, data, secret


def test_a_loaded_checkpoint_names_no_file(naming_files):
    from fairseq import checkpoint_utils
    from fairseq.models.transformer import TransformerModel

    paths, data, secret = naming_files
    state = checkpoint_utils.load_checkpoint_to_cpu(str(paths["files"]))
    model_cfg = state["cfg"].model
    assert model_cfg.encoder_embed_path is None and model_cfg.decoder_embed_path is None
    assert state["cfg"].bpe.bpe_codes is None and state["cfg"].common.user_dir is None
    # fairseq-generate's and the hub's path: the model builds without reading any of them (before, the
    # missing embeddings file stopped it, and /dev/zero there never returned)
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task([str(paths["files"])], arg_overrides={"data": str(data)})
    assert type(models[0]).__name__ == "TFixupTransformerModel"
    # the hub's BPE codes come from the caller (here the data folder's own), never from the checkpoint
    hub = TransformerModel.from_pretrained(str(paths["files"].parent), checkpoint_file=paths["files"].name,
                                           data_name_or_path=str(data), bpe="subword_nmt",
                                           bpe_codes=str(data / "code"))
    assert hub.bpe.bpe.bpe_codes == {("a", "b"): 0}
    with pytest.raises(Exception, match="bpe_codes") as e:  # and none given: fairseq's own error, no file read
        TransformerModel.from_pretrained(str(paths["files"].parent), checkpoint_file=paths["files"].name,
                                         data_name_or_path=str(data))
    assert "root:x" not in str(e.value)


def test_a_url_in_a_checkpoint_is_dropped(naming_files):
    """A URL in bpe_codes made fairseq try a download. bpe_codes is no setting the allow-list keeps
    (tfixup/allowlist.py), so it is set back to fairseq's default, as every path is."""
    from fairseq import checkpoint_utils

    from tfixup import checkpoints

    paths, data, _ = naming_files
    assert checkpoint_utils.load_checkpoint_to_cpu(str(paths["url"]))["cfg"].bpe.bpe_codes is None
    assert checkpoints.load(str(paths["url"]))["cfg"]["bpe"]["bpe_codes"] is None


def test_the_hub_does_not_log_the_whole_config(tiny_checkpoint):
    """from_pretrained logged the checkpoint's config as one ~12,000-character INFO line on every load. In a
    process of its own: other tests in this one may have raised fairseq's loggers' levels."""
    import subprocess

    real, data, _ = tiny_checkpoint
    code = ("import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stderr); import fairseq_tfixup; "
            "from fairseq.models.transformer import TransformerModel; "
            f"TransformerModel.from_pretrained({str(real.parent)!r}, checkpoint_file={real.name!r}, "
            f"data_name_or_path={str(data)!r})")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stderr.splitlines()
    assert any("INFO" in line for line in lines), proc.stderr[-2000:]  # the log was on
    assert max(map(len, lines)) < 1000
