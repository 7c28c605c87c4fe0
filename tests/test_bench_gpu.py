"""harness/bench/gpu.py, the GPU study: its CPU mode end to end (every part at the smoke size, fp32 where fp16 needs
CUDA), resuming, --stop-after, the GPU mode's fairseq arguments as fairseq's own parser reads them, the same runs as
the committed fp32 records, the FLOP count behind MFU against a hand count, and ``prepare``."""

import concurrent.futures
import json
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO))
from harness.bench import depth, gpu, hf, runs as runlib, speed  # noqa: E402
from test_bench_hf import exported  # noqa: E402,F401  (the exported Multi30k fixture)

SMOKE = ["--device", "cpu", "--smoke", "--in-process", "--peak-tflops", "1"]


@pytest.fixture(scope="module")
def cpu_mode(iwslt_bin, exported, tmp_path_factory):  # noqa: F811
    """``python -m harness.bench.gpu --device cpu --smoke``, its main() in this process, each memory run in a thread
    instead of a fresh process (which paid fairseq's import again)."""
    root = tmp_path_factory.mktemp("gpu")
    argv = [*SMOKE, "--out", str(root / "out"), "--data", str(iwslt_bin), "--hf-data", str(exported[0])]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TFIXUP_BENCH_WORK", str(root / "work"))
        mp.setattr(speed, "fresh_process", lambda: concurrent.futures.ThreadPoolExecutor(1))
        mp.setattr(sys, "argv", ["gpu.py", *argv])
        assert gpu.main(argv) == 0
    return root, argv


