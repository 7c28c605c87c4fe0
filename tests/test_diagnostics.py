"""Diagnostics: Lanczos/SLQ, Hessian-vector products, histograms, and the tfixup-diagnose CLI.

Models are tiny (d=16..32, 1-2 layers) and data is a slice of the real IWSLT'14 sample
(the ``iwslt_bin`` fixture) or Multi30k (``shared_data``), so the file runs in about a minute.
"""

import json
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fairseq_tfixup.diagnostics import cli, data, grad_hist, hessian, lanczos, models

TINY = ["--dim", "16", "--ffn-dim", "32", "--heads", "2", "--layers", "2", "--max-tokens", "256", "--threads", "1"]


def test_lanczos_recovers_top_eigenvalues_of_known_spectrum():
    torch.manual_seed(0)
    n = 300
    spectrum = torch.cat([torch.tensor([50.0, 20.0, 10.0, -8.0]), torch.linspace(-1, 1, n - 4)]).double()
    q, _ = torch.linalg.qr(torch.randn(n, n, dtype=torch.float64))
    a = q @ torch.diag(spectrum) @ q.T
    v0 = torch.randn(n, dtype=torch.float64)
    alpha, beta = lanczos.lanczos(lambda v: a @ v, n, 40, v0=v0, dtype=torch.float64)
    theta, w = lanczos.tridiag_eig(alpha, beta)
    np.testing.assert_allclose(np.sort(theta)[::-1][:3], [50.0, 20.0, 10.0], rtol=1e-8)
    assert theta.min() == pytest.approx(-8.0, rel=1e-8)
    # quadrature weights: a probability vector whose first moment is the Rayleigh quotient of v0
    assert w.sum() == pytest.approx(1.0, abs=1e-12)
    u = v0 / v0.norm()
    assert (w * theta).sum() == pytest.approx(float(u @ a @ u), rel=1e-10)
    # the broadened density integrates to 1
    grid = np.linspace(-12, 55, 4000)
    dens = lanczos.slq_density(theta[None], w[None], grid, sigma=0.3)
    # trapezoid rule by hand: np.trapz (NumPy < 2) was renamed np.trapezoid (NumPy >= 2)
    assert float(((dens[1:] + dens[:-1]) / 2 * np.diff(grid)).sum()) == pytest.approx(1.0, abs=1e-3)


def test_lanczos_stops_on_invariant_subspace():
    a = torch.diag(torch.tensor([3.0, 3.0, 1.0, 1.0], dtype=torch.float64))
    alpha, beta = lanczos.lanczos(lambda v: a @ v, 4, 4, v0=torch.ones(4, dtype=torch.float64), dtype=torch.float64)
    theta, _ = lanczos.tridiag_eig(alpha, beta)
    np.testing.assert_allclose(theta, [1.0, 3.0], atol=1e-12)  # only two distinct eigenvalues are reachable


@pytest.mark.parametrize("variant", ["postln", "preln", "tfixup"])
def test_hvp_matches_finite_difference_of_gradients(iwslt_bin, variant):
    # GELU, not ReLU: finite differences across ReLU kinks do not measure the Hessian
    spec = models.ModelSpec(model=variant, dim=16, ffn_dim=32, heads=2, encoder_layers=1, decoder_layers=1,
                            extra=["--activation-fn", "gelu"])
    args, task, model, _ = models.build(str(iwslt_bin), spec, seed=3)
    model.double().train()
    batch = data.fixed_batches(task, args, "valid", 6)[0]
    pad = task.target_dictionary.pad()
    params = [p for p in model.parameters() if p.requires_grad]

    def loss_fn():
        # our own loss in float64 (fairseq's criterion takes log_softmax in float32, too coarse for differences)
        logits = model(**batch["net_input"])[0]
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch["target"].reshape(-1),
                               ignore_index=pad, reduction="mean")

    gen = torch.Generator().manual_seed(0)
    v = [torch.randn(p.shape, generator=gen, dtype=torch.float64) for p in params]
    norm = hessian.flat(v).norm()
    v = [x / norm for x in v]
    with hessian.math_attention():
        hv = hessian.flat(hessian.hvp(loss_fn(), params, v))

    def grad_at(shift):
        with torch.no_grad():
            for p, d in zip(params, v):
                p.add_(shift * d)
        g = hessian.flat(torch.autograd.grad(loss_fn(), params))
        with torch.no_grad():
            for p, d in zip(params, v):
                p.sub_(shift * d)
        return g

    # fairseq takes some softmaxes in float32, so the differences carry ~1e-6/eps rounding: eps = 1e-2
    # keeps that well below the tolerance, while a wrong HVP (e.g. a missing term) is off by O(1).
    eps = 1e-2
    fd = (grad_at(eps) - grad_at(-eps)) / (2 * eps)
    assert hv.norm() > 0
    assert (hv - fd).norm() / fd.norm() < 2e-3


