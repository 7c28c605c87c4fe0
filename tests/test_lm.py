"""transformer_lm_tfixup, T-Fixup's decoder-only language model, built through fairseq's own parser and
language_modeling task on real English text: its plan (tfixup.applier) against the formulas,
LayerNorm removal, the tied embedding scaled once, refusals, training with fairseq-train, and the LM study
(harness/bench/lm.py): its arms from the method rows, its arithmetic and a --smoke run end to end."""

import json
import math
import subprocess

import pytest
import torch

from conftest import USER_DIR, fairseq_command, shared_across_workers
from model_checks import falling_losses
from harness import fairseq_log
from harness.bench import lm
from fairseq_tfixup.models.transformer_lm_tfixup import lm_plan
from tfixup import applier, methods, tfixup_init

TINY = ["--decoder-embed-dim", "64", "--decoder-input-dim", "64", "--decoder-output-dim", "64",
        "--decoder-ffn-embed-dim", "128", "--decoder-attention-heads", "4"]


@pytest.fixture(scope="session")
def lm_bin(shared_data, tmp_path_factory):
    """The LM study's data-bin of real Multi30k English (its own preparation step), first 300 train
    and 50 valid lines."""
    def make(root):
        lm.prepare_data(300, 50, root=str(root), shared=shared_data)

    return shared_across_workers(tmp_path_factory, "lm", make) / "lm-multi30k-en-t300-v50"


