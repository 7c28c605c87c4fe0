"""The LLaMA question of the HuggingFace study (harness/bench/hf.py): each method on an lr grid on the 24-layer Llama,
a second seed at its best lr; its table (README's generated block too), verdict, report section and figure panels."""

import statistics

from harness.bench import common
from harness.bench.hf_train import ARMS, BASELINE, DERF_ALPHA0, DERF_SHIFT0, DYT_ALPHA0, NORM_FREE


MARGIN_BITS = 1.0  # the other studies' --margin: a run trains once its best is this far below the unigram level


def trains(rec: dict, stuck_bits) -> bool:
    """RECORD finished without diverging and its best valid loss is below STUCK_BITS (None: any finite best)."""
    best = common.best((rec or {}).get("valid_curve") or [])[1] if (rec or {}).get("status") == "ok" else None
    return best is not None and (stuck_bits is None or best < stuck_bits)


def grid_of(g: dict, record_at, stuck_bits=None) -> tuple:
    """(grid, best lr, closed): an arm's lr grid as RECORD_AT(lr) (the first seed's record, or None) makes it: the
    starting lrs, doubled while the best of the runs that train is the largest (up to max_lr), halved while it is
    the smallest or none trains (down to min_lr); closed once every run is in and the best is inside or at a bound."""
    grid = sorted(g["lrs"])
    while True:
        got = {lr: record_at(lr) for lr in grid}
        if not all(got.values()):
            return grid, None, False
        b = common.best_lr({lr: r for lr, r in got.items() if trains(r, stuck_bits)})
        if (b is None or b == grid[0]) and grid[0] / 2 >= g["min_lr"] * (1 - 1e-9):
            grid.insert(0, grid[0] / 2)
        elif b is not None and b == grid[-1] and grid[-1] * 2 <= g["max_lr"] * (1 + 1e-9):
            grid.append(grid[-1] * 2)
        else:
            return grid, b, True


def llama_question(res: dict) -> dict:
    """Llama's lr grid (config lm.lr_grid) as recorded, per method: its grid (the first seed's cells), best lr,
    whether closed and done, every seed at the best lr against the warmup baseline at ITS best lr (the same seed:
    updates to its best, their ratio to its own), norms left, warmup, extra parameters. {} without a grid."""
    g = res["config"]["lm"].get("lr_grid")
    if not g:
        return {}
    rows = [r for r in res["rows"] if r["family"] == "llama" and r["layers"] == g["depth"]]
    recs, stuck, out, at_best = res["records"], res.get("stuck_bits"), {}, {}

    def status(r):  # a row's status, "stuck" where it finished within a bit of the unigram level
        return "stuck" if r["status"] == "ok" and not trains(recs.get(r["id"]), stuck) else r["status"]

    for arm in g["arms"]:
        mine = [r for r in rows if r["arm"] == arm]
        first = {r["lr"]: r for r in mine if r["seed"] == g["seeds"][0]}
        grid, b, closed = grid_of(g, lambda lr: recs.get(first[lr]["id"]) if lr in first else None, stuck)
        if not closed:  # the best so far, said to be provisional ("grid open")
            b = common.best_lr({lr: recs.get(r["id"]) for lr, r in first.items() if trains(recs.get(r["id"]), stuck)})
        at_best[arm] = sorted((r for r in mine if r["lr"] == b), key=lambda r: r["seed"])
        cells = [{"lr": lr, "id": None, "status": None, "best_ppl": None} if lr not in first else
                 {"lr": lr, "id": first[lr]["id"], "best_ppl": first[lr]["best_ppl"], "status": status(first[lr])}
                 for lr in grid]
        # done: the grid closed, and every seed ran at its best lr (nothing to run where no lr trained)
        done = closed and (b is None or {r["seed"] for r in at_best[arm] if recs.get(r["id"])} >= set(g["seeds"]))
        out[arm] = {"label": ARMS[arm].label, "best_lr": b, "closed": closed, "seeds": [], "grid": cells, "done": done}
    base = {r["seed"]: r for r in at_best.get(BASELINE, [])}
    for arm, m in out.items():
        for r in at_best[arm]:
            b_row = base.get(r["seed"])
            b_at, b_best = (b_row["best_at"], b_row["best_valid"]) if b_row and b_row["status"] == "ok" else (None, None)
            u = common.reach(recs[r["id"]].get("valid_curve", []), b_best) if r["status"] == "ok" else None
            m["seeds"].append({"id": r["id"], "seed": r["seed"], "status": r["status"], "best_ppl": r["best_ppl"],
                               "stuck": status(r) == "stuck", "updates": r["updates"], "to_baseline_best": u,
                               "ratio": round(u / b_at, 3) if u is not None and b_at else None,
                               "norm_modules": r["norm_modules"], "parameters": r["parameters"]})
        # norms and parameters do not depend on the lr: any run of the arm when none is at a best lr
        stock, a = next(iter(base.values()), None), ARMS[arm]
        mine = at_best[arm] or [r for r in rows if r["arm"] == arm]
        m.update(norms="removed" if a.tfixup else a.norms, norm_modules=mine[0]["norm_modules"] if mine else None,
                 warmup=a.schedule == "matched", optimizer=a.optimizer,
                 extra_parameters=mine[0]["parameters"] - stock["parameters"]
                 if mine and stock and mine[0].get("parameters") is not None else None)
    return out


