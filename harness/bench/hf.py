"""T-Fixup in HuggingFace ``transformers`` models on real data: Marian, GPT-2, Llama and BERT built from configs
(no download), trained with a plain PyTorch loop, ``apply_tfixup(model)`` against the stock model.

Data: Multi30k as the quality study has it (the BPE'd De-En data-bin of ``scripts/prepare-corpus.sh --lowercase
--bpe-merges 8000``), exported once by ``export`` (needs fairseq) into a folder that the runs read with numpy and
torch alone; copy it to a GPU machine. Each family's recipe and arms: MODES below, the report's text and
docs/beyond-fairseq.md ("The evidence study"); the arms, data, models, loop and decoder: harness/bench/hf_train.py;
the LLaMA question (each method on an lr grid at 24 layers, a second seed at its best lr): harness/bench/hf_llama.py.

Every run: Adam (0.9, 0.98), decoupled weight decay 1e-4, no clipping; no warmup is lr*sqrt(P/(P+t)), P = 4000;
the matched warmup rises linearly over W updates onto that curve. Each run is a subprocess (``one``), its record
OUT/hf/runs/RUN.json when it ends; a failed run leaves OUT/hf/failed/RUN.json and is tried again on the next
start. The lr grid grows from the records, so a command runs in rounds (--rounds); --select GLOB runs the
planned runs whose ids match; a run's id names its lr where it is not the mode's (llama-L24-dyt-lr0.002-s1).

    python -m harness.bench.hf export --out work/hf-data        # here, once (fairseq)
    python -m harness.bench.hf --estimate --data work/hf-data   # CPU seconds per update of each run type
    python -m harness.bench.hf --smoke --out /tmp/hf --data work/hf-data
    python -m harness.bench.hf --out results/bench --data work/hf-data --device cuda --jobs 8
    python -m harness.bench.hf --out results/bench --data work/hf-data --select 'llama-L24-*-s2'
"""

import argparse
import fnmatch
import json
import math
import pathlib
import sys

from harness.bench import common, hf_train, runs as runlib
from harness.bench.unigram import hf_lm_unigram_level
# the arms (a table of rows), the data and one run: hf_train; the LLaMA question: hf_llama (both named here too)
from harness.bench.hf_llama import (LLAMA_COLUMNS, MARGIN_BITS, grid_of, llama_question, llama_report,  # noqa: F401
                                    llama_table, llama_verdict, plot_llama_question)
from harness.bench.hf_train import (ARMS, BASELINE, DATA_BIN, DECAY_PERIOD, FAMILIES, LR_ARMS,  # noqa: F401
                                    NEW_LLAMA_ARMS, NO_MULTIPLIER, NORM_FREE, PREPARE, WEIGHT_DECAY, DERF_ALPHA0,
                                    DERF_SHIFT0, DYT_ALPHA0, TGT, check_data, export, run_one, test_scores)

STEM = "hf"
# the quality study's fairseq runs of the same recipe (seed 1, Multi30k): T-Fixup, and Post-LN on the matched warmup
FAIRSEQ_RUNS = {arm: common.REPO / "results" / "bench" / "quality" / "runs" / f"multi30k-{name}.json"
                for arm, name in (("tfixup", "tfixup"), ("stock_matched", "postln_matched"))}
# the lm settings that say which runs there are, not how a run trains (kept out of each run's spec)
LM_PLAN_KEYS = ("depths", "deep_seeds", "families", "arms", "control_arms", "gate_arms", "new_arms", "lr_grid",
                "deeper", "llama_seed_controls")

