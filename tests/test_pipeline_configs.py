"""configs/ read by harness/config.py, and scripts/train.sh --dry-run: every experiment's
command is accepted by fairseq's own argument parser with the plugin loaded (parse only)."""

import json
import os
import shlex
import subprocess

import pytest

from conftest import REPO, check_method_flags, parse_train_command, table_experiments
from harness import config

TRAIN = str(REPO / "scripts" / "train.sh")


def dry_run(name, *flags, env=None, data="/nonexistent/data-bin"):
    proc = subprocess.run(["bash", TRAIN, *flags, "--dry-run", name, data, "/nonexistent/run"],
                          capture_output=True, text=True, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr
    return [shlex.split(line) for line in proc.stdout.splitlines()]


def test_every_table_row_is_an_experiment_with_the_papers_number():
    """Each row the table scripts run resolves; each T-Fixup row of a table has a paper number (which
    tests/test_table_rows.py finds in the paper's cell); each Table 1 T-Fixup row has its Post-LN
    and Pre-LN baselines."""
    names = table_experiments()
    # every config but the CPU main job's (scripts/quickstart.sh --cpu), which is no row of the paper
    assert set(names) == set(config.experiment_names()) - {"multi30k_de_en_cpu_tfixup"}
    for name in names:
        v = config.resolve(name, environ={}).values
        assert v["TABLE"] and v["ROW"] and v["DATASET"] and v["PREPARE"], name
        if name.endswith("_tfixup") and v["TABLE"] != "Fig. 4b":
            assert v["PAPER_BLEU"], name
        if v["TABLE"].startswith("Table 1") and name.endswith("_tfixup") and "l_" not in name:
            base = name[: -len("_tfixup")]
            assert {f"{base}_postln", f"{base}_preln"} <= set(names), name


@pytest.mark.parametrize("name", config.experiment_names())
def test_train_args_are_accepted_by_fairseqs_parser(name):
    cfg = config.resolve(name, environ={})
    v = cfg.values
    args = parse_train_command(["fairseq-train", *config.train_args(cfg, "/data", "/out", 1, "cpu")])
    check_method_flags(args, v)
    assert (args.encoder_embed_dim, args.encoder_ffn_embed_dim, args.decoder_attention_heads) == (
        int(v["EMBED_DIM"]), int(v["FFN_DIM"]), int(v["HEADS"]))
    assert args.lr == [float(v["LR"])] and args.cpu and args.required_batch_size_multiple == 1
    # the experiment's name says its method (NAME_METHOD.conf), so a config whose METHOD line is
    # wrong or missing fails here and not only in a run
    assert name.endswith(f"_{v['METHOD']}"), (name, v["METHOD"])
    # the authors' effective clip-norm for IWSLT (fairseq 0.9's default), fairseq 0.12's 0 elsewhere
    assert args.clip_norm == (25.0 if name.startswith("iwslt") else 0.0)
    gpu = parse_train_command(["fairseq-train", *config.train_args(cfg, "/data", "/out", 4, "cuda")])
    assert gpu.fp16 == (v["FP16"] == "1")


@pytest.mark.parametrize("ngpus", [1, 2, 4, 8])
def test_update_freq_keeps_the_papers_effective_batch(ngpus):
    cfg = config.resolve("wmt17_en_de_base_tfixup", environ={})
    args = parse_train_command(["fairseq-train", *config.train_args(cfg, "/d", "/o", ngpus, "cuda")])
    assert args.max_tokens * args.update_freq[0] * ngpus == 25000


def test_gpu_dry_run_through_train_sh():
    (cmd,) = dry_run("wmt17_en_de_base_tfixup", env={"NGPUS": "4"})
    args = parse_train_command(cmd)
    assert args.distributed_world_size == 4 and args.fp16 and args.max_tokens * args.update_freq[0] * 4 == 25000


def test_cpu_processes_share_the_batch_or_keep_their_own():
    one = parse_train_command(dry_run("iwslt14_de_en_tfixup", "--cpu")[0])
    two = [parse_train_command(c) for c in dry_run("iwslt14_de_en_tfixup", "--cpu", "--nproc", "2")]
    assert [a.distributed_rank for a in two] == [0, 1]
    assert all(a.distributed_world_size == 2 and a.ddp_backend == "legacy_ddp" for a in two)
    assert two[0].max_tokens * 2 == one.max_tokens  # default: same tokens per update
    own = parse_train_command(dry_run("iwslt14_de_en_tfixup", "--cpu", "--nproc", "2", "--per-process-batch")[0])
    assert own.max_tokens == one.max_tokens


def test_overrides_env_and_set_and_quoted_extra_args():
    (cmd,) = dry_run("iwslt14_de_en_tfixup", "--cpu", "--set", "DROPOUT=0.2", "--set",
                     "EXTRA_TRAIN_ARGS=--eval-bleu-args '{\"beam\": 2, \"lenpen\": 0.6}' --patience 3",
                     env={"MAX_UPDATE": "17", "EMBED_DIM": "64", "ENCODER_LAYERS": "3"})
    args = parse_train_command(cmd)
    assert (args.max_update, args.encoder_embed_dim, args.encoder_layers, args.dropout) == (17, 64, 3, 0.2)
    assert args.eval_bleu_args == '{"beam": 2, "lenpen": 0.6}' and args.patience == 3


def test_multinode_command_goes_through_torchrun():
    (cmd,) = dry_run("wmt17_en_de_big_tfixup", "--nnodes", "2", "--node-rank", "1", "--master-addr", "node0",
                     env={"NGPUS": "8"})
    assert cmd[0] == "torchrun" and cmd[cmd.index("--nnodes") + 1] == "2"
    train = ["fairseq-train"] + cmd[cmd.index("--master-port") + 3:]
    args = parse_train_command(train)
    assert args.distributed_world_size == 16 and args.max_tokens * args.update_freq[0] * 16 <= 25000


@pytest.mark.parametrize("text, message", [
    ("BASE=iwslt14\nLR 5e-4\n", "bad.conf:2: expected KEY=value, got 'LR 5e-4'"),
    ("BASE=iwslt14\nLRR=5e-4\n", "unknown key LRR"),
    ("BASE=iwslt14\nMAX_UPDATE=ten\n", "MAX_UPDATE must be a whole number"),
    ("BASE=iwslt14\nLR=-1\n", "LR must be > 0"),
    ("BASE=nosuch\n", "BASE=nosuch, but there is no"),
    ("BASE=iwslt14\nEXTRA_TRAIN_ARGS=--foo 'unclosed\n", "EXTRA_TRAIN_ARGS: No closing quotation"),
    # a key set twice took the last value; a byte that is not UTF-8 named no file
    ("BASE=iwslt14\nLR=1e-3\n\nLR=2e-3\n", "bad.conf:4: LR is set twice (lines 2 and 4): keep one"),
    (b"BASE=iwslt14\nROW=caf\xe9\n", "bad.conf:2: not UTF-8 text (byte 0xe9): save the file as UTF-8"),
    # a config is a file people share: it may not load code, move the outputs out of OUT_DIR (and its
    # lock), set train.sh's devices, or override its own keys behind config.resolved.json's back
    ("BASE=iwslt14\nEXTRA_TRAIN_ARGS=--user-dir /tmp/p\n", "EXTRA_TRAIN_ARGS: --user-dir imports the Python code"),
    ("BASE=iwslt14\nEXTRA_TRAIN_ARGS=--patience 3 --user-dir=/tmp/p\n", "EXTRA_TRAIN_ARGS: --user-dir imports"),
    ("BASE=iwslt14\nEXTRA_TRAIN_ARGS=--save-dir /tmp/x\n", "EXTRA_TRAIN_ARGS: --save-dir names files outside the run folder"),
    ("BASE=iwslt14\nEXTRA_TRAIN_ARGS=--log-file /tmp/x.log\n", "EXTRA_TRAIN_ARGS: --log-file names files outside"),
    ("BASE=iwslt14\nEXTRA_TRAIN_ARGS=--tensorboard-logdir /tmp/tb\n", "EXTRA_TRAIN_ARGS: --tensorboard-logdir names"),
    ("BASE=iwslt14\nEXTRA_TRAIN_ARGS=--wandb-project p\n", "EXTRA_TRAIN_ARGS: --wandb-project names"),
    ("BASE=iwslt14\nEXTRA_TRAIN_ARGS=--restore-file /tmp/x.pt\n", "EXTRA_TRAIN_ARGS: --restore-file names"),
    ("BASE=iwslt14\nEXTRA_TRAIN_ARGS=--distributed-world-size 8\n", "--distributed-world-size is set by train.sh"),
    ("BASE=iwslt14\nEXTRA_TRAIN_ARGS=--lr 1\n", "EXTRA_TRAIN_ARGS: --lr is already in the command the config makes: "
                                                 "set LR instead (--set LR=...)"),
    ("BASE=iwslt14\nEXTRA_TRAIN_ARGS=--encoder-layers=3\n", "--encoder-layers is already in the command the config "
                                                             "makes: set ENCODER_LAYERS instead"),
])
def test_bad_config_is_one_line_naming_the_file(text, message, tmp_path):
    bad = tmp_path / "bad.conf"
    bad.write_bytes(text if isinstance(text, bytes) else text.encode())
    proc = subprocess.run(["bash", TRAIN, "--cpu", "--dry-run", str(bad), "/d", "/o"], capture_output=True, text=True)
    assert proc.returncode != 0 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], proc.stderr
    assert "bad.conf" in lines[0] or "unknown key" in lines[0]


