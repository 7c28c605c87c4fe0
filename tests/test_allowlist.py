"""Issue 46: a checkpoint's config and a config's EXTRA_TRAIN_ARGS held to an allow-list (tfixup/allowlist.py).

Checkpoints holding only safe types (dicts, strings, a Namespace, bytes) truncated a file through a criterion
that saves predictions, read /etc/passwd and opened a FIFO through a task's language dictionary and through a
bytes-valued embeddings path; EXTRA_TRAIN_ARGS read a FIFO, loaded another run's checkpoint and, by short
flags (-a, -s en, -sen), trained another model or direction than config.resolved.json recorded. Each case
here: the marker file outside the run is never created, truncated or read, the FIFO never opened, and the
refusal is one line naming the field. Checkpoints of the project's own methods and fairseq's legacy
``args`` form (fairseq <= 0.9, as the T-Fixup authors' fork saves) load."""

import argparse
import copy
import os
import subprocess
import threading
import time

import pytest
import torch

from conftest import REPO, USER_DIR, fairseq_command, last_error, write_dicts

import fairseq_tfixup  # noqa: F401  (installs the checks, as --user-dir does)
from tfixup import checkpoints, literals

SCRIPTS = REPO / "scripts"
EXPERIMENT = "iwslt14_de_en_tfixup"


class FifoWatch:
    """A FIFO at PATH, and whether anything opened it for reading: a thread tries to open its write end
    without blocking, which succeeds only while a reader has it open, and then writes a line and closes,
    so that a reader that opened it does not block forever (the test fails instead of hanging)."""

    def __init__(self, path):
        self.path, self.opened, self._stop = str(path), False, threading.Event()
        os.mkfifo(self.path)
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self):
        while not self._stop.is_set():
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # ENXIO: no reader
                time.sleep(0.02)
                continue
            self.opened = True
            try:
                os.write(fd, b"opened\n")
            finally:
                os.close(fd)

    def close(self):
        self._stop.set()
        self._thread.join(5)
        return self.opened


@pytest.fixture
def fifo(tmp_path):
    watch = FifoWatch(tmp_path / "fifo")
    yield watch
    watch.close()


def marker(tmp_path):
    """A file outside any run that an attacker would truncate or read: its content must stay."""
    path = tmp_path / "outside" / "precious.txt"
    path.parent.mkdir()
    path.write_text("root:x:0:0:precious\n", encoding="utf-8")
    return path


def evil(tiny_checkpoint, tmp_path, name, edit):
    """The tiny real checkpoint (cfg form, as fairseq-train 0.12 saves) with EDIT(state) applied, saved as NAME."""
    _, _, state = tiny_checkpoint
    state = copy.deepcopy(state)
    edit(state)
    path = tmp_path / name
    torch.save(state, path)
    return path


def refused(error, path, *words):
    line = str(error)
    assert "\n" not in line and line.startswith(f"{path}: refused: ") and all(w in line for w in words), line
    return line


# ---------------------------------------------------------------- the table


def test_the_table_is_what_fairseq_and_the_method_table_give():
    """The allow-list is derived, not written by hand: regenerate with `python -m tfixup.allowlist write`."""
    from tfixup import allowlist, allowlist_table, methods

    components, fields = allowlist.derive()
    assert components == allowlist_table.COMPONENTS and fields == allowlist_table.FIELDS, \
        "tfixup/allowlist_table.py is stale: python -m tfixup.allowlist write"
    archs = {a for m in methods.METHODS.values() for a in (m.arch, m.lm_arch) if a}
    assert archs <= set(components["model"]) and set(components["task"]) == set(methods.TASKS)
    assert set(components["optimizer"]) == {m.optimizer for m in methods.METHODS.values()}
    # every field issue 46 found naming a file is dropped, with no list of them anywhere
    for name in ("save_predictions", "lang_dict", "fixed_dictionary", "sampling_weights_from_file", "extra_data",
                 "config_yaml", "multitask_config_yaml", "label_dir", "baseline_model", "seq2seq_path",
                 "wer_kenlm_model", "wer_lexicon", "continue_once", "ema_seed_model", "quantization_config_path",
                 "encoder_embed_path", "embed_path", "bpe_codes", "user_dir", "save_dir", "restore_file"):
        assert fields.get(name, ["drop"])[0] == "drop", name