def build_lm(data, arch, *flags, seed=1):
    """(model, model config) as fairseq-train builds them: its parser, then its config conversion."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    argv = [str(data), "--task", "language_modeling", "--user-dir", str(USER_DIR), "--arch", arch,
            "--seed", str(seed), *map(str, flags)]
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), input_args=argv))
    torch.manual_seed(seed)
    return tasks.setup_task(cfg.task).build_model(cfg.model), cfg.model


def layer_norms(model):
    return [n for n, m in model.named_modules() if isinstance(m, torch.nn.LayerNorm) or "LayerNorm" in type(m).__name__]


# ---------------------------------------------------------------- the rules, pure


def test_lm_rules_scale_what_the_derivation_names_by_one_factor():
    n = 5
    s = tfixup_init.single_stack_scale(n)
    assert s == pytest.approx((6 * n) ** -0.25)
    assert tfixup_init.single_stack_scale(16 * n) == pytest.approx(s / 2)  # N^-1/4
    with pytest.raises(ValueError, match="at least one layer"):
        tfixup_init.single_stack_scale(0)


# ---------------------------------------------------------------- the fairseq model


@pytest.mark.parametrize("layers, tied", [(3, True), (4, False)])
def test_every_weight_has_the_prescribed_init_and_no_layer_norm(layers, tied, lm_bin):
    flags = ["--decoder-layers", layers, *TINY, *(["--share-decoder-input-output-embed"] if tied else [])]
    model, _ = build_lm(lm_bin, "transformer_lm_tfixup", *flags, seed=3)
    stock, _ = build_lm(lm_bin, "transformer_lm", *flags, seed=3)  # Post-LN: the same draws, LayerNorms kept
    assert layer_norms(model) == [] and layer_norms(stock) != []
    assert model.decoder.layer_norm is None and model.decoder.layernorm_embedding is None
    assert not any("norm" in k for k in model.state_dict())

    names = [n for n, _ in model.named_parameters()]
    assert (model.decoder.output_projection.weight is model.decoder.embed_tokens.weight) == tied
    assert ("decoder.output_projection.weight" in names) != tied  # tied: one tensor, one name, scaled once

    ref = dict(stock.named_parameters())
    s = tfixup_init.single_stack_scale(layers)
    counts = {"redrawn": 0, "scaled": 0, "kept": 0}
    plan = {name: (how, scale) for name, (how, scale, _) in applier.table(model, lm_plan(model)).items()}
    assert plan["decoder.embed_tokens.weight"] == ("keep", s)  # fairseq's N(0, d^-1/2), scaled
    assert plan["decoder.layers.0.self_attn.v_proj.weight"] == plan["decoder.layers.1.fc2.weight"] == ("xavier", s)
    assert plan["decoder.layers.2.self_attn.out_proj.weight"] == ("keep", s)  # fairseq's Xavier, scaled
    assert plan["decoder.layers.0.fc1.bias"] == ("zeros", 1.0)
    for kept in ("decoder.layers.2.self_attn.q_proj.weight", "decoder.layers.2.self_attn.v_proj.bias",
                 "decoder.output_projection.weight", "decoder.embed_positions._float_tensor"):
        assert kept not in plan, kept
    for name, p in model.named_parameters():
        how, scale = plan.get(name, ("keep", 1.0))
        if how == "xavier":  # plain Xavier (gain 1), times the factor
            expected = s * tfixup_init.xavier_uniform_std(p.shape[1], p.shape[0])
            assert p.std().item() == pytest.approx(expected, rel=0.06), name
            assert p.abs().max().item() <= expected * math.sqrt(3) * 1.0001, name
            counts["redrawn"] += 1
        elif how == "zeros":
            assert torch.count_nonzero(p) == 0, name
        elif scale != 1.0:  # fairseq's own draw, times the factor, exactly
            torch.testing.assert_close(p, ref[name] * s, rtol=0, atol=1e-7, msg=name)
            counts["scaled"] += 1
        else:
            torch.testing.assert_close(p, ref[name], rtol=0, atol=0, msg=name)
            counts["kept"] += 1
    emb = model.decoder.embed_tokens.weight[2:]  # fairseq's padding row (index 1) is zero
    assert emb.std().item() == pytest.approx(s * 64 ** -0.5, rel=0.05)  # N(0, d^-1/2), scaled once
    assert counts["redrawn"] == 3 * layers and counts["scaled"] == layers + 1  # v, fc1, fc2; out_proj, embedding


def test_presets_sizes_and_explicit_flags_win(lm_bin):
    _, small = build_lm(lm_bin, "transformer_lm_tfixup_small")
    _, deep = build_lm(lm_bin, "transformer_lm_tfixup_deep", "--decoder-ffn-embed-dim", 256)
    assert (small.decoder_embed_dim, small.decoder_ffn_embed_dim, small.decoder_attention_heads,
            small.decoder_layers, small.decoder_input_dim) == (128, 512, 4, 6, 128)
    assert (deep.decoder_embed_dim, deep.decoder_ffn_embed_dim, deep.decoder_layers) == (128, 256, 24)
    assert not small.decoder_normalize_before and not deep.decoder_normalize_before


@pytest.mark.parametrize("flags, message", [
    (["--decoder-normalize-before"], "has no LayerNorm: --decoder-normalize-before cannot be used"),
    (["--layernorm-embedding"], "has no LayerNorm: --layernorm-embedding cannot be used"),
    (["--decoder-layers", 0], "needs --decoder-layers >= 1, got 0"),
    (["--decoder-input-dim", 32], "needs --decoder-input-dim = --decoder-embed-dim"),
    (["--decoder-embed-dim", 64, "--decoder-output-dim", 32], "needs --decoder-output-dim = --decoder-embed-dim"),
])
def test_flags_that_defeat_tfixup_are_refused_in_one_line(flags, message, lm_bin):
    arch = "transformer_lm_tfixup" if "--decoder-embed-dim" in flags else "transformer_lm_tfixup_small"
    with pytest.raises(ValueError, match=message) as err:
        build_lm(lm_bin, arch, "--decoder-layers", 2, *flags)
    assert "\n" not in str(err.value)


def test_the_width_is_set_once(lm_bin):
    """fairseq's transformer_lm config keeps its input and output dims at 512 unless told: the model
    refused --decoder-embed-dim 128 alone (512 != 128). Left at that default, they take the width."""
    model, _ = build_lm(lm_bin, "transformer_lm_tfixup", "--decoder-layers", 2, "--decoder-embed-dim", 64,
                        "--decoder-ffn-embed-dim", 128, "--decoder-attention-heads", 4)
    assert model.decoder.embed_tokens.weight.shape[1] == 64
    assert model.decoder.project_in_dim is None and model.decoder.project_out_dim is None


def test_method_rows_build_their_language_models(lm_bin):
    """The LM study's arms come from the rows: Post-LN is fairseq's transformer_lm (no final norm), Pre-LN
    the same with --decoder-normalize-before (a final norm), T-Fixup none."""
    built = {}
    for name in ("tfixup", "postln", "preln"):
        model, cfg = build_lm(lm_bin, *methods.lm_model_flags(name)[1:], *methods.lm_dims_flags(32, 64, 2, 2))
        built[name] = (len(layer_norms(model)), model.decoder.layer_norm is not None, cfg.decoder_normalize_before)
    assert built == {"tfixup": (0, False, False), "postln": (4, False, False), "preln": (5, True, True)}
    with pytest.raises(ValueError, match="has no language model"):
        methods.lm_model_flags("dlcl")


def test_fairseq_train_trains_it_on_real_text_without_warmup(lm_bin):
    """fairseq-train --task language_modeling --arch transformer_lm_tfixup, inverse_sqrt_nowarmup, the
    command the LM study builds (tfixup.methods.train_args), run by fairseq-train's own entry point in this
    process: finite losses that fall."""
    recipe = methods.Recipe("tfixup", 64, 128, 4, 0, 3, lr="1e-3", max_tokens=512, max_update=30,
                            task="language_modeling", tokens_per_sample=32)
    args = methods.train_args(recipe, USER_DIR, cpu=True, log_format="json", num_workers=0)
    assert args[args.index("--lr-scheduler") + 1] == "inverse_sqrt_nowarmup" and "--warmup-updates" not in args
    log = fairseq_command("train", lm_bin, *args, "--no-save", "--log-interval", "5", "--validate-interval-updates", "30",
                          "--validate-interval", "100000")
    assert "T-Fixup LM: no LayerNorm; 3 layers" in log and "tied: scaled once" in log
    falling_losses(log, 6, by=1.0)
    valid = [float(r["valid_loss"]) for r in fairseq_log.records(log, "valid")]
    assert valid and all(math.isfinite(x) for x in valid), valid


# ---------------------------------------------------------------- the study


def test_study_arms_and_plan_come_from_the_method_rows():
    assert {a.name: (a.method, a.schedule) for a in lm.ARMS.values()} == {
        "tfixup": ("tfixup", "nowarmup"), "postln_matched": ("postln", "matched"),
        "preln_matched": ("preln", "matched"), "postln": ("postln", "nowarmup"),
        "dyt_matched": ("dyt", "matched"), "rezero": ("rezero", "nowarmup"), "derf_matched": ("derf", "matched")}
    runs = lm.plan("/data/lm-multi30k-en-t0-v0")
    assert [r.id for r in runs][:7] == ["L6-tfixup-lr0.001-s1", "L6-postln_matched-lr0.001-s1",
                                        "L6-postln-lr0.001-s1", "L6-preln_matched-lr0.001-s1",
                                        "L6-dyt_matched-lr0.001-s1", "L6-rezero-lr0.001-s1",
                                        "L6-derf_matched-lr0.001-s1"]
    assert {r.meta["depth"] for r in runs[7:]} == {24}
    by_id = {r.id: [str(a) for a in r.args] for r in runs}
    tf, base = by_id["L6-tfixup-lr0.001-s1"], by_id["L6-postln_matched-lr0.001-s1"]
    assert tf[tf.index("--lr-scheduler") + 1] == "inverse_sqrt_nowarmup"
    assert base[base.index("--lr-scheduler") + 1] == "inverse_sqrt_matched"
    # the same decay period, lr, batch and budget for every arm
    for flag in ("--decay-period", "--lr", "--max-tokens", "--max-update", "--tokens-per-sample"):
        assert len({a[a.index(flag) + 1] for a in by_id.values()}) == 1, flag


def _rec(id_, curve, **meta):
    return {"id": id_, "status": "ok", "valid_curve": curve, "wall_s": 1.0, "s_per_update": 0.1, **meta}


def test_study_updates_to_the_baselines_best_and_stuck(tmp_path, monkeypatch):
    cfg = dict(lm.MODES["smoke"], mode="smoke", depths=[6], n_runs=3, dropout=0.1, decay_period=4000, seed=1)
    level = {"train_fit": 7.7, "oracle": 7.5, "train_fit_ppl": 208.0, "oracle_ppl": 181.0, "vocab": 100,
             "valid_tokens": 1000}
    meta = dict(depth=6, lr=1e-3, seed=1, updates=400)
    records = {r["id"]: r for r in [
        _rec("L6-postln_matched-lr0.001-s1", [(100, 7.0), (200, 6.0), (400, 5.5)], method="postln_matched", **meta),
        _rec("L6-tfixup-lr0.001-s1", [(100, 6.2), (200, 5.4), (400, 5.0)], method="tfixup", **meta),
        _rec("L6-postln-lr0.001-s1", [(100, 7.6), (400, 7.2)], method="postln", **meta)]}
    res = lm.summarise(cfg, records, level, tmp_path, margin=1.0)
    rows = {r["method"]: r for r in res["rows"]}
    assert rows["tfixup"]["updates_to_baseline_best"] == 200 and rows["tfixup"]["ratio_to_baseline"] == 0.5
    assert rows["postln_matched"]["ratio_to_baseline"] == 1.0
    assert rows["postln"]["stuck"] and not rows["tfixup"]["stuck"]
    assert rows["postln"]["updates_to_baseline_best"] is None
    assert res["headline"]["6 layers"]["baseline_best_ppl"] == pytest.approx(2 ** 5.5, abs=0.01)
    assert res["headline"]["6 layers"]["better_warmup"] == "postln_matched"  # the only warmup arm here
    assert rows["tfixup"]["ratio_to_better_warmup"] == 0.5
    text = lm.report(res)
    assert "STUCK" in text and "not reached" in text and "perplexity **208.0**" in text
    lm.plot(res, tmp_path / "lm.png")
    assert (tmp_path / "lm.png").read_bytes()[:4] == b"\x89PNG"


def test_lm_unigram_level_is_the_best_unigram_models_cross_entropy(lm_bin, shared_data):
    """From the binarized data, as from counting the words of the text it was made from (words not in
    the dictionary are one symbol, <unk>; each line ends with </s>)."""
    from collections import Counter

    from harness.bench.unigram import lm_unigram_level

    level = lm_unigram_level(lm_bin)
    vocab = {line.split()[0] for line in (lm_bin / "dict.txt").read_text(encoding="utf-8").splitlines()}
    lines = lm._tokenize(lm._read_lines(shared_data / "multi30k" / "val.en.gz", 50))
    words = [w if w in vocab else "<unk>" for line in lines for w in line.split()] + ["</s>"] * len(lines)
    n = len(words)
    oracle = -sum(c * math.log2(c / n) for c in Counter(words).values()) / n
    assert level["valid_tokens"] == n
    assert level["oracle"] == pytest.approx(oracle, abs=1e-3) and level["oracle"] <= level["train_fit"]
    assert level["train_fit_ppl"] == pytest.approx(2 ** level["train_fit"], rel=1e-3)


def test_study_smoke_end_to_end(lm_bin, tmp_path, monkeypatch, fairseq_train_here):
    """The study's main() on the real data, its runs trained in this process (conftest.fairseq_train_here)."""
    out = tmp_path / "out"
    monkeypatch.setenv("TFIXUP_BENCH_WORK", str(tmp_path / "work"))
    assert lm.main(["--smoke", "--data", str(lm_bin), "--out", str(out), "--jobs", "1"]) == 0
    res = json.loads((out / "lm.json").read_text())
    assert res["complete"] and res["mode"] == "smoke" and "multi30k/train.en.gz" in res["data"]
    for key in ("command", "machine", "config", "unigram_level"):
        assert res[key]
    for r in res["records"].values():
        assert r["status"] == "ok" and [u for u, _ in r["valid_curve"]] == [4, 8], r
        assert "--task language_modeling" in r["command"]
    assert (out / "lm.png").stat().st_size > 0 and "unigram level" in (out / "lm.md").read_text().lower()