MODES = {
    "smoke": {
        "marian": dict(d=16, ffn=32, heads=2, layers=1, max_tokens=400, epochs=1, max_updates=3, lr=5e-4,
                       warmup=2, dropout=0.3, label_smoothing=0.1, beam=2, lenpen=0.3, max_len_b=8,
                       train_lines=64, valid_lines=16, test_lines=4,
                       arms=["tfixup", BASELINE, "tfixup_fsqk", "stock_fsinit"]),
        "lm": dict(d=16, ffn=32, heads=2, depths=[2], deep_seeds=[1], updates=4, valid_every=2, warmup=2, lr=1e-3,
                   tokens_per_sample=16, max_tokens=64, dropout=0.1, train_lines=64, valid_lines=16,
                   families=["gpt2", "llama"], arms=["tfixup", BASELINE], control_arms=["tfixup_noscale"],
                   gate_arms=["tfixup_mlpnorm", "tfixup_nogate"], new_arms=NEW_LLAMA_ARMS,
                   lr_grid=dict(depth=2, lrs=[1e-3, 2e-3], min_lr=1e-3, max_lr=2e-3, seeds=[1], arms=["giadam"]),
                   deeper=dict(depth=3, seeds=[1], arms=["tfixup_sigmoid"])),
        "bert": dict(d=16, ffn=32, heads=2, layers=2, updates=4, valid_every=2, warmup=2, lr=5e-4, batch=8,
                     max_len=32, mask_prob=0.15, dropout=0.1, train_lines=64, valid_lines=16,
                     arms=["tfixup", BASELINE], control_arms=["tfixup_headnorm"]),
    },
    # the quality study's translation recipe; the LM and BERT sizes of harness/bench/lm.py (128-512-4,
    # 1024 tokens per update) with 1000 updates, W a quarter of them as there
    "default": {
        "marian": dict(d=128, ffn=256, heads=4, layers=6, max_tokens=4096, epochs=10, max_updates=0, lr=5e-4,
                       warmup=400, dropout=0.3, label_smoothing=0.1, beam=4, lenpen=0.3, max_len_b=200,
                       train_lines=0, valid_lines=0, test_lines=0,
                       arms=["tfixup", BASELINE, "tfixup_fsqk", "stock_fsinit"]),
        # Llama also: the new arms at 6 and 24 layers; at 24 each method's lr grid (from 5e-4, 1e-3, 2e-3, grown
        # while the best lr is at its edge) and a second seed at its best lr; the norm-free candidates at 48
        "lm": dict(d=128, ffn=512, heads=4, depths=[6, 24], deep_seeds=[1, 2], updates=1000, valid_every=25,
                   warmup=250, lr=1e-3, tokens_per_sample=64, max_tokens=1024, dropout=0.1, train_lines=0,
                   valid_lines=0, families=["gpt2", "llama"], arms=["tfixup", BASELINE, "stock"],
                   control_arms=["tfixup_noscale"], gate_arms=["tfixup_mlpnorm", "tfixup_nogate"],
                   new_arms=NEW_LLAMA_ARMS, llama_seed_controls=["tfixup_noscale"],  # its later seeds too
                   lr_grid=dict(depth=24, lrs=[5e-4, 1e-3, 2e-3], min_lr=1.25e-4, max_lr=8e-3, seeds=[1, 2],
                                arms=LR_ARMS),
                   deeper=dict(depth=48, seeds=[1, 2], arms=[*NORM_FREE, "tfixup", "tfixup_mlpnorm", BASELINE])),
        "bert": dict(d=128, ffn=512, heads=4, layers=6, updates=1000, valid_every=25, warmup=250, lr=5e-4,
                     batch=64, max_len=64, mask_prob=0.15, dropout=0.1, train_lines=0, valid_lines=0,
                     arms=["tfixup", BASELINE, "stock"], control_arms=["tfixup_headnorm"]),
    },
}


def make_config(mode: str) -> dict:
    return {**json.loads(json.dumps(MODES[mode])), "mode": mode, "decay_period": DECAY_PERIOD,
            "weight_decay": WEIGHT_DECAY}


def run_id(spec: dict) -> str:
    """e.g. marian-L6-tfixup-s1, llama-L24-dyt-lr0.002-s1: the lr named only on a run of an lr grid (``lr_in_id``),
    so that the runs at the mode's lr keep their first ids."""
    lr = f"-lr{spec['lr']:g}" if spec.get("lr_in_id") else ""
    return f"{spec['family']}-L{spec['layers']}-{spec['arm']}{lr}-s{spec['seed']}"