def configs_args():
    """fairseq's parse of the command of every config of configs/ (train.sh's, as the table scripts run them)."""
    from fairseq import options

    from harness import config

    for name in config.experiment_names():
        cfg = config.resolve(name, environ={})
        args = config.train_args(cfg, "DATA", "OUT")
        yield name, options.parse_args_and_arch(options.get_training_parser(), args)


def method_args():
    """fairseq's parse of every method's translation model and language model, as the studies train them."""
    from fairseq import options

    from tfixup import methods

    for name, m in methods.METHODS.items():
        for task in methods.TASKS:
            if task == "language_modeling" and not m.lm_arch:
                continue
            recipe = methods.Recipe(name, 16, 32, 2, 1, 1, 1e-3, task=task)
            yield f"{name}/{task}", options.parse_args_and_arch(options.get_training_parser(),
                                                                ["DATA", *methods.train_args(recipe)])


def test_every_pipelines_and_studys_settings_pass_and_keep_their_values():
    """Every config's command and every method's (translation and language model), in the legacy args form
    (the whole command line in one Namespace: every field of every component): nothing refused, and every
    value kept but those the allow-list drops (paths: save_dir, data, user_dir, ...)."""
    from tfixup import allowlist

    _, fields = allowlist.table()
    seen = 0
    for name, args in [*configs_args(), *method_args()]:
        state = {"args": copy.deepcopy(args)}
        allowlist.check_config(state)
        kept = vars(state["args"])
        for key, value in vars(args).items():
            if fields.get(key, ["?"])[0] == "drop":
                assert kept[key] == fields[key][1], (name, key)
            elif key in kept:
                assert kept[key] == value, (name, key)
            else:  # text no component of the project reads
                assert key not in fields and isinstance(value, str), (name, key, value)
        seen += 1
    assert seen > 30


def test_a_real_cfg_checkpoint_and_one_with_bleu_validation_pass(tiny_checkpoint, tmp_path):
    """The cfg form fairseq-train 0.12 saves (groups as dicts, the model's Namespace), also with --eval-bleu's
    task settings (the quickstart's config: a detokenizer's name and generation settings as JSON)."""
    path, data, state = tiny_checkpoint
    state = copy.deepcopy(state)
    state["cfg"]["task"].update(eval_bleu=True, eval_bleu_detok="moses", eval_bleu_remove_bpe="@@ ",
                                eval_bleu_args='{"beam": 1, "max_len_a": 1.2, "max_len_b": 10}')
    literals.check_state(state, "x.pt")
    assert state["cfg"]["task"]["eval_bleu_args"] == '{"beam": 1, "max_len_a": 1.2, "max_len_b": 10}'
    assert state["cfg"]["model"].arch == "transformer_tfixup" and state["cfg"]["task"]["source_lang"] == "de"
    assert state["cfg"]["checkpoint"]["save_dir"] == "checkpoints" and state["cfg"]["common"]["user_dir"] is None
    assert state["cfg"]["task"]["data"] == str(data)  # the data-bin folder, for a caller that names none
    # a hydra config's model nests its encoder and decoder settings: the same allow-list holds there
    nested = {"model": {"_name": "transformer_tfixup", "encoder": {"embed_dim": 16, "embed_path": "/x/fifo"},
                        "decoder": {"layers": 1, "xformers_att_config": "{'name': 'x'}"}}}
    from tfixup import allowlist

    allowlist.check_config({"cfg": nested})
    assert nested["model"]["encoder"] == {"embed_dim": 16, "embed_path": None}
    assert nested["model"]["decoder"] == {"layers": 1, "xformers_att_config": None}


# ---------------------------------------------------------------- case 1: a criterion that writes a file


@pytest.fixture
def ranking(tiny_checkpoint, tmp_path):
    target = marker(tmp_path)
    path = evil(tiny_checkpoint, tmp_path, "ranking.pt", lambda s: s["cfg"].update(criterion={
        "_name": "sentence_ranking", "save_predictions": str(target), "ranking_head_name": "sentence_classification_head",
        "num_classes": 2}))
    return path, target