def test_log_histogram_counts_every_element():
    x = torch.tensor([0.0, 0.0, 1e-30, 1e-7, -3e-3, 0.5, -2.0, 1e5])
    edges = np.linspace(-12, 0, 25)
    counts, zeros = grad_hist.log_histogram(x, edges)
    assert zeros == 2
    assert counts.sum() + zeros == x.numel()
    assert counts[0] == 1 and counts[-1] == 3  # out-of-range magnitudes land in the edge bins


def read_npz(path):
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def assert_png(path):
    import matplotlib.image

    img = matplotlib.image.imread(str(path))
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100


def test_cli_grad_hist(iwslt_bin, tmp_path):
    rc = cli.main(["grad-hist", "--data", str(iwslt_bin), "--model", "postln,tfixup", "--schedule", "nowarmup",
                   "--steps", "3", "--split", "valid", "--out", str(tmp_path)] + TINY)
    assert rc == 0
    arrays = read_npz(tmp_path / "grad_hist.npz")
    meta = json.loads((tmp_path / "grad_hist.json").read_text())
    for m in ("postln", "tfixup"):
        numel = meta["runs"][f"{m}/nowarmup"]["numel"]
        assert numel == len(models.build(str(iwslt_bin), models.ModelSpec(model=m, dim=16))[1]
                            .source_dictionary) * 16
        for kind in ("grad", "update"):
            counts, zeros = arrays[f"{m}_nowarmup_{kind}"], arrays[f"{m}_nowarmup_{kind}_zeros"]
            assert counts.shape == (3, 60)
            np.testing.assert_array_equal(counts.sum(axis=1) + zeros, numel)
        # a batch touches only some tokens' rows: the others' gradient is exactly zero
        assert (arrays[f"{m}_nowarmup_grad_zeros"] > 0).all()
        assert np.isfinite(arrays[f"{m}_nowarmup_loss"]).all()
    assert_png(tmp_path / "grad_hist.png")
    assert not list(tmp_path.glob("*.tmp"))


def test_cli_ln_norms(iwslt_bin, tmp_path):
    rc = cli.main(["ln-norms", "--data", str(iwslt_bin), "--model", "postln,preln,tfixup", "--schedule", "warmup",
                   "--steps", "2", "--split", "valid", "--out", str(tmp_path)] + TINY)
    assert rc == 0
    arrays = read_npz(tmp_path / "ln_norms.npz")
    for m in ("postln", "preln", "tfixup"):
        norms = arrays[f"{m}_warmup_norms"]
        assert norms.shape == (2, 2)  # steps x decoder layers
        assert np.isfinite(norms).all() and (norms > 0).all()
    assert_png(tmp_path / "ln_norms.png")


def test_cli_grad_norms(iwslt_bin, tmp_path, capsys):
    rc = cli.main(["grad-norms", "--data", str(iwslt_bin), "--depths", "1,2", "--inits", "1", "--sentences", "16",
                   "--out", str(tmp_path)] + TINY)
    assert rc == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "[grad-norms] gradient" in line]
    # a line after every gradient: 3 models x 1 init x (the model and depths 1, 2)
    assert [line.split(" (")[0] for line in lines] == [f"[grad-norms] gradient {i} of 9" for i in range(1, 10)]
    assert "min so far, about" in lines[0] and lines[-1].endswith("about 0.0 min left at that rate")
    meta = json.loads((tmp_path / "grad_norms.json").read_text())
    arrays = read_npz(tmp_path / "grad_norms.npz")
    assert set(meta["models"]) == {"postln", "preln", "tfixup"}
    for m, res in meta["models"].items():
        assert {"enc.emb", "enc1", "enc2", "dec.emb", "dec1", "dec2", "dec.out"} <= set(res["per_layer"])
        assert ("enc.ln" in res["per_layer"]) == (m == "preln")  # only Pre-LN has final LayerNorms
        vals = np.asarray(list(res["per_layer"].values()) + list(res["last_decoder_fc2_vs_depth"].values()))
        assert np.isfinite(vals).all() and (vals > 0).all()
        assert arrays[f"{m}_last_fc2"].shape == (2, 1, 2)
    assert_png(tmp_path / "grad_norms.png")