def arm_settings(spec: dict) -> dict:
    """SPEC with what its arm sets beyond the study's recipe, so that the record's config says it (apply_tfixup's
    input multiplier where the family has none, gated MLP, optimizer, element-wise norms' constants, init)."""
    arm = ARMS[spec["arm"]]
    if spec["family"] in NO_MULTIPLIER and arm.tfixup:
        spec["input_scale"] = arm.input_scale
    if arm.gated_mlp:
        spec["gated_mlp"] = arm.gated_mlp
    if arm.optimizer != "adam":
        spec["optimizer"] = arm.optimizer
    if arm.norms != "kept":
        alpha0 = dict(DYT_ALPHA0) if arm.norms == "dyt" else {k: DERF_ALPHA0 for k in DYT_ALPHA0}
        spec.update(norm=arm.norms, alpha0=alpha0, embedding_scalar="learned, sqrt(d) at init",
                    **({"shift0": DERF_SHIFT0} if arm.norms == "derf" else {}))
    if arm.change == "fairseq_init":
        spec["init"] = "fairseq"
    return spec


def make_specs(cfg: dict, records: dict = None, stuck_bits: float = None) -> list:
    """Every run's resolved config, the longest first (for --jobs): Marian, the causal LMs deepest first, BERT;
    then Llama's lr grid as RECORDS (id -> record) call for it (hf_llama.grid_of; STUCK_BITS: its ``stuck_bits``):
    each arm's grid at its first seed, then, once the grid is closed, its other seeds at its best lr."""
    m, lm, bert, g = cfg["marian"], cfg["lm"], cfg["bert"], cfg["lm"].get("lr_grid")
    lm_keys = {k: v for k, v in lm.items() if k not in LM_PLAN_KEYS}

    def lm_spec(fam, arm, seed, layers, lr=lm_keys["lr"]):  # a run of an lr grid names its lr (run_id)
        return dict(family=fam, arm=arm, seed=seed, layers=layers, **{**lm_keys, "lr": lr},
                    **({"lr_in_id": True} if lr != lm_keys["lr"] else {}))

    specs = [dict(family="marian", arm=arm, seed=1, **{k: v for k, v in m.items() if k != "arms"}) for arm in m["arms"]]
    deeper = lm.get("deeper")
    if deeper:
        specs += [lm_spec("llama", arm, seed, deeper["depth"]) for seed in deeper["seeds"] for arm in deeper["arms"]]
    for depth in sorted(lm["depths"], reverse=True):
        for seed in lm["deep_seeds"] if depth == max(lm["depths"]) else [1]:
            arms = lm["arms"] + (lm.get("control_arms", []) if seed == 1 else [])
            for fam in lm["families"]:
                extra = lm.get("gate_arms", []) + lm.get("new_arms" if seed == 1 else "llama_seed_controls", [])
                specs += [lm_spec(fam, arm, seed, depth) for arm in arms + (extra if fam == "llama" else [])]
    specs += [dict(family="bert", arm=arm, seed=1, **{k: v for k, v in bert.items() if k not in ("arms", "control_arms")})
              for arm in bert["arms"] + bert.get("control_arms", [])]
    for arm in g["arms"] if g else []:
        def at(lr, seed=g["seeds"][0], arm=arm):  # the arm's run of the grid
            return lm_spec("llama", arm, seed, g["depth"], lr)

        grid, b, closed = grid_of(g, lambda lr: (records or {}).get(run_id(at(lr))), stuck_bits)
        seeds = g["seeds"][1:] if closed and b is not None else []  # once closed, the other seeds at the best lr
        specs += [at(lr) for lr in grid] + [at(b, seed) for seed in seeds]
    unique = {}
    for spec in map(arm_settings, specs):  # the grid's runs at the mode's lr are runs of the study already
        rid = run_id(spec)
        if rid in unique and unique[rid] != spec:
            raise ValueError(f"hf: two runs named {rid} with different configs")
        unique.setdefault(rid, spec)
    return list(unique.values())


def unigram_level(cfg: dict, data: pathlib.Path):
    """The Llama runs' unigram level on the exported DATA with ``stuck_bits`` (the level less MARGIN_BITS); without
    the data, the one the committed report of this mode computed; else None."""
    lm = cfg["lm"]
    if (pathlib.Path(data) / "valid.npz").is_file():
        u = hf_lm_unigram_level(data, TGT, lm["train_lines"], lm["valid_lines"])
        return {**u, "stuck_bits": round(u["train_fit"] - MARGIN_BITS, 4)}
    committed = common.REPO / "results" / "bench" / f"{STEM}.json"
    res = json.loads(committed.read_text()) if committed.is_file() else {}
    return res.get("unigram_level") if res.get("mode") == cfg["mode"] else None