def test_case1_a_criterion_outside_the_list_is_refused_and_the_file_kept(ranking, tiny_bin):
    """fairseq-validate DATA --path evil.pt --user-dir fairseq_tfixup created the file; here each loader
    refuses the checkpoint, naming its criterion."""
    from fairseq import checkpoint_utils

    path, target = ranking
    data = tiny_bin
    for load in (checkpoint_utils.load_checkpoint_to_cpu, checkpoints.load):
        with pytest.raises(literals.UnsafeCheckpoint) as e:
            load(str(path))
        refused(e.value, path, "cfg.criterion._name='sentence_ranking' is a criterion this project does not "
                               "train or evaluate with (it uses cross_entropy, label_smoothed_cross_entropy")
    with pytest.raises(literals.UnsafeCheckpoint):
        fairseq_command("validate", data, "--path", path, "--user-dir", USER_DIR, "--task", "translation",
                        "-s", "de", "-t", "en", "--cpu", "--valid-subset", "valid", "--max-tokens", "1000")
    assert target.read_text(encoding="utf-8") == "root:x:0:0:precious\n"


def run_dir(tmp_path, checkpoint, data, name="run"):
    """A run folder as train.sh leaves it (its record), holding CHECKPOINT as checkpoint_last.pt."""
    from harness import config

    out = tmp_path / name
    (out / "checkpoints").mkdir(parents=True)
    config.record(config.resolve(EXPERIMENT, environ={}), ["fairseq-train ..."], out / config.RECORD, data)
    (out / "checkpoints" / "checkpoint_last.pt").write_bytes(checkpoint.read_bytes())
    return out


def test_case1_evaluate_sh_refuses_the_run_and_truncates_nothing(ranking, tiny_bin, tmp_path):
    """bash scripts/evaluate.sh (its averaging's validation) truncated the file to 0 bytes."""
    path, target = ranking
    data = tiny_bin
    out = run_dir(tmp_path, path, data)
    proc = subprocess.run(["bash", str(SCRIPTS / "evaluate.sh"), "--cpu", EXPERIMENT, str(data), str(out)],
                          capture_output=True, text=True)
    last_error(proc, f"{out}/checkpoints/checkpoint_last.pt: refused: cfg.criterion._name='sentence_ranking'")
    assert target.read_text(encoding="utf-8") == "root:x:0:0:precious\n" and not (out / "eval").exists()


# ---------------------------------------------------------------- case 2: a task that names files


def multilingual(tiny_checkpoint, tmp_path, lang_dict):
    """cfg.task: fairseq's parse of --task translation_multi_simple_epoch --lang-pairs de-en --lang-dict LANG_DICT."""
    from fairseq import options

    _, data, _ = tiny_checkpoint
    task = options.parse_args_and_arch(options.get_training_parser(), [
        str(data), "--task", "translation_multi_simple_epoch", "--lang-pairs", "de-en", "--lang-dict", str(lang_dict),
        "--arch", "transformer_tfixup", "-s", "de", "-t", "en"])
    task._name = "translation_multi_simple_epoch"
    return evil(tiny_checkpoint, tmp_path, "multilingual.pt", lambda s: s["cfg"].update(task=task))


def test_case2_the_hub_refuses_a_task_outside_the_list_and_opens_no_fifo(tiny_checkpoint, tmp_path, fifo):
    """TransformerModel.from_pretrained (after import fairseq_tfixup) opened the FIFO and blocked."""
    from fairseq.models.transformer import TransformerModel

    _, data, _ = tiny_checkpoint
    path = multilingual(tiny_checkpoint, tmp_path, fifo.path)
    with pytest.raises(literals.UnsafeCheckpoint) as e:
        TransformerModel.from_pretrained(str(path.parent), checkpoint_file=path.name, data_name_or_path=str(data))
    refused(e.value, path, "cfg.task._name='translation_multi_simple_epoch' is a task this project does not train "
                           "or evaluate with (it uses language_modeling, translation")
    assert not fifo.close(), "the FIFO was opened"


def test_case2_translate_refuses_before_reading_the_named_file(tiny_checkpoint, tmp_path):
    """`echo x | bash scripts/translate.sh RUN` printed /etc/passwd's lines in its error; its model check
    (harness/translate.py, before fairseq's hub) refuses the checkpoint, and nothing of the file shows."""
    from harness import translate

    _, data, _ = tiny_checkpoint
    secret = marker(tmp_path)
    path = multilingual(tiny_checkpoint, tmp_path, secret)
    with pytest.raises(translate.TranslateError) as e:
        translate.load_hub(path, data)
    assert "root:x" not in str(e.value) and "translation_multi_simple_epoch" in str(e.value)