def per_seed(m: dict, key: str, fmt) -> str:
    """KEY of each seed at a method's best lr, formatted by FMT, "/" between seeds (the table's cells)."""
    vals = [fmt(s) if s["status"] == "ok" and s.get(key) is not None else
            ("diverged" if s["status"] == "nan" else "not reached" if s["status"] == "ok" else s["status"])
            for s in m.get("seeds", [])]
    return " / ".join(vals) or "-"


def ppl_per_seed(m: dict) -> str:
    """Best valid perplexity of each seed at the best lr, "(stuck)" after one within a bit of the unigram level."""
    return per_seed(m, "best_ppl", lambda s: f"{s['best_ppl']:.1f}" + " (stuck)" * bool(s.get("stuck")))


def llama_verdict(q: dict) -> str:
    """One sentence from the records: the method of the lowest best valid perplexity at its best lr (mean over
    its seeds there), the warmup baseline, and how every other method did at its best lr (each seed)."""
    done = {a: m for a, m in q.items() if m.get("done")}
    if len(done) < len(q):
        return (f"{len(done)} of {len(q)} methods have a closed lr grid and every seed at its best lr so far; "
                "the verdict waits for the rest.")
    ok = {a: statistics.mean(s["best_ppl"] for s in m["seeds"] if s["status"] == "ok")
          for a, m in done.items() if any(s["status"] == "ok" for s in m["seeds"])}
    top = min(ok, key=ok.get)

    def outcome(arm):  # a method at its best lr, every seed
        m = q[arm]
        if not m["best_lr"]:
            return "diverges at every lr of its grid"
        said = ("trains" if all(s["status"] == "ok" and not s.get("stuck") for s in m["seeds"]) else
                "diverges on a seed" if any(s["status"] == "nan" for s in m["seeds"]) else
                "stays at the unigram level on a seed")
        return f"{said} at its best lr ({m['best_lr']:g}: {ppl_per_seed(m)})"

    free = [f"{q[a]['label']}: {outcome(a)}" for a in NORM_FREE if a in q]
    others = [f"{q[a]['label']}: {outcome(a)}" for a in q
              if a not in (*NORM_FREE, top, BASELINE) and q[a]["best_lr"] is not None]
    never = [q[a]["label"] for a in q if q[a]["best_lr"] is None and a not in NORM_FREE]
    base = (f" The warmup baseline, {q[BASELINE]['label']}: {ppl_per_seed(q[BASELINE])} at lr "
            f"{q[BASELINE]['best_lr']:g}." if BASELINE in ok and top != BASELINE else "")
    return (f"Lowest best valid perplexity at its own best lr (the mean of its seeds): {q[top]['label']} "
            f"({ppl_per_seed(q[top])} at lr {q[top]['best_lr']:g}).{base}"
            + (" Norm-free T-Fixup: " + "; ".join(free) + "." if free else "")
            + (" The other methods: " + "; ".join(others) + "." if others else "")
            + (" Trains at no lr of its grid: " + "; ".join(never) + "." if never else ""))


def llama_table(q: dict) -> list:
    """Rows of the table a LLaMA user reads (llama_question's): method, best lr, best valid perplexity per seed,
    updates to the warmup baseline's best (ratio), norms left, warmup, extra parameters."""
    rows = []
    for arm, m in q.items():
        open_ = "" if m["closed"] else " (grid open)"
        if m["best_lr"] is not None:
            lr = f"{m['best_lr']:g}{open_}"
        else:  # no run trained: where they diverged or stayed at the unigram level (closed: down to its bound)
            at = {k: ", ".join(f"{c['lr']:g}" for c in m.get("grid", []) if c["status"] == s)
                  for k, s in (("diverged", "nan"), ("stuck at the unigram level", "stuck"))}
            said = "; ".join(f"{k} at {v}" for k, v in at.items() if v)
            lr = f"{'none' if m['closed'] else 'none so far'}: {said}{open_}" if said else "-"
        norms = {"kept": "every RMSNorm", "removed": "none", "dyt": "none (a DyT in each place)",
                 "derf": "none (a Derf in each place)"}[m["norms"]]
        if arm == "tfixup_mlpnorm":
            norms = "the RMSNorm before each gated MLP"
        if m.get("norm_modules") is not None:
            norms += f": {m['norm_modules']}"
        warm = "yes (matched)" if m["warmup"] else ("no (GI-Adam)" if m["optimizer"] == "giadam" else "no")
        rows.append([m["label"], lr, ppl_per_seed(m),
                     per_seed(m, "to_baseline_best", lambda s: f"{s['to_baseline_best']} ({s['ratio']:.2f}x)"),
                     norms, warm, m["extra_parameters"] if m["extra_parameters"] is not None else "-"])
    return rows