def test_cli_hessian_on_multi30k(shared_data, tmp_path):
    out = tmp_path / "out"
    rc = cli.main(["hessian", "--shared", str(shared_data), "--cache", str(tmp_path / "cache"), "--sentences", "24",
                   "--lanczos-steps", "6", "--top-k", "3", "--model", "postln,tfixup", "--out", str(out)] + TINY)
    assert rc == 0
    assert (tmp_path / "cache" / "multi30k-val-24" / "dict.de.txt").is_file()
    meta = json.loads((out / "hessian.json").read_text())
    for m in ("postln", "tfixup"):
        r = meta["models"][m]
        assert r["sentence_pairs"] == 24
        top = np.asarray(r["top_eigenvalues"])
        assert len(top) == 3 and np.isfinite(top).all() and top[0] > 0
        assert (np.diff(top) <= 0).all()
    assert "| postln |" in (out / "hessian.md").read_text()
    arrays = read_npz(out / "hessian.npz")
    assert np.isfinite(arrays["postln_density"]).all() and (arrays["postln_density"] >= 0).all()
    assert_png(out / "hessian.png")


def test_grad_norms_stopped_says_so_in_one_line_and_leaves_no_file(iwslt_bin, tmp_path, capsys, monkeypatch):
    """Ctrl-C or SIGTERM (raised as KeyboardInterrupt) in the middle: exit 130, one line, no file of the
    command (they are written whole at its end)."""
    from fairseq_tfixup.diagnostics import grad_norms

    calls = []

    def stopped(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    real = grad_norms.grads_at_init
    monkeypatch.setattr(grad_norms, "grads_at_init", stopped)
    out = tmp_path / "out"
    rc = cli.main(["grad-norms", "--data", str(iwslt_bin), "--depths", "1", "--inits", "1", "--sentences", "8",
                   "--model", "tfixup", "--out", str(out)] + TINY)
    captured = capsys.readouterr()
    assert rc == 130 and "[grad-norms] gradient 1 of 2" in captured.out
    err = captured.err.strip()
    assert err.startswith("tfixup-diagnose grad-norms: interrupted; nothing is half-made") and "\n" not in err
    assert not out.exists() or not list(out.iterdir())


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert cli.main(["grad-norms", "--data", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("tfixup-diagnose: error:") and "\n" not in err
    with pytest.raises(SystemExit) as e:
        cli.main(["hessian", "--model", "postln,nosuch", "--out", str(tmp_path / "o")])
    assert e.value.code == 2
    assert not (tmp_path / "o").exists()


def test_cli_module_help_runs(capsys, monkeypatch):
    """`python -m fairseq_tfixup.diagnostics.cli --help`, run here as -m runs it (a new interpreter
    would import fairseq again, ~5 s)."""
    import runpy

    monkeypatch.setattr(sys, "argv", ["cli", "--help"])
    with pytest.raises(SystemExit) as done:
        runpy.run_module("fairseq_tfixup.diagnostics.cli", run_name="__main__", alter_sys=True)
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "grad-hist" in out and "hessian" in out


def test_update_size_is_first_order_in_eta_restores_the_model_and_fits_slopes(iwslt_bin, tmp_path):
    from fairseq_tfixup.diagnostics import update_size
    from tfixup import update_size as us

    spec = models.ModelSpec(model="tfixup", dim=16, ffn_dim=32, heads=2, encoder_layers=2, decoder_layers=2)
    args, task, model, criterion = models.build(str(iwslt_bin), spec, seed=3)
    model.train()
    batches = data.fixed_batches(task, args, "valid", 8)
    before = [p.detach().clone() for p in model.parameters()]
    small = update_size.one_step(model, criterion, batches, us.sgd(1e-5)) / 1e-5
    half = update_size.one_step(model, criterion, batches, us.sgd(5e-6)) / 5e-6
    assert small > 0 and half == pytest.approx(small, rel=1e-2)  # ||df|| = Theta(eta): linear as eta -> 0
    for p, b in zip(model.parameters(), before):
        torch.testing.assert_close(p, b, rtol=0, atol=0)  # the probe leaves the model as it was
    # without the biases in the step, the change is smaller and only the other parameters would move
    seen = []
    no_bias = update_size.one_step(model, criterion, batches, lambda ps: seen.extend(ps), biases=False)
    biases = {id(p) for n, p in model.named_parameters() if n.endswith(".bias")}
    assert no_bias == 0 and seen and not biases & {id(p) for p in seen}
    assert us.loglog_slope([1, 2, 4], [3.0, 6.0, 12.0]) == pytest.approx(1.0)
    assert us.loglog_slope([1, 2, 4], [5.0, 5.0, 5.0]) == pytest.approx(0.0, abs=1e-12)

    assert cli.main(["update-size", "--data", str(iwslt_bin), "--model", "tfixup,noln", "--depths", "1,2",
                     "--inits", "1", "--sentences", "4", *TINY, "--out", str(tmp_path)]) == 0
    meta = json.loads((tmp_path / "update_size.json").read_text())
    assert set(meta["models"]) == {"tfixup", "noln"} and (tmp_path / "update_size.png").stat().st_size > 0
    assert all(np.isfinite(m["sgd_loglog_slope"]) and np.isfinite(m["adam_loglog_slope"]) for m in meta["models"].values())


def test_update_decomposition_groups_sum_to_the_whole_step_and_records_each_variant(iwslt_bin, tmp_path):
    from fairseq_tfixup.diagnostics import update_decomposition as ud
    from tfixup import update_size as us

    assert ud.group_of("decoder.layers.0.encoder_attn.v_proj.bias") == "v_bias"
    assert ud.group_of("encoder.layers.3.self_attn.k_proj.weight") == "qk_weight"
    assert ud.group_of("decoder.output_projection.weight") == "output_proj"
    assert ud.group_of("encoder.layers.1.final_layer_norm.weight") == "norm"
    spec = models.ModelSpec(model="tfixup", dim=16, ffn_dim=32, heads=2, encoder_layers=2, decoder_layers=2)
    args, task, model, criterion = models.build(str(iwslt_bin), spec, seed=3)
    model.double().train()
    batches = data.fixed_batches(task, args, "valid", 4)
    loss, outputs = us.fairseq_adapter(criterion)
    us.gradient(model, batches, loss)
    sel = ud.selections(model)
    groups = [g for g in sel if g not in ud.UNIONS]
    # every trainable parameter is in exactly one group; the unions are the weights, the biases and all
    assert sorted(id(p) for g in groups for p in sel[g]) == sorted(id(p) for p in sel["all"])
    assert len(sel["weights"]) + len(sel["biases"]) == len(sel["all"])
    # to first order the groups' changes add up to the whole step's (as vectors): check it on the logits
    # to 1%: fairseq computes the cross-attention softmax in float32 even in a float64 model, which leaves
    # about 0.5% of rounding in a change this small; a group stepped twice or left out would be off by far more
    eta = 1e-5
    before = us.outputs_now(model, batches, outputs)["logits"]

    def delta(params):
        saved = [p.detach().clone() for p in params]
        with torch.no_grad():
            us.sgd(eta)(params)
            d = us.outputs_now(model, batches, outputs)["logits"] - before
            for p, s in zip(params, saved):
                p.copy_(s)
        return d

    whole = delta(sel["all"])
    err = float((sum(delta(sel[g]) for g in groups) - whole).norm())
    assert float(whole.norm()) > 0 and err < 1e-2 * float(whole.norm())

    common = ["--data", str(iwslt_bin), "--depths", "1,2", "--etas", "1e-4,1e-5", "--inits", "1", "--sentences", "4",
              *TINY, "--out", str(tmp_path)]
    assert cli.main(["update-decomposition", "--variants", "as_built", *common]) == 0
    assert cli.main(["update-decomposition", "--variants", "zero_attn_bias_no_positions", *common]) == 0
    meta = json.loads((tmp_path / "update_decomposition.json").read_text())
    assert list(meta["variants"]) == ["as_built", "zero_attn_bias_no_positions"]  # the second run adds to the first
    for v in meta["variants"].values():
        first, second = v["etas"]["0.0001"], v["etas"]["1e-05"]
        assert {"weights", "biases", "all", "v_weight"} <= set(first) and set(second) == set(ud.UNIONS)
        assert np.isfinite(first["weights"]["loglog_slope"])
        for n in ("1", "2"):  # first order: ||df|| / eta the same at both etas
            assert second["all"]["df_over_eta"][n] == pytest.approx(first["all"]["df_over_eta"][n], rel=0.05)
    # the zero-bias variant has q/k/v biases, all zero, so a step of them changes the output through their gradient
    assert "v_bias" in meta["variants"]["zero_attn_bias_no_positions"]["etas"]["0.0001"]
    assert "| weights |" in (tmp_path / "update_decomposition.md").read_text()
    assert_png(tmp_path / "update_decomposition.png")
    assert cli.main(["update-decomposition", "--model", "tfixup,postln", *common]) == 1  # one model


def test_fp16_headroom_records_the_maxima_of_a_real_training_run(iwslt_bin, tmp_path):
    from fairseq_tfixup.diagnostics import fp16_headroom as fh

    torch.manual_seed(0)
    spec = models.ModelSpec(model="postln", dim=16, ffn_dim=32, heads=2, encoder_layers=1, decoder_layers=1)
    _, _, model, _ = models.build(str(iwslt_bin), spec, seed=3)
    attn = model.encoder.layers[0].self_attn
    x = torch.randn(5, 2, 16)
    q = attn.q_proj(x) * attn.scaling
    k = attn.k_proj(x)
    q, k = (t.reshape(5, 2, 2, 8).permute(1, 2, 0, 3) for t in (q, k))  # (B, H, T, dh)
    assert fh.attention_logit_max(attn, x, None) == pytest.approx(float((q @ k.transpose(-1, -2)).detach().abs().max()), rel=1e-5)

    summary = fh.summarise({"residual": [1.0, 7e4, 2.0], "attn_logits": [1, 2, 3], "ffn_hidden": [1, 1, float("inf")],
                            "grad": [1, 2, 3], "grad_mean": [0.1, 0.2, 0.3]}, [9.0, 8.0, 7.0])
    assert summary["residual"]["first_update_over_fp16"] == 2 and summary["residual"]["at_update"] == 2
    assert summary["ffn_hidden"]["first_update_over_fp16"] == 3  # a non-finite value is out of range too
    assert summary["grad"]["first_update_over_fp16"] is None and summary["grad"]["fp16_headroom"] == fh.FP16_MAX / 3

    args = ["fp16-headroom", "--data", str(iwslt_bin), "--model", "tfixup,postln", "--depths", "1,2", "--steps", "3,2",
            "--split", "valid", "--warmup-updates", "2", *TINY, "--out", str(tmp_path)]
    assert cli.main(args) == 0
    meta = json.loads((tmp_path / "fp16_headroom.json").read_text())
    assert set(meta["runs"]) == {"tfixup/1", "postln/1", "tfixup/2", "postln/2"}
    for key, run in meta["runs"].items():
        assert run["updates"] == (3 if key.endswith("/1") else 2)
        for q in fh.QUANTITIES:
            assert 0 < run[q]["max"] < fh.FP16_MAX and len(meta["curves"][key][q]) == run["updates"]
        assert run["grad"]["max"] > run["grad_mean"]["max"]  # the summed loss's gradient, before / sample size
    assert meta["runs"]["postln/1"]["schedule"] == "matched" and meta["runs"]["tfixup/1"]["schedule"] == "nowarmup"
    assert_png(tmp_path / "fp16_headroom.png")
    stamp = (tmp_path / "fp16_headroom" / "tfixup-1.json").stat().st_mtime_ns
    assert cli.main(args) == 0  # every run recorded: nothing trains again
    assert (tmp_path / "fp16_headroom" / "tfixup-1.json").stat().st_mtime_ns == stamp
    assert cli.main([*args[:8], "1,2,3", *args[9:]]) == 1  # --steps: one number, or one per depth