# ---------------------------------------------------------------- case 3: bytes


@pytest.mark.parametrize("value", ["fifo", b"https://example.invalid/embeddings.txt"])
def test_case3_bytes_are_refused_and_no_fifo_is_opened(tiny_checkpoint, tmp_path, fifo, value):
    """encoder_embed_path = b"/path/to/fifo" was not cleared (the filter checked only str):
    load_model_ensemble opened the FIFO; a URL as bytes passed the URL check too."""
    from fairseq import checkpoint_utils

    _, data, _ = tiny_checkpoint
    value = fifo.path.encode() if value == "fifo" else value
    path = evil(tiny_checkpoint, tmp_path, "bytes.pt", lambda s: setattr(s["cfg"]["model"], "encoder_embed_path", value))
    with pytest.raises(literals.UnsafeCheckpoint) as e:
        checkpoint_utils.load_model_ensemble_and_task([str(path)], arg_overrides={"data": str(data)})
    refused(e.value, path, "cfg.model.encoder_embed_path=b", "is a bytes, which no fairseq setting is")
    assert not fifo.close(), "the FIFO was opened"


def test_strings_naming_files_are_dropped_whatever_their_field(tiny_checkpoint, tmp_path, fifo):
    """A str naming a file in any field the allow-list does not keep (none needs a list) is set back to
    fairseq's default: the model builds without opening it."""
    from fairseq import checkpoint_utils

    _, data, _ = tiny_checkpoint

    def edit(state):
        state["cfg"]["model"].encoder_embed_path = fifo.path
        state["cfg"]["model"].lang_dict = fifo.path  # a field of no component the project uses
        state["cfg"]["common_eval"]["results_path"] = fifo.path
        state["cfg"]["checkpoint"]["continue_once"] = fifo.path

    path = evil(tiny_checkpoint, tmp_path, "paths.pt", edit)
    state = checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert state["cfg"].model.encoder_embed_path is None and "lang_dict" not in state["cfg"].model
    assert state["cfg"].common_eval.results_path is None and state["cfg"].checkpoint.continue_once is None
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task([str(path)], arg_overrides={"data": str(data)})
    assert type(models[0]).__name__ == "TFixupTransformerModel"
    assert not fifo.close(), "the FIFO was opened"


@pytest.mark.parametrize("where, value, words", [
    ("model", {"arch": "lstm"}, "cfg.model.arch='lstm' is a model (--arch) this project does not"),
    ("task", {"source_lang": "../../etc"}, "cfg.task.source_lang='../../etc' must be a plain name"),
    ("task", {"eval_bleu_args": '{"lm_path": "/etc/passwd"}'}, "cfg.task.eval_bleu_args="),
    ("optimization", {"max_update": "${oc.env:HOME}"}, "cfg.optimization.max_update='${oc.env:HOME}' must be a number"),
    ("model", {"activation_fn": "os.system"}, "cfg.model.activation_fn='os.system' must be one of gelu"),
    ("task", {"data": "https://example.invalid/data-bin"}, "cfg.task.data='https://example.invalid/data-bin' must be a "
                                                           "folder's path"),
])
def test_kept_fields_must_be_of_their_kind(tiny_checkpoint, tmp_path, where, value, words):
    path = evil(tiny_checkpoint, tmp_path, "kind.pt", lambda s: (
        [setattr(s["cfg"][where], k, v) for k, v in value.items()] if isinstance(s["cfg"][where], argparse.Namespace)
        else s["cfg"][where].update(value)))
    with pytest.raises(literals.UnsafeCheckpoint) as e:
        checkpoints.load(path)
    refused(e.value, path, words)


# ---------------------------------------------------------------- case 4: EXTRA_TRAIN_ARGS