def test_the_whole_plan_through_the_study_with_a_fake_executor(lm_bin, tmp_path, monkeypatch):
    """The default study's 12 runs through run_study with a fake fairseq-train (no training): every run
    recorded with its row's command, the report and figure per depth, the resumed study runs nothing."""
    from harness.bench import runs as runlib

    ran = []

    def fake_train(run, work, threads=1):
        ran.append(run.id)
        fast = run.meta["method"] == "tfixup"
        curve = [(u, 7.0 - u / (100 if fast else 200)) for u in range(25, 401, 25)]
        return {"id": run.id, **run.meta, "status": "ok", "returncode": 0, "wall_s": 0.1, "key": run.key(),
                "command": " ".join(run.command(work / run.id)), "valid_curve": curve, "train_curve": [],
                "s_per_update": 0.1}

    monkeypatch.setattr(runlib, "train", fake_train)
    monkeypatch.setenv("TFIXUP_BENCH_WORK", str(tmp_path / "work"))
    assert lm.main(["--data", str(lm_bin), "--out", str(tmp_path)]) == 0
    assert len(ran) == len(lm.plan(lm_bin)) and ran[:4] == [r.id for r in lm.plan(lm_bin)][:4]
    res = json.loads((tmp_path / "lm.json").read_text())
    assert res["complete"] and set(res["headline"]) == {"6 layers", "24 layers"}
    for rec in res["records"].values():
        name = lm.ARMS[rec["method"]].method
        assert f"--arch {methods.method(name).lm_arch} " in rec["command"]
    # T-Fixup's fake curve falls twice as fast: it reaches the baseline's best (at 400) by update 200
    assert res["headline"]["24 layers"]["arms"]["tfixup"]["ratio_to_baseline"] == 0.5
    # both warmup arms have the same fake curve: the better one is either, with the same best
    assert res["headline"]["24 layers"]["arms"]["tfixup"]["ratio_to_better_warmup"] == 0.5
    assert "PARTIAL" not in (tmp_path / "lm.md").read_text()
    ran.clear()
    assert lm.main(["--data", str(lm_bin), "--out", str(tmp_path)]) == 0 and ran == []


def test_preparing_without_fairseq_on_the_path_is_one_line_and_leaves_nothing(shared_data, tmp_path, monkeypatch,
                                                                              capsys):
    """Outside the venv, `python -m harness.bench.lm` ended in a traceback (fairseq-preprocess not found) and
    left work/data-bin/lm-multi30k-en-t0-v0.tmp.PID; a preparation killed outright left its temp folder too
    (named now as tfixup.atomic.write_folder names it)."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f".lm-multi30k-en-t20-v10.{dead.pid}.abcd1234.tmp"
    (stale / "text").mkdir(parents=True)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SystemExit):
        lm.prepare_data(20, 10, root=str(tmp_path), shared=shared_data)
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["error: fairseq-preprocess not found: run this with the project's environment "
                                        "active (. .venv/bin/activate; bash scripts/install.sh makes it)"]
    assert list(tmp_path.iterdir()) == [stale]
    # a failure after the temp folder is made removes it, and the dead preparation's folder with it
    monkeypatch.setattr(lm.shutil, "which", lambda name: "/nonexistent/" + name)
    with pytest.raises(FileNotFoundError):
        lm.prepare_data(20, 10, root=str(tmp_path), shared=shared_data)
    assert list(tmp_path.iterdir()) == []
