"""configs/ + scripts/train.sh --dry-run: every experiment's command is accepted by
fairseq's own argument parser with the plugin loaded (parse only, nothing trains)."""

import os
import shlex
import subprocess

import pytest

from conftest import REPO

from fairseq_tfixup.pipeline.config import experiment_names, load_config

TRAIN = str(REPO / "scripts" / "train.sh")

# paper BLEU of each T-Fixup row (Tables 1-3)
PAPER = {
    "iwslt14_de_en_tfixup": 35.5, "iwslt14_en_de_tfixup": 29.4, "wmt18_fi_en_base_tfixup": 25.7,
    "wmt17_en_de_base_tfixup": 29.1, "wmt17_en_de_big_tfixup": 29.7,
    "wmt17_en_de_base_20l_tfixup": 29.4, "wmt17_en_de_base_30l_tfixup": 29.7,
    "wmt14_en_de_base_12l_tfixup": 29.3, "wmt14_en_de_base_20l_tfixup": 29.6, "wmt14_en_de_base_30l_tfixup": 30.1,
}


def dry_run(name, *flags, env=None, data="/nonexistent/data-bin"):
    proc = subprocess.run(["bash", TRAIN, *flags, "--dry-run", name, data, "/nonexistent/run"],
                          capture_output=True, text=True, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr
    return [shlex.split(line) for line in proc.stdout.splitlines()]


def parse_train_command(argv):
    from fairseq import options

    assert argv[0] == "fairseq-train"
    parser = options.get_training_parser()
    return options.parse_args_and_arch(parser, input_args=argv[1:])


def test_every_table_row_has_a_config():
    names = set(experiment_names())
    for name, bleu in PAPER.items():
        assert name in names
        assert float(load_config(name)["PAPER_BLEU"]) == bleu
    # each Table 1 row also runs its Post-LN (warmup) and Pre-LN baselines in this harness
    for name in ("iwslt14_de_en", "iwslt14_en_de", "wmt18_fi_en_base", "wmt17_en_de_base", "wmt17_en_de_big"):
        assert {f"{name}_postln", f"{name}_preln"} <= names


@pytest.mark.parametrize("name", experiment_names())
def test_dry_run_is_accepted_by_fairseq_parser(name):
    cfg = load_config(name)
    (cpu_cmd,) = dry_run(name, "--cpu")
    args = parse_train_command(cpu_cmd)
    assert args.arch == cfg["ARCH"]
    assert args.encoder_layers == int(cfg["ENCODER_LAYERS"]) and args.decoder_layers == int(cfg["DECODER_LAYERS"])
    assert args.lr == [float(cfg["LR"])] and args.cpu
    if name.endswith("_tfixup"):
        assert args.arch.startswith("transformer_tfixup") and args.lr_scheduler == "inverse_sqrt_nowarmup"
        assert args.warmup_updates == 0
        assert not getattr(args, "encoder_normalize_before", False)
    else:
        assert args.lr_scheduler == "inverse_sqrt" and args.warmup_updates == 4000
        assert args.encoder_normalize_before == name.endswith("_preln")
    # the GPU command of the same experiment (4 GPUs) parses as well
    (gpu_cmd,) = dry_run(name, env={"NGPUS": "4"})
    gpu = parse_train_command(gpu_cmd)
    assert gpu.distributed_world_size == 4 and gpu.fp16 == (cfg["FP16"] == "1")


@pytest.mark.parametrize("ngpus", [1, 2, 4, 8])
def test_update_freq_keeps_the_papers_effective_batch(ngpus):
    (cmd,) = dry_run("wmt17_en_de_base_tfixup", env={"NGPUS": str(ngpus)})
    args = parse_train_command(cmd)
    assert args.max_tokens * args.update_freq[0] * ngpus == 25000


def test_cpu_processes_share_the_batch_or_keep_their_own():
    one = parse_train_command(dry_run("iwslt14_de_en_tfixup", "--cpu")[0])
    two = [parse_train_command(c) for c in dry_run("iwslt14_de_en_tfixup", "--cpu", "--nproc", "2")]
    assert [a.distributed_rank for a in two] == [0, 1]
    assert all(a.distributed_world_size == 2 and a.ddp_backend == "legacy_ddp" for a in two)
    assert two[0].max_tokens * 2 == one.max_tokens  # default: same tokens per update
    own = parse_train_command(dry_run("iwslt14_de_en_tfixup", "--cpu", "--nproc", "2", "--per-process-batch")[0])
    assert own.max_tokens == one.max_tokens


def test_env_overrides_config_values():
    (cmd,) = dry_run("iwslt14_de_en_tfixup", "--cpu", "--set", "DROPOUT=0.2",
                     env={"MAX_UPDATE": "17", "EMBED_DIM": "64", "ENCODER_LAYERS": "3"})
    args = parse_train_command(cmd)
    assert (args.max_update, args.encoder_embed_dim, args.encoder_layers, args.dropout) == (17, 64, 3, 0.2)


def test_multinode_command_goes_through_torchrun():
    (cmd,) = dry_run("wmt17_en_de_big_tfixup", "--nnodes", "2", "--node-rank", "1", "--master-addr", "node0",
                     env={"NGPUS": "8"})
    assert cmd[0] == "torchrun" and cmd[cmd.index("--nnodes") + 1] == "2"
    train = ["fairseq-train"] + cmd[cmd.index("--master-port") + 3:]
    args = parse_train_command(train)
    assert args.distributed_world_size == 16 and args.max_tokens * args.update_freq[0] * 16 <= 25000


@pytest.mark.parametrize("script", ["table1.sh", "table2.sh", "table3.sh", "fig4b.sh"])
def test_table_dry_run_lists_every_row(script):
    proc = subprocess.run(["bash", str(REPO / "scripts" / script), "--dry-run", "--", "--cpu"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    trains = [line for line in proc.stdout.splitlines() if line.startswith("fairseq-train")]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("# ")]
    assert len(trains) == len(rows) > 0
    for line in trains:
        parse_train_command(shlex.split(line))
    assert "report.sh" in proc.stdout.splitlines()[-1]