def make_runs(cfg: dict, data: pathlib.Path, records: dict = None) -> list:
    stuck = (unigram_level(cfg, data) or {}).get("stuck_bits")
    return [runlib.Run(run_id(s), {k: s[k] for k in ("family", "arm", "layers", "seed", "lr")},
                       [json.dumps(s, sort_keys=True)], str(data)) for s in make_specs(cfg, records, stuck)]


def plan(data, mode: str = "default", records: dict = None) -> list:
    """The study's runs on the exported DATA, the lr grid as RECORDS (default: the committed ones) call for it."""
    if records is None:
        records = runlib.load_records(common.REPO / "results" / "bench" / STEM / "runs")
    return make_runs(make_config(mode), pathlib.Path(data), records)


def fairseq_run(path: pathlib.Path) -> dict:
    """The quality study's fairseq run of an arm (FAIRSEQ_RUNS), as recorded."""
    rec = json.loads(path.read_text())
    test = rec.get("test") or {}
    return {"record": str(path.relative_to(common.REPO)), "test_bleu_tok": round(test["bleu_tok"], 2),
            "test_bleu_detok": round(test["bleu_detok"], 2), "signature": test.get("sacrebleu_signature"),
            "best_valid_loss": common.best(rec["valid_curve"])[1], "updates": rec["valid_curve"][-1][0],
            "epochs": rec.get("epochs"), "valid_curve": rec["valid_curve"],
            "averaged_k": (test.get("averaging") or {}).get("k"), "command": rec.get("fairseq_train_command")}


def summarise(cfg: dict, records: dict, data: pathlib.Path, n_runs: int, failed: dict) -> dict:
    rows = []
    for rec in records.values():
        b_at, b_bits = common.best(rec.get("valid_curve", []))
        row = {k: rec.get(k) for k in ("id", "family", "arm", "layers", "seed", "status", "updates", "epochs",
                                       "s_per_update", "wall_s", "parameters", "norm_modules")}
        curve = [v for _, v in rec.get("valid_curve", [])]
        rises = [b - a for a, b in zip(curve, curve[1:]) if math.isfinite(a) and math.isfinite(b)]
        row.update(lr=(rec.get("config") or {}).get("lr"), lr_in_id=bool((rec.get("config") or {}).get("lr_in_id")),
                   best_valid=b_bits, best_at=b_at, best_ppl=round(2 ** b_bits, 2) if b_bits is not None else None,
                   largest_rise=round(max(rises), 3) if rises and max(rises) > 0 else 0.0,
                   device=(rec.get("machine") or {}).get("device"), scaled=len(rec.get("tfixup_scaled") or {}))
        test = rec.get("test")
        if test:
            if test.get("bleu_detok") is None and data and (data / "meta.json").is_file():
                try:  # scored where sacremoses is (see hf_train.test_scores)
                    test = {**test, **test_scores(test["hypotheses"], data)}
                except ImportError:
                    pass
            row.update(test_bleu_tok=test["bleu_tok"], test_bleu_detok=test.get("bleu_detok"),
                       signature=test.get("sacrebleu_signature"), test_sentences=test["sentences"])
        rows.append(row)
    # against the stock model on the matched warmup, the same family, depth, seed and lr
    baselines = {(r["family"], r["layers"], r["seed"], r["lr"]): records[r["id"]] for r in rows if r["arm"] == BASELINE}
    for r in rows:
        base = baselines.get((r["family"], r["layers"], r["seed"], r["lr"]))
        b_at, b_best = common.best(base["valid_curve"]) if base else (None, None)
        u = common.reach(records[r["id"]].get("valid_curve", []), b_best) if r["status"] == "ok" else None
        r.update(baseline_best_ppl=round(2 ** b_best, 2) if b_best is not None else None, updates_to_baseline_best=u,
                 ratio_to_baseline=round(u / b_at, 3) if u is not None and b_at else None)
    rows.sort(key=lambda r: (list(FAMILIES).index(r["family"]), r["layers"], r["seed"], list(ARMS).index(r["arm"]),
                             r["lr"] or 0))
    res = {"benchmark": "hf", "mode": cfg["mode"], "command": common.command_line(), "machine": common.machine(),
           "threads": cfg.get("threads", 1), "devices": sorted({r["device"] for r in rows if r["device"]}),
           "data": common.data_description(data) if data and (data / "meta.json").is_file() else str(data),
           "config": cfg, "complete": len(records) == n_runs, "runs_recorded": len(records), "n_runs": n_runs,
           "fairseq": {a: fairseq_run(p) for a, p in FAIRSEQ_RUNS.items() if p.is_file()} if cfg["mode"] == "default"
           else {}, "rows": rows,
           "failed": {k: {"error_tail": v.get("error_tail", [])[-3:], "run_command": v.get("run_command")}
                      for k, v in failed.items() if k not in records},
           "records": records}
    res["unigram_level"] = unigram_level(cfg, data) if data else None
    res["stuck_bits"] = (res["unigram_level"] or {}).get("stuck_bits")
    res["llama_question"] = llama_question(res)
    return res