def test_record_describes_the_run_and_refuses_a_changed_resume(tmp_path):
    """train.sh's record: the resolved config and the exact commands; once the run has a checkpoint,
    a resume may only train longer. Before that (a start that failed: fairseq-train
    refused a flag, a value it could not use), the rerun with other settings is the run."""
    cfg = config.resolve("iwslt14_de_en_tfixup", {"MAX_UPDATE": "10"}, environ={})
    commands = tmp_path / "cmds"
    commands.write_text("fairseq-train a b\n")
    record = tmp_path / "run" / config.RECORD
    config.record(cfg, commands.read_text().splitlines(), record)
    saved = json.loads(record.read_text())
    assert saved["values"]["MAX_UPDATE"] == "10" and saved["train_commands"] == ["fairseq-train a b"]
    assert oct(record.stat().st_mode & 0o777) == oct(0o666 & ~_umask())  # not mkstemp's 0600
    # no checkpoint yet (crash.pt, fairseq's dump of a NaN step, is none): not bound
    (tmp_path / "run" / "checkpoints").mkdir()
    (tmp_path / "run" / "checkpoints" / "crash.pt").write_bytes(b"")
    config.record(config.resolve("iwslt14_de_en_tfixup", {"LR": "2e-3", "EXTRA_TRAIN_ARGS": "--no-such"}, environ={}),
                  [], record)
    assert json.loads(record.read_text())["values"]["LR"] == "2e-3"
    config.record(cfg, [], record)
    (tmp_path / "run" / "checkpoints" / "checkpoint_last.pt").write_bytes(b"")  # bound from here on
    config.record(config.resolve("iwslt14_de_en_tfixup", {"MAX_UPDATE": "20"}, environ={}), [], record)
    with pytest.raises(config.ConfigError, match="holds checkpoints trained with LR=5e-4, now LR=1e-3: use a new OUT_DIR"):
        config.record(config.resolve("iwslt14_de_en_tfixup", {"LR": "1e-3"}, environ={}), [], record)
    # evaluation reads the record: beam may change, the model may not
    assert config.resolve_run(record.parent, {"BEAM": "7"}, environ={}).values["BEAM"] == "7"
    with pytest.raises(config.ConfigError, match="trained with DROPOUT=0.5"):
        config.resolve_run(record.parent, {"DROPOUT": "0.1"}, environ={})


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_config_user_dir_never_runs_and_a_real_run_is_refused_too(tmp_path):
    """EXTRA_TRAIN_ARGS=--user-dir DIR in a .conf made fairseq import DIR/__init__.py (and, the last
    --user-dir winning, not the plugin): refused before anything runs, by a real run as by --dry-run."""
    plugin, marker = tmp_path / "p", tmp_path / "RAN"
    plugin.mkdir()
    (plugin / "__init__.py").write_text(f"open({str(marker)!r}, 'w')\n")
    conf = tmp_path / "e.conf"
    conf.write_text(f"BASE=multi30k\nMAX_UPDATE=5\nEXTRA_TRAIN_ARGS=--user-dir {plugin}\n")
    for dry in (["--dry-run"], []):
        proc = subprocess.run(["bash", TRAIN, "--cpu", *dry, str(conf), str(tmp_path), str(tmp_path / "run")],
                              capture_output=True, text=True)
        assert proc.returncode == 1 and proc.stdout == "", proc.stderr
        assert proc.stderr.strip().splitlines()[-1] == (
            f"error: {conf}: EXTRA_TRAIN_ARGS: --user-dir imports the Python code of that folder (the scripts "
            "load the plugin, fairseq_tfixup): remove it from EXTRA_TRAIN_ARGS")
    assert not marker.exists() and not (tmp_path / "run").exists()