LLAMA_COLUMNS = ["method", "best lr", "best valid ppl (seed 1 / 2)", "updates to the warmup baseline's best (ratio)",
                 "norms left", "warmup", "extra parameters"]


def llama_report(res: dict) -> str:
    q = res.get("llama_question") or {}
    if not q:
        return ""
    g = res["config"]["lm"]["lr_grid"]
    grid_lrs = sorted({c["lr"] for m in q.values() for c in m["grid"]})
    u = res.get("unigram_level")
    level = (f" ({u['train_fit']:g} bits, perplexity {u['train_fit_ppl']:g}: word frequencies fit on the training "
             f"text, harness/bench/unigram.py)" if u else "")
    text = (f"## The LLaMA question: each method at its own best lr, {g['depth']}-layer Llama\n\n"
            f"Each method's lr grid starts at {', '.join(f'{x:g}' for x in g['lrs'])} and grows (doubled up to "
            f"{g['max_lr']:g}, halved down to {g['min_lr']:g}) while its best lr, that of the lowest best valid loss "
            f"of the first seed among runs that train, is at its edge (or none trains); a second seed runs at the "
            f"best lr. A run trains when it did not diverge and its best valid loss is at least {MARGIN_BITS:g} bit "
            f"below the unigram level{level}; stuck otherwise. "
            f"The warmup baseline is the stock model on the matched warmup at its own best lr. **DyT** / **Derf**: "
            f"every RMSNorm replaced by gamma * tanh(alpha x) + beta / gamma * erf(alpha x + s) + beta, a learned "
            f"scalar on the token embedding's output from sqrt(d); DyT's alpha0 {DYT_ALPHA0['attention']:g} before "
            f"attention, {DYT_ALPHA0['mlp']:g} before the MLP, {DYT_ALPHA0['final']:g} for the final one (the DyT "
            f"LLaMA recipe's values at its narrowest width, 4096; this width is below its table), Derf's "
            f"{DERF_ALPHA0:g} everywhere, s0 = {DERF_SHIFT0:g}; both on the stock recipe's matched warmup. **GI-Adam**: "
            f"Adam's second moment starts at the first gradient squared (bias corrections kept), no warmup. The "
            f"norm-free T-Fixup candidates (docs/derivation.md, section 7.7): `apply_tfixup(model, "
            f"gated_mlp=\"sigmoid\")` (the gate bounded), `gated_mlp=\"scaled\"` (each gated MLP's output times "
            f"1/N), and plain T-Fixup with GI-Adam.\n\n")
    text += common.md_table(LLAMA_COLUMNS, llama_table(q)) + "\n\n" + llama_verdict(q) + "\n\n"
    text += ("Best valid perplexity of the first seed at each lr of the grid (- not run; diverged: NaN; stuck: at the "
             "unigram level):\n\n")

    def cell(m, x):
        c = next((c for c in m["grid"] if c["lr"] == x and c["status"]), None)
        return ("-" if c is None else "diverged" if c["status"] == "nan" else
                f"{c['best_ppl']:.3g} (stuck)" if c["status"] == "stuck" else c["best_ppl"])

    text += common.md_table(["method"] + [f"{x:g}" for x in grid_lrs],
                            [[m["label"]] + [cell(m, x) for x in grid_lrs] for m in q.values()]) + "\n\n"
    return text


def plot_llama_question(res: dict, q: dict, curves, by_lr) -> None:
    """Two panels: each method's valid perplexity at its best lr (every seed), the first seed's best against lr."""
    depth = res["config"]["lm"]["lr_grid"]["depth"]
    for arm, m in q.items():
        for r in m["seeds"]:
            rec = res["records"][r["id"]]
            if rec.get("valid_curve"):
                u, v = zip(*rec["valid_curve"])
                curves.plot(u, [min(2 ** x, 1e5) for x in v], ls="-" if r["seed"] == 1 else ":", lw=1.3,
                            label=f"{m['label']}, lr {m['best_lr']:g}" if r["seed"] == 1 else None, color=ARMS[arm].color)
        pts = sorted((c["lr"], c["best_ppl"]) for c in m["grid"] if c["status"] in ("ok", "stuck") and c["best_ppl"])
        if pts:
            by_lr.plot(*zip(*pts), marker="o", lw=1.3, label=m["label"], color=ARMS[arm].color)
        nan = [c["lr"] for c in m["grid"] if c["status"] == "nan"]
        if nan:
            top = max([p for _, p in pts], default=100)
            by_lr.plot(nan, [top] * len(nan), ls="none", marker="x", ms=7, color=ARMS[arm].color)
    for ax, x, title in ((curves, "updates", f"Llama, {depth} layers: each method at its best lr (dotted: seed 2)"),
                         (by_lr, "peak lr", f"Llama, {depth} layers: best valid perplexity against lr (x: diverged)")):
        ax.set_yscale("log")
        common.finish_axes(ax, x, "valid perplexity", title, grid={"which": "both"}, legend={"fontsize": 6})
    by_lr.set_xscale("log")