def label(r: dict) -> str:
    grid = (r.get("config") or {}).get("lr_in_id") or r.get("lr_in_id")
    extra = ", ".join(([f"lr {r['lr']:g}"] if grid else []) + ([f"seed {r['seed']}"] if r["seed"] != 1 else []))
    return ARMS[r["arm"]].label + (f" ({extra})" if extra else "")


def report(res: dict) -> str:
    cfg = res["config"]
    m, lm, bert = cfg["marian"], cfg["lm"], cfg["bert"]
    text = runlib.report_head(
        "T-Fixup in HuggingFace transformers models (Marian, GPT-2, Llama, BERT), Multi30k", res, res["n_runs"],
        (f"Runs on: {', '.join(res['devices']) or '-'}. Every model is built from its transformers config "
         f"(random init, no download) and trained by the same plain PyTorch loop: Adam (0.9, 0.98) with "
         f"decoupled weight decay {cfg['weight_decay']:g}, no clipping. Arms: **T-Fixup** = `apply_tfixup(model)` "
         f"on the stock model (its norms removed, its weights redrawn and scaled), no warmup, "
         f"lr*sqrt(P/(P+t)), P = {cfg['decay_period']}; **stock + matched warmup**: the model as transformers "
         f"builds it, linear warmup from 1e-7 over W updates onto the same curve; **stock, no warmup**: that "
         f"model on T-Fixup's schedule. GPT-2, Llama and BERT have no embedding multiplier of their own: "
         f"`apply_tfixup` gives them fairseq's sqrt(d) on the token embedding's output (the paper's model's input); "
         f"**T-Fixup without the sqrt(d) input multiplier** (`apply_tfixup(model, input_scale=False)`, the causal "
         f"LMs' first seed at each depth) is the control. Valid loss in bits per token, perplexity = 2^loss.\n\n"))
    text += ("## Translation: Marian against the fairseq plugin\n\n"
             f"MarianMTModel {m['d']}-{m['ffn']}-{m['heads']}, {m['layers']}+{m['layers']} layers, ReLU, decoder "
             f"input and output embedding shared, {m['max_tokens']} tokens per update, {m['epochs']} epochs, "
             f"dropout {m['dropout']}, label smoothing {m['label_smoothing']}, lr {m['lr']:g}, W = {m['warmup']}: the "
             f"quality study's recipe. Test: the final model, beam {m['beam']}, length penalty {m['lenpen']}, "
             f"tokenized BLEU (BPE removed) and detokenized sacreBLEU, scored by harness/score.py as the quality "
             f"study scores fairseq-generate's output. Valid loss: label-smoothed, as fairseq logs it. **T-Fixup, q/k as "
             f"fairseq draws them**: the T-Fixup run with what T-Fixup does not set drawn as fairseq draws it, the q "
             f"and k weights (transformers: N(0, 0.02); fairseq: Xavier-uniform, gain 2^-1/2, std "
             f"{(2 / (2 * m['d'])) ** 0.5 * 2 ** -0.5:.4f} at d = {m['d']}) and the q, k, v biases (transformers: 0; "
             f"fairseq: nn.Linear's uniform draw), which leaves no difference between the two initialisations that "
             f"this study knows of. **Stock + matched warmup, fairseq's initialisation**: the cross-initialisation "
             f"control, the stock Post-LN Marian drawn as fairseq draws its transformer (token embeddings N(0, "
             f"d^-1/2), q, k, v Xavier-uniform with gain 2^-1/2 and nn.Linear's biases, out_proj Xavier-uniform with a "
             f"zero bias, "
             f"fc1 and fc2 nn.Linear's own draw; transformers: N(0, 0.02) everywhere, zero biases).\n\n")
    trows = [["transformers", label(r), r["status"], r.get("test_bleu_tok"), r.get("test_bleu_detok"), r["best_valid"],
              r["updates"], r["epochs"], r["device"]] for r in res["rows"] if r["family"] == "marian"]
    fairseq = res.get("fairseq") or {}
    for arm, fs in fairseq.items():
        trows.append([f"fairseq plugin ({fs['record']})", ARMS[arm].label.replace("stock", "Post-LN"), "ok",
                      fs["test_bleu_tok"], fs["test_bleu_detok"], fs["best_valid_loss"], fs["updates"], fs["epochs"],
                      "cpu"])
    text += common.md_table(["framework", "arm", "status", "test BLEU (tok)", "test sacreBLEU", "best valid loss (bits)",
                             "updates", "epochs", "device"], trows) + "\n\n"
    for arm, fs in fairseq.items():
        hf_r = next((r for r in res["rows"] if r["family"] == "marian" and r["arm"] == arm and r["seed"] == 1
                     and r.get("test_bleu_tok") is not None), None)
        if hf_r:
            k = fs["averaged_k"]
            text += (f"{ARMS[arm].label}, transformers minus fairseq: **{hf_r['test_bleu_tok'] - fs['test_bleu_tok']:+.2f} "
                     f"BLEU** (tokenized), {hf_r['best_valid'] - fs['best_valid_loss']:+.3f} bits of best valid loss "
                     + ("(fairseq's evaluate.sh chose K = 1 on valid: its final model, as here).\n\n" if k == 1 else
                        f"(fairseq's evaluate.sh chose on valid the average of its last {k} checkpoints; here the "
                        "final model).\n\n"))
    inits = {r["arm"]: r for r in res["rows"] if r["family"] == "marian" and r["arm"] in (BASELINE, "stock_fsinit")
             and r.get("test_bleu_tok") is not None}
    if len(inits) == 2:
        a, b = inits["stock_fsinit"], inits[BASELINE]
        bleu, bits = a["test_bleu_tok"] - b["test_bleu_tok"], a["best_valid"] - b["best_valid"]
        text += (f"The stock Marian with fairseq's initialisation minus with transformers': **{bleu:+.2f} BLEU** "
                 f"(tokenized), {bits:+.3f} bits of best valid loss.\n\n")
    sigs = sorted({r["signature"] for r in res["rows"] if r.get("signature")}
                  | {fs["signature"] for fs in fairseq.values()})
    if sigs:
        text += "sacreBLEU signature: " + ", ".join(f"`{s}`" for s in sigs) + "\n\n"
    text += ("## Causal language models: GPT-2 and Llama\n\n"
             f"{lm['d']}-{lm['ffn']}-{lm['heads']}, {' and '.join(map(str, lm['depths']))} layers"
             + (f" (Llama also {lm['deeper']['depth']})" if lm.get("deeper") else "") + ", tied embeddings; "
             f"GPT-2: learned positions, GELU MLP, dropout {lm['dropout']}; Llama: RMSNorm, SwiGLU MLP (intermediate "
             f"{lm['ffn']}), rotary positions, {lm['heads'] // 2} KV heads, no dropout. Multi30k's English side in "
             f"blocks of {lm['tokens_per_sample']} tokens, {lm['max_tokens']} tokens per update, {lm['updates']} "
             f"updates, lr {lm['lr']:g}, W = {lm['warmup']}; valid every {lm['valid_every']} updates on every valid "
             f"token. Updates to the baseline's best: the first update at which an arm's valid loss is at or below the "
             f"best of the stock model on the matched warmup (the same seed); ratio: that over the baseline's own. Largest "
             f"rise: the most the valid loss went up from one validation to the next (0: it never rose). Llama's "
             f"controls for its gated MLP, down(silu(gate x) * up x), which is of degree 2 in its input where the "
             f"paper's blocks are of degree 1 (every seed at each depth): **the RMSNorm before each gated MLP kept** "
             f"(T-Fixup otherwise as above), and **the MLP without its gate** (each MLP computes down(silu(up x)), "
             f"gate_proj unused, T-Fixup as above): diagnoses, not baselines. Llama's arms of the LLaMA question "
             f"(below) at the study's lr are in this table too; its lr grid's other runs are there.\n\n")
    tail = ["at update", "updates to the baseline's best", "ratio", "largest rise of valid loss (bits)"]

    def cells(r):  # from the arm to the largest rise
        reached = r["updates_to_baseline_best"]
        reached = "not reached" if reached is None and r["baseline_best_ppl"] is not None else reached
        return [label(r), r["status"], r["best_ppl"], r["best_at"], reached, r["ratio_to_baseline"], r["largest_rise"]]

    text += common.md_table(["model", "layers", "arm", "status", "best valid ppl", *tail],
                            [[FAMILIES[r["family"]].split(" (")[0], r["layers"], *cells(r)]
                             for r in res["rows"] if r["family"] in ("gpt2", "llama")]) + "\n\n"
    text += llama_report(res)
    text += ("## Masked language model: BERT\n\n"
             f"BertForMaskedLM {bert['d']}-{bert['ffn']}-{bert['heads']}, {bert['layers']} layers, dropout "
             f"{bert['dropout']}, on Multi30k's English sentences (<s> as [CLS], at most {bert['max_len']} tokens), "
             f"{bert['batch']} sentences per update, {bert['updates']} updates, lr {bert['lr']:g}, W = {bert['warmup']}; "
             f"{bert['mask_prob']:.0%} of the tokens are targets (80 % [MASK], 10 % random, 10 % kept), the same "
             "masks of valid for every run; perplexity of the masked valid tokens. The head (dense, GELU, "
             "LayerNorm, then the tied output projection) has no counterpart in the paper's model; **the masked-LM "
             "head's LayerNorm kept** is T-Fixup otherwise as above: a diagnosis, not a baseline.\n\n")
    text += common.md_table(["arm", "status", "best masked-token ppl", *tail],
                            [cells(r) for r in res["rows"] if r["family"] == "bert"]) + "\n\n"
    text += "## Every run\n\n" + common.md_table(
        ["run", "status", "device", "parameters", "norm modules left", "weights T-Fixup scaled", "updates",
         "s/update", "train wall s"],
        [[r["id"], r["status"], r["device"], r["parameters"], r["norm_modules"], r["scaled"] or None, r["updates"],
          r["s_per_update"], r["wall_s"]] for r in res["rows"]]) + "\n"
    if res["failed"]:
        text += "\n**Failed runs** (no result; the next start runs them again):\n\n" + "".join(
            f"- {k}: {' | '.join(v['error_tail'])}\n" for k, v in sorted(res["failed"].items()))
    return text