def test_cpu_mode_records_every_part_with_where_it_ran(cpu_mode, capfd):
    root, argv = cpu_mode
    out = root / "out"
    res = json.loads((out / "gpu.json").read_text())
    recs = res["records"]
    assert res["complete"] and res["runs_recorded"] == res["runs_planned"] == len(recs)
    assert {r["part"] for r in recs.values()} == set(gpu.PARTS)
    assert (out / "gpu.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (out / "gpu.md").read_text()
    assert "PARTIAL" not in text and "## fp16" in text and "## speed" in text
    for r in recs.values():
        assert r["status"] == "ok", r.get("error_tail")
        env = r["env"]  # where it ran: device, versions, date; and the exact command
        assert env["device"] == "cpu" and env["torch"] and env["date_utc"] and "cuda" in env
        assert r["command"].startswith("python -m harness.bench.gpu") and "--smoke" in r["command"]
    fairseq_runs = [r for r in recs.values() if r["part"] in ("fp16", "deep")]
    for r in fairseq_runs:  # fp32 on CPU, said in the id; no loss scale without --fp16
        assert r["id"].endswith("-fp32") and r["dtype"] == "fp32" and r["loss_scale"] is None
        assert r["fairseq_train"].startswith("fairseq-train ") and "--cpu" in r["fairseq_train"]
        assert r["updates"] == r["steps"] and r["overflow_steps"] == 0
        assert [u for u, _ in r["valid_curve"]][-1] == r["updates"]
        layers = r.get("layers") or r["depth"]
        for side in ("encoder", "decoder"):  # a value per layer, each under fp16's largest
            for q in ("stream", "ffn"):
                vals = r["activation_max"][side][q]
                assert len(vals) == layers and all(0 < v < gpu.FP16_MAX for v in vals)
        pk = r["activation_peak"]
        assert pk["over_fp16"] is False and pk["fp16_headroom"] == pytest.approx(gpu.FP16_MAX / pk["value"])
    assert {(r["part"], r["method"]) for r in fairseq_runs} == {("fp16", "preln_warmup"), ("deep", "tfixup")}
    for r in (r for r in recs.values() if r["part"] == "bf16"):
        assert "bf16" in r["precision"] and r["config"]["family"] in ("gpt2", "llama") and r["valid_curve"]
    (sp,) = [r for r in recs.values() if r["part"] == "speed"]
    t = sp["tfixup"]
    assert sp["dtype"] == "fp32" and t["tokens_per_s"] > 0 and sp["peak_tflops"] == 1
    assert t["mfu"] == pytest.approx(t["achieved_tflops"] / sp["peak_tflops"])

    # the same command again runs nothing: every run is recorded
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TFIXUP_BENCH_WORK", str(root / "work"))
        capfd.readouterr()
        assert gpu.main(argv) == 0
    err = capfd.readouterr().err
    assert f"{len(recs)} of {len(recs)} runs recorded" in err and "0 to run" in err
    assert "fp16 skipped on CPU" in err and "done " not in err


def test_stop_after_leaves_the_rest_to_the_next_call(iwslt_bin, tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("TFIXUP_BENCH_WORK", str(tmp_path / "work"))
    argv = [*SMOKE, "--out", str(tmp_path / "out"), "--data", str(iwslt_bin), "--parts", "deep", "--stop-after", "0"]
    assert gpu.main(argv) == 0
    err = capfd.readouterr().err
    assert "--stop-after reached; left for the next call" in err and "0 of 4 runs recorded" in err
    assert not list((tmp_path / "out" / "gpu" / "runs").glob("*.json"))


def test_a_skipped_update_counts_as_an_overflow_step(iwslt_bin, monkeypatch):
    """fairseq's Trainer skips an update whose gradients overflowed in fp16 (train_step returns None, the update count
    stays): the run counts that step as an overflow and still trains to --max-update (simulated here on CPU)."""
    from fairseq_tfixup.diagnostics import train

    real = train.build_trainer

    def build_trainer(data, flags):
        cfg, task, trainer = real(data, flags)
        step, calls = trainer.train_step, []

        def train_step(samples):
            calls.append(1)
            return None if len(calls) == 2 else step(samples)  # the second step: fairseq's overflow path

        trainer.train_step = train_step
        return cfg, task, trainer

    monkeypatch.setattr(train, "build_trainer", build_trainer)
    (run,) = gpu.fp16_runs({**gpu.MODES["smoke"], "mode": "smoke"}, iwslt_bin, "cpu")
    rec = gpu.train_fairseq(iwslt_bin, run.args[1:], 1)
    assert rec["status"] == "ok" and rec["overflow_steps"] == 1
    assert rec["updates"] == gpu.MODES["smoke"]["fp16"]["updates"] == rec["steps"] - 1


def test_gpu_mode_trains_fairseqs_fp16_the_paper_model_and_the_committed_runs(iwslt_bin, tmp_path):
    """The GPU mode's fairseq arguments, read by fairseq's own parser: --fp16 without --cpu, the paper's IWSLT
    model and its schedules; its deep runs are the depth study's committed fp32 runs (but for --cpu and --fp16),
    its bf16 runs the HuggingFace study's committed specs."""
    from fairseq_tfixup.diagnostics.models import parse_train_args

    data = tmp_path / "iwslt14-v1000"  # the name the committed records' data-bin has (a run's key holds it)
    data.symlink_to(iwslt_bin)
    cfg = {**gpu.MODES["default"], "mode": "default"}
    runs = gpu.make_runs(cfg, data, tmp_path / "hf-data", "cuda")
    assert [r.meta["part"] for r in runs][-1] == "speed"
    assert {r.id for r in runs if r.meta["part"] == "speed"} == {f"speed-{s}-{d}-cuda" for s in ("small", "big")
                                                                  for d in ("fp32", "fp16")}
    fp16 = {r.id: r for r in runs if r.meta["part"] == "fp16"}
    assert len(fp16) == 6
    for r in fp16.values():
        a = parse_train_args(data, [*r.args[1:], "--save-dir", str(tmp_path / "ckpt")])
        assert a.fp16 and not a.cpu and a.max_update == 800 and a.max_tokens == 4096
        assert (a.encoder_embed_dim, a.encoder_ffn_embed_dim, a.encoder_attention_heads, a.encoder_layers,
                a.decoder_layers) == (512, 1024, 4, 6, 6)
        if r.meta["method"] == "tfixup":
            assert a.arch == "transformer_tfixup" and a.lr_scheduler == "inverse_sqrt_nowarmup"
        else:
            assert a.arch == "transformer" and a.lr_scheduler == "inverse_sqrt" and a.warmup_updates == 200
            assert a.encoder_normalize_before == (r.meta["method"] == "preln_warmup")
    deep = [r for r in runs if r.meta["part"] == "deep"]
    assert [r.meta["depth"] for r in deep] == [100, 50]
    dcfg = gpu.depth_config(cfg, data, "cuda")
    for r in deep:
        fp32 = depth.run_of(dcfg, data, "tfixup", r.meta["depth"])
        assert r.args == ["fairseq", *fp32.args, "--fp16"]
        committed = runlib.read_record(gpu.FP32_RECORDS["deep"] / f"{fp32.id}.json")
        assert committed and fp32.recorded_by(committed), "not the depth study's committed run"
        assert parse_train_args(data, [*r.args[1:], "--save-dir", str(tmp_path / "c")]).fp16
    bf16 = [r for r in runs if r.meta["part"] == "bf16"]
    assert len(bf16) == 4
    for r in bf16:
        committed = runlib.read_record(gpu.FP32_RECORDS["bf16"] / f"{r.meta['fp32_id']}.json")
        assert committed and committed["config"] == json.loads(r.args[1])


def test_flop_count_behind_mfu_matches_a_hand_count(iwslt_bin, tmp_path):
    """speed.step_flops (what MFU divides by the peak) on one batch of the tiny model against the matmuls counted by
    hand: every linear layer 3x its forward FLOPs (forward, input gradient, weight gradient), attention's two
    matmuls 3x through plain bmm and 3.5x through the fused kernel, whose backward recomputes q k^T."""
    sz = speed.SIZES["tiny"]
    d, f, n = sz["embed"], sz["ffn"], sz["layers"]
    # T-Fixup's model: the stock model's LayerNorms add no matmul
    trainer = speed.new_trainer("tfixup", "tiny", iwslt_bin, speed.MODES["smoke"], "cpu", "fp32", str(tmp_path))
    batch = speed.real_batches(trainer, 1)[0]
    b, s = batch["net_input"]["src_tokens"].shape
    t = batch["target"].shape[1]
    v = len(trainer.task.target_dictionary)
    linear = (n * 2 * b * s * (4 * d * d + 2 * d * f)  # encoder: q, k, v, out; fc1, fc2
              + n * 2 * b * t * (4 * d * d + 2 * d * f)  # decoder self-attention and FFN
              + n * (2 * b * t * 2 * d * d + 2 * b * s * 2 * d * d)  # encoder attention: q, out; k, v
              + 2 * b * t * d * v)  # output projection
    attention = n * (2 * 2 * b * s * s * d + 2 * 2 * b * t * t * d + 2 * 2 * b * t * s * d)  # q k^T and p v
    counted = speed.step_flops(trainer, batch)
    assert 3 * (linear + attention) <= counted <= 3 * linear + 3.5 * attention


def test_report_of_gpu_records_gives_loss_scales_overflows_and_the_fp32_records(tmp_path):
    """The report of the GPU mode's records (made up here: no GPU ran them): loss scales, overflow steps, headroom,
    the CPU analysis's prediction, and the committed fp32 record of the same run beside the deep and bf16 ones."""
    cfg = {**gpu.MODES["default"], "mode": "default", "data": "IWSLT'14"}
    env = {"device": "NVIDIA H100 80GB HBM3", "driver": "580.159.04", "torch": "2.11.0+cu130", "cuda": "13.0",
           "cudnn": 91000, "capability": "9.0", "memory_gib": 79.2, "date_utc": "2026-11-28 09:00 UTC"}
    maxima = {"encoder": {"stream": [3.0] * 6, "ffn": [2.0] * 6}, "decoder": {"stream": [9.0] * 6, "ffn": [1.0] * 6}}
    trained = dict(status="ok", steps=802, overflow_steps=2, valid_curve=[(400, 7.5), (800, 6.9)], final_valid=6.9,
                   best_valid=6.9, activation_max=maxima, activation_peak=gpu.peak_of(maxima), env=env,
                   loss_scale={"first": 128.0, "lowest": 32.0, "final": 64.0, "drops": 2})
    records = {
        "fp16-tfixup-lr0.001-fp16": dict(trained, id="fp16-tfixup-lr0.001-fp16", part="fp16", method="tfixup", lr=1e-3,
                                         layers=6, updates=800),
        "deep-tfixup-100-fp16": dict(trained, id="deep-tfixup-100-fp16", part="deep", method="tfixup", depth=100,
                                     updates=600, fp32_id="tfixup-100"),
        "bf16-gpt2-L6-tfixup-s1": dict(id="bf16-gpt2-L6-tfixup-s1", part="bf16", status="ok", updates=1000, env=env,
                                       valid_curve=[(1000, 5.4)], fp32_id="gpt2-L6-tfixup-s1", s_per_update=0.01),
    }
    res = gpu.summarise(cfg, records, 16, "cuda")
    assert not res["complete"] and res["devices"] == [env["device"]]
    text = gpu.report(res)
    assert "PARTIAL: 3 of 16 runs" in text and "the paper's IWSLT model" in text
    assert "driver 580.159.04" in text and "CUDA 13.0" in text
    row = next(line for line in text.splitlines() if line.startswith("| fp16-tfixup"))
    assert "800 / 802 | 2 | 2 | 128 → 32 → 64" in row and "9 (decoder.0.stream)" in row and "| yes |" in row
    twin = res["fp32_twins"]["deep-tfixup-100-fp16"]
    assert twin["id"] == "tfixup-100" and twin["device"] == "cpu" and twin["best_valid"] is not None
    assert res["fp32_twins"]["bf16-gpt2-L6-tfixup-s1"]["best_valid"] is not None
    gpu.plot(res, tmp_path / "gpu.png")
    assert (tmp_path / "gpu.png").read_bytes()[:4] == b"\x89PNG"


def test_peak_of_calls_an_inf_an_overflow_and_the_prediction_that_missed_it():
    assert gpu.peak_of({"encoder": {"stream": [3.0, float("inf")], "ffn": [9.0, 1.0]}}) == {
        "value": float("inf"), "where": "encoder.1.stream", "over_fp16": True, "fp16_headroom": None}
    pk = gpu.peak_of({"decoder": {"stream": [2.0], "ffn": [70000.0]}})
    assert pk["over_fp16"] and pk["where"] == "decoder.0.ffn" and pk["fp16_headroom"] < 1
    # the CPU analysis predicted both inside fp16's range: it held for a run inside, not for this one
    pred = {"residual": 5.3, "ffn_hidden": 1.8}
    assert gpu.held(pred, {"over_fp16": False}) == "yes" and gpu.held(pred, pk) == "no" and gpu.held(None, pk) == "-"


def test_prepare_checks_what_a_device_call_carries_and_prints_its_command(iwslt_bin, exported, capsys):  # noqa: F811
    info = gpu.prepare(iwslt_bin, exported[0], bundle=False)
    assert sum(info["carry_mib"].values()) < gpu.CARRY_LIMIT_MIB
    out = capsys.readouterr().out
    assert info["command"] in out and "IWSLT'14" in out and "Multi30k" in out
    # the command the GPU call runs parses as this study's command line
    argv = info["command"].split("python3 -m harness.bench.gpu ", 1)[1].split(";")[0].split()
    args = gpu.parser().parse_args(argv)
    assert args.device == "cuda" and args.data == str(gpu.IWSLT_BIN) and args.stop_after == 360
    # the command docs/measurements.md gives a device call is this one
    assert info["command"] in (REPO / "docs" / "measurements.md").read_text()


def test_prepare_without_shared_data_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("TFIXUP_SHARED_DATA", str(tmp_path / "none"))
    with pytest.raises(SystemExit) as e:
        gpu.prepare_main(["--iwslt", str(tmp_path / "bin"), "--hf-data", str(tmp_path / "hf"), "--no-bundle"])
    assert e.value.code == 2


def test_cuda_without_a_gpu_is_one_line(iwslt_bin, tmp_path, capfd):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    with pytest.raises(SystemExit):
        gpu.main(["--device", "cuda", "--out", str(tmp_path), "--data", str(iwslt_bin)])
    assert capfd.readouterr().err.strip().splitlines()[-1].startswith("error: --device cuda: no CUDA device")