@pytest.mark.parametrize("extra, words", [
    ("--encoder-embed-path FIFO", "--encoder-embed-path is not among the settings a config may add"),
    ("--continue-once OTHER/checkpoints/checkpoint_last.pt", "--continue-once is not among"),
    ("--ema-seed-model x.pt", "--ema-seed-model is not among"),
    ("--quantization-config-path q.yaml", "--quantization-config-path is not among"),
    ("--train-subset /abs", "--train-subset is not among"),
    ("-a transformer", "--arch (given as -a) is already in the command the config makes: set ARCH or METHOD"),
    ("-s en -t de", "--source-lang (given as -s) is already in the command the config makes: set SRC"),
    ("-sen -tde", "--source-lang (given as -sen) is already in the command the config makes: set SRC"),
    ("--target-lang=de", "--target-lang is already in the command the config makes: set TGT"),
    ("--cpu", "--cpu is set by train.sh"), ("--distributed-world-size 2", "--distributed-world-size is set by train.sh"),
    ("/etc", "'/etc' is not a fairseq-train option of this command"),
    ("--eval-bleu --eval-bleu-detok /etc/x", "--eval-bleu-detok='/etc/x' must be a plain name"),
])
def test_case4_extra_train_args_pass_only_settings_of_the_allow_list(extra, words):
    """Parsed by fairseq-train's own parser for the config's command, so every spelling is its one setting."""
    from harness import config

    with pytest.raises(config.ConfigError) as e:
        config.train_args(config.resolve(EXPERIMENT, {"EXTRA_TRAIN_ARGS": extra}, environ={}), "DATA", "OUT")
    line = str(e.value)
    assert "\n" not in line and f"(--set EXTRA_TRAIN_ARGS): EXTRA_TRAIN_ARGS: {words}" in line, line


def test_case4_the_settings_configs_use_pass():
    from harness import config

    extra = ("--eval-bleu --eval-bleu-detok moses --eval-bleu-remove-bpe --eval-bleu-args '{\"beam\": 1}' "
             "--patience 3 --best-checkpoint-metric bleu --maximize-best-checkpoint-metric --tfixup-zero-attn-bias")
    args = config.train_args(config.resolve(EXPERIMENT, {"EXTRA_TRAIN_ARGS": extra}, environ={}), "DATA", "OUT")
    assert args[-3:] == ["--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric"] or \
        "--tfixup-zero-attn-bias" in args


def test_case4_train_sh_refuses_in_one_line_and_opens_no_fifo(tmp_path, fifo, tiny_bin):
    """EXTRA_TRAIN_ARGS=--encoder-embed-path /a/fifo made train.sh read it: refused before anything runs or is
    written (the other spellings above go through the same check, train.sh's train-args step)."""
    from conftest import TINY_RUN

    proc = subprocess.run(["bash", str(SCRIPTS / "train.sh"), "--cpu", "--set",
                           f"EXTRA_TRAIN_ARGS=--encoder-embed-path {fifo.path}", EXPERIMENT, str(tiny_bin),
                           str(tmp_path / "run")], capture_output=True, text=True, env={**os.environ, **TINY_RUN})
    last_error(proc, "(--set EXTRA_TRAIN_ARGS): EXTRA_TRAIN_ARGS: --encoder-embed-path is not among the settings")
    assert not (tmp_path / "run" / "train.log").exists()
    assert not fifo.close(), "the FIFO was opened"


# ---------------------------------------------------------------- cases 5 and 8: fairseq's legacy args form