def plot(res: dict, path: pathlib.Path) -> None:
    plt = common.pyplot()

    panels = sorted({(r["family"], r["layers"]) for r in res["rows"]},
                    key=lambda p: (list(FAMILIES).index(p[0]), p[1]))
    q = res.get("llama_question") or {}
    grid_panels = 2 if any(m["seeds"] for m in q.values()) else 0  # each method at its best lr; ppl against lr
    n = len(panels) + grid_panels
    rows, cols = max(1, math.ceil(n / 3)), 3
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.9 * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    for ax, (fam, layers) in zip(axes.flat, panels):
        for r in res["rows"]:
            rec = res["records"][r["id"]]
            if (r["family"], r["layers"]) != (fam, layers) or not rec.get("valid_curve") or r.get("lr_in_id"):
                continue
            u, v = zip(*rec["valid_curve"])
            y = v if fam == "marian" else [min(2 ** x, 1e5) for x in v]
            ax.plot(u, y, ls="-" if r["seed"] == 1 else ":", lw=1.3, label=label(r), color=ARMS[r["arm"]].color)
        for arm, fs in (res.get("fairseq") or {}).items() if fam == "marian" else ():
            ax.plot(*zip(*fs["valid_curve"]), ls="--", lw=1, label=f"fairseq, {ARMS[arm].label.replace('stock', 'Post-LN')}",
                    color=ARMS[arm].color)
        if fam != "marian":
            ax.set_yscale("log")
        common.finish_axes(ax, "updates", "valid loss (bits, label-smoothed)" if fam == "marian" else
                           "masked-token valid perplexity" if fam == "bert" else "valid perplexity",
                           f"{FAMILIES[fam]}, {layers}{'+' + str(layers) if fam == 'marian' else ''} layers",
                           grid={"which": "both"}, legend={"fontsize": 7})
    if grid_panels:
        plot_llama_question(res, q, axes.flat[len(panels)], axes.flat[len(panels) + 1])
    common.save_titled_figure(path, fig, "T-Fixup in transformers models on Multi30k: valid loss against updates")