@pytest.fixture(scope="module")
def tiny_bin(tiny_checkpoint, tmp_path_factory):
    """A data-bin on the tiny checkpoint's dictionaries (fairseq-preprocess, in this process): a few made-up
    sentence pairs in train, valid and test, and test's raw target text."""
    _, dicts, _ = tiny_checkpoint
    root = tmp_path_factory.mktemp("tiny_bin")
    text = root / "text"
    text.mkdir()
    for split, n in (("train", 8), ("valid", 4), ("test", 3)):
        for lang in ("de", "en"):
            lines = [" ".join(f"{lang}{(i * 7 + j) % 40}" for j in range(3 + i % 4)) for i in range(n)]
            (text / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = root / "bin"
    fairseq_command("preprocess", "--source-lang", "de", "--target-lang", "en", "--trainpref", text / "train",
                    "--validpref", text / "valid", "--testpref", text / "test", "--srcdict", dicts / "dict.de.txt",
                    "--tgtdict", dicts / "dict.en.txt", "--destdir", out, "--workers", "1")
    (out / "test.raw.en").write_text((text / "test.en").read_text(encoding="utf-8"), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def legacy(tiny_checkpoint, tmp_path_factory):
    """A checkpoint in fairseq's legacy form (fairseq <= 0.9, the T-Fixup authors' fork): the training
    arguments as fairseq's parser makes them (state["args"], an argparse.Namespace), no cfg."""
    _, _, state = tiny_checkpoint
    state = copy.deepcopy(state)
    args = state["cfg"]["model"]  # fairseq's parse of the whole command line (conftest.save_tiny_checkpoint)
    assert isinstance(args, argparse.Namespace) and args.save_dir == "checkpoints"
    state.update(args=args, cfg=None)
    path = tmp_path_factory.mktemp("legacy") / "legacy.pt"
    torch.save(state, path)
    return path


def test_case5_a_legacy_checkpoint_loads_through_the_hub_generate_and_validate(legacy, tiny_bin):
    """It failed with ConfigCompositionException: Error merging override checkpoint.save_dir=null (the
    loader set the non-Optional save_dir and restore_file to None)."""
    from fairseq.models.transformer import TransformerModel

    hub = TransformerModel.from_pretrained(str(legacy.parent), checkpoint_file=legacy.name,
                                           data_name_or_path=str(tiny_bin))
    assert type(hub.models[0]).__name__ == "TFixupTransformerModel"
    assert hub.translate("de1 de2 de3", beam=1, max_len_a=0, max_len_b=5) is not None
    log = fairseq_command("generate", tiny_bin, "--path", legacy, "--user-dir", USER_DIR, "--task", "translation",
                          "-s", "de", "-t", "en", "--cpu", "--beam", "1", "--max-len-a", "0", "--max-len-b", "5",
                          "--batch-size", "8", "--required-batch-size-multiple", "1")
    assert "Generate test with beam=1" in log, log[-2000:]
    log = fairseq_command("validate", tiny_bin, "--path", legacy, "--user-dir", USER_DIR, "--task", "translation",
                          "-s", "de", "-t", "en", "--cpu", "--max-tokens", "1000", "--required-batch-size-multiple", "1")
    assert "valid on 'valid' subset" in log, log[-2000:]


def test_case8_evaluate_sh_averages_and_scores_a_legacy_checkpoint(legacy, tiny_bin, tmp_path):
    out = run_dir(tmp_path, legacy, tiny_bin)
    proc = subprocess.run(["bash", str(SCRIPTS / "evaluate.sh"), "--cpu", EXPERIMENT, str(tiny_bin), str(out)],
                          capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "MAX_LEN_A": "0", "MAX_LEN_B": "5",
                               "AVG_CANDIDATES": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "eval" / "results.json").exists() and (out / "eval" / "averaged.pt").exists()


# ---------------------------------------------------------------- item 9's minors: a closed terminal, OPTIMIZER, refusals


def test_closing_the_terminal_books_the_run_interrupted_with_the_resume_line(tmp_path):
    """SIGHUP to train.sh's process group (what closing its terminal sends) was booked "killed" by the next run."""
    import signal

    from conftest import TINY_RUN, group_left, kill_group

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "fairseq-train").write_text("#!/bin/sh\necho \"fairseq_cli.train | {'_name': None}\"\nexec sleep 300\n")
    (fake / "fairseq-train").chmod(0o755)
    data, out = write_dicts(tmp_path / "data"), tmp_path / "run"
    err = open(tmp_path / "stderr", "w")
    job = subprocess.Popen(["bash", str(SCRIPTS / "train.sh"), "--cpu", EXPERIMENT, str(data), str(out)],
                           stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
                           env={**os.environ, **TINY_RUN, "PATH": f"{fake}:{os.environ['PATH']}"})
    try:
        deadline = time.time() + 120
        while time.time() < deadline and job.poll() is None and not (
                (out / "train.log").exists() and "fairseq_cli.train" in (out / "train.log").read_text()):
            time.sleep(0.1)
        assert job.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
        os.killpg(job.pid, signal.SIGHUP)
        rc = job.wait(timeout=60)
        assert not group_left(job.pid)
    finally:
        kill_group(job.pid)
    stderr = (tmp_path / "stderr").read_text()
    assert rc == 129, stderr[-3000:]
    assert "interrupted: " in stderr and "rerun the same command to resume: bash " in stderr, stderr[-3000:]
    assert (out / "train_runs.tsv").read_text().splitlines()[-1].endswith("\tinterrupted")
    assert not (out / "train_run.open").exists()


def test_optimizer_is_one_of_the_method_tables():
    from harness import config

    with pytest.raises(config.ConfigError, match=r"\(--set OPTIMIZER\): OPTIMIZER must be one of auto, adam, giadam, "
                                                  r"radam, sgd, got 'bogus'"):
        config.resolve(EXPERIMENT, {"OPTIMIZER": "bogus"}, environ={})
    assert config.resolve(EXPERIMENT, {"OPTIMIZER": "radam"}, environ={}).values["OPTIMIZER"] == "radam"


def test_a_refusal_of_the_plugin_is_not_followed_by_rerun_to_resume(tmp_path):
    """fairseq-train ended by a one-line refusal (error: ...; tfixup/errors.py) was advised "rerun the same
    command to resume", which fails the same way."""
    from harness import recover

    log = ("2026-01-01 | INFO | fairseq_cli.train | {'_name': None}\n"
           "error: --fp16 needs a CUDA GPU (fairseq's FP16 optimizer keeps its fp32 copy there) and this machine "
           "has none: drop --fp16\n")
    line = recover.train_failure(log, 1, str(tmp_path), ["bash", "scripts/train.sh", "--cpu", EXPERIMENT, "d", "o"])
    assert line.startswith("--fp16 needs a CUDA GPU") and "resume" not in line and "fail the same way" in line, line


def test_case5_a_legacy_checkpoint_loads_through_interactive(legacy, tiny_bin, monkeypatch):
    import io
    import sys

    monkeypatch.setattr(sys, "stdin", io.StringIO("de1 de2 de3\n"))
    log = fairseq_command("interactive", tiny_bin, "--path", legacy, "--user-dir", USER_DIR, "--task", "translation",
                          "-s", "de", "-t", "en", "--cpu", "--beam", "1", "--max-len-a", "0", "--max-len-b", "5")
    assert "H-0\t" in log, log[-2000:]


@pytest.fixture(scope="module")
def lm_checkpoints(tiny_checkpoint, tmp_path_factory):
    """A tiny T-Fixup language model's checkpoint in both forms (cfg, as fairseq-train 0.12 saves; legacy
    args), and a language-model data-bin on the tiny dictionaries (fairseq-preprocess --only-source)."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    from tfixup import methods

    _, dicts, _ = tiny_checkpoint
    root = tmp_path_factory.mktemp("lm")
    text = root / "text"
    text.mkdir()
    for split, n in (("train", 8), ("valid", 4), ("test", 3)):
        lines = [" ".join(f"en{(i * 5 + j) % 40}" for j in range(6)) for i in range(n)]
        (text / f"{split}.en").write_text("\n".join(lines) + "\n", encoding="utf-8")
    data = root / "bin"
    fairseq_command("preprocess", "--only-source", "--trainpref", text / "train.en", "--validpref", text / "valid.en",
                    "--testpref", text / "test.en", "--srcdict", dicts / "dict.en.txt", "--destdir", data,
                    "--workers", "1")
    recipe = methods.Recipe("tfixup", 16, 32, 2, 1, 1, 1e-3, task="language_modeling", tokens_per_sample=8)
    args = options.parse_args_and_arch(options.get_training_parser(), [str(data), *methods.train_args(recipe)])
    model = tasks.setup_task(args).build_model(args)
    history = [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "FairseqAdam",
                "lr_scheduler_state": {"best": None}, "num_updates": 3}]
    paths = {}
    for form in ("cfg", "args"):
        cfg = OmegaConf.to_container(convert_namespace_to_omegaconf(args), resolve=True, enum_to_str=True)
        state = {"args": args if form == "args" else None, "cfg": cfg if form == "cfg" else None,
                 "model": model.state_dict(), "extra_state": {}, "last_optimizer_state": None,
                 "optimizer_history": history}
        paths[form] = root / f"lm-{form}.pt"
        torch.save(state, paths[form])
    return paths, data


def test_a_language_models_checkpoints_load_through_eval_lm(lm_checkpoints):
    paths, data = lm_checkpoints
    for form, path in paths.items():
        log = fairseq_command("eval_lm", data, "--path", path, "--user-dir", USER_DIR, "--cpu", "--gen-subset", "valid",
                              "--tokens-per-sample", "8", "--max-tokens", "1000", "--required-batch-size-multiple", "1")
        assert "Loss (base 2)" in log, (form, log[-2000:])