def parser():
    p = runlib.study_parser(__doc__.split("\n\n")[0], "hf.{json,md,png}, hf/runs/")
    actions = {a.dest: a for a in p._actions}
    actions["data"].help = ("the exported data folder (python -m harness.bench.hf export --out DIR); "
                            "default work/hf-data")
    actions["data_root"].help = argparse.SUPPRESS
    actions["out"].required = False  # not with --estimate
    p.epilog = ("first, where fairseq is: python -m harness.bench.hf export --out DIR (the data folder --data "
                "reads; export --help). 'python -m harness.bench.hf one' runs a single run (the study starts these).")
    p.add_argument("--device", default="cpu", help="torch device of every run: cpu (default) or cuda")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time, each its own process (default 1)")
    p.add_argument("--in-process", action="store_true",
                   help="run each run in this process, one at a time (tests, debugging); default: a process each")
    p.add_argument("--estimate", action="store_true",
                   help="time a few updates of each run type on this CPU and print the study's CPU time; run nothing")
    p.add_argument("--select", nargs="+", metavar="GLOB",
                   help="run just the planned runs whose ids match one of these shell patterns (e.g. 'llama-L24-*-s2': "
                        "the second seeds at each method's best lr, once its grid is in), round after round while "
                        "the lr grid grows")
    p.add_argument("--rounds", type=int, default=8, help="rounds of growing the lr grid at most (default 8)")
    return p


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["export"]:
        return hf_train.export_main(argv[1:])
    if argv[:1] == ["one"]:
        return hf_train.one_main(argv[1:])
    p = parser()
    args = p.parse_args(argv)
    if not args.out and not args.estimate:
        p.error("the following arguments are required: --out")
    data = check_data(pathlib.Path(args.data or "work/hf-data"))
    cfg = {**make_config(args.mode), "threads": args.threads, "device": args.device}
    if args.estimate:
        return hf_train.estimate_main(make_specs(cfg), data, run_id, args.jobs)
    out = pathlib.Path(args.out)
    failed_dir, store = out / (STEM + args.tag) / "failed", out / (STEM + args.tag) / "runs"
    failed_dir.mkdir(parents=True, exist_ok=True)
    for round_ in range(max(1, args.rounds)):
        all_runs = make_runs(cfg, data, runlib.load_records(store))
        only = args.only
        if args.select:
            only = [r.id for r in all_runs if any(fnmatch.fnmatchcase(r.id, g) for g in args.select)]
            if not only:
                common.log(f"--select {' '.join(args.select)}: no planned run matches (yet); nothing to run")
                break
        runlib.run_study(STEM + args.tag, out, all_runs,
                         lambda recs, n=len(all_runs): summarise(cfg, recs, data, n, runlib.load_records(failed_dir)),
                         plot, report, "valid loss against updates, every run", 1 if args.in_process else args.jobs,
                         execute=lambda r, work: hf_train.execute(r, work, failed_dir, args.device, args.threads,
                                                                  args.in_process),
                         report_only=args.report_only, only=only, quiet=round_ > 0)
        grown = {r.id for r in make_runs(cfg, data, runlib.load_records(store))} - {r.id for r in all_runs}
        if args.report_only or args.only or not grown:
            break
        common.log(f"round {round_ + 1}: the lr grid grows by {len(grown)} runs: {' '.join(sorted(grown))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
