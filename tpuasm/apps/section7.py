"""Section 7 of the paper (Figure 11 and the TPU' design point), claim by claim.

Each claim is the paper's sentence (quoted or closely paraphrased), its figure, and a rule
that says whether the emulator's numbers agree.  The words the paper uses are turned into
rules once, here, and the same rule is applied to every app:

- "about X"        within 10 % of X (the issue's aim for "about 3x")
- "little"         below 1.2x
- "almost no"      within 5 % of 1.0x
- "slightly degrades"  a mean between 0.9x and 1.0x
- "doesn't help"   no app above 1.00x (two decimals, as printed)
- "look similar"   at every point the geometric and the weighted mean on the same side of
                   1.0x and within the ratio the paper's own TPU' means show (GM 2.6 against
                   WM 3.9: a GM at least 2/3 of the WM, and at most 3/2 of it)

`evaluate(rel, weighted, geometric, example)` returns one row per claim with our figure
and the verdict; figure11.py prints them and docs/sweep.md explains each miss with numbers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .paper import APPS

MLPS_LSTMS = ("MLP0", "MLP1", "LSTM0", "LSTM1")
CNNS = ("CNN0", "CNN1")

# TPU' (section 7): GDDR5 Weight Memory "shifting its roofline ridge point from 1350 to
# 250" (bandwidth x 1350 / 250 = 5.4, "more than a factor of five"), and the clock
# "increased by 50 %" to 1050 MHz.  The factors are the paper's, not fitted.
TPU_PRIME = {"memory": 1350 / 250, "clock": 1050 / 700}
TPU_PRIME_TEXT = {"memory": "5.4", "clock": "1.5"}      # how the sweep writes the factors


@dataclass(frozen=True)
class Verdict:
    key: str
    claim: str          # the paper's words
    paper: str          # the paper's figure
    ours: str           # the emulator's
    match: bool | None  # None: nothing to compare (a point did not run)


def _at(line, x):
    for xx, y in line or []:
        if abs(xx - x) < 1e-9:
            return y
    return None


def _about(y, target, tol=0.10):
    return y is not None and abs(y / target - 1) <= tol


def _per_app(rel, knob, x, apps):
    vals = {a: _at(rel.get((a, knob)), x) for a in apps}
    return {a: v for a, v in vals.items() if v is not None}


def _fmt_apps(vals: dict) -> str:
    return ", ".join(f"{a} {v:.2f}" for a, v in vals.items())


def _all(vals: dict, rule, apps) -> bool | None:
    if len(vals) < len(apps):
        return None
    return all(rule(v) for v in vals.values())


def evaluate(rel: dict, weighted: dict, geometric: dict, example: dict | None = None,
             prime: dict | None = None, ub_mib: dict | None = None) -> list[Verdict]:
    """rel / weighted / geometric: tpuasm.sweep.report's relative() and means of a Figure
    11 sweep; example: {(program, array): {"steps", "us"}} (the LSTM1 600 x 600 layer);
    prime: tpu_prime()'s {"clock"|"memory"|"both": {"weighted", "geometric", "apps"}};
    ub_mib: {app: MiB of the Unified Buffer its program touches} (Table 8)."""
    out: list[Verdict] = []

    def mean_row(key, claim, paper, knob, x, rule):
        w, g = _at(weighted.get(knob), x), _at(geometric.get(knob), x)
        ours = "" if w is None else f"weighted {w:.2f}x, geometric {g:.2f}x"
        out.append(Verdict(key, claim, paper, ours, None if w is None else rule(w)))

    def apps_row(key, claim, paper, knob, x, apps, rule):
        vals = _per_app(rel, knob, x, apps)
        out.append(Verdict(key, claim, paper, _fmt_apps(vals), _all(vals, rule, apps)))

    mean_row("memory-mean", "increasing memory bandwidth has the biggest impact: "
             "performance improves 3X on average when memory increases 4X",
             "3x (weighted mean)", "memory", 4, lambda y: _about(y, 3.0))
    apps_row("memory-mlp-lstm", "MLPs and LSTMs improve 3X with 4X memory bandwidth "
             "(Figure 11's caption)", "3x each", "memory", 4, MLPS_LSTMS,
             lambda y: _about(y, 3.0))
    apps_row("memory-cnn", "CNNs get little benefit from faster memory (caption)",
             "little (< 1.2x)", "memory", 4, CNNS, lambda y: y < 1.2)
    for knob in ("clock", "clock+"):
        mean_row(f"{knob}-mean", "clock rate has little benefit on average with or without "
                 f"more accumulators ({knob} x4)", "little (< 1.2x)", knob, 4,
                 lambda y: y < 1.2)
    for knob in ("clock", "clock+"):
        apps_row(f"{knob}-mlp-lstm", "increasing the clock rate by 4X has almost no impact "
                 f"on MLPs and LSTMs ({knob} x4)", "almost none (1.0x +- 5 %)", knob, 4,
                 MLPS_LSTMS, lambda y: _about(y, 1.0, 0.05))
    for knob in ("clock", "clock+"):
        apps_row(f"{knob}-cnn", "... but improves performance of CNNs by about 2X "
                 f"({knob} x4)", "about 2x", knob, 4, CNNS, lambda y: _about(y, 2.0))
    for knob in ("matrix", "matrix+"):
        mean_row(f"{knob}-mean", "the average performance slightly degrades when the "
                 "matrix unit expands from 256x256 to 512x512, whether or not they get more "
                 f"accumulators ({knob} x2)", "slightly below 1x (0.9-1.0)", knob, 2,
                 lambda y: 0.9 <= y < 1.0)
    for knob in ("matrix", "matrix+"):
        apps_row(f"{knob}-apps", "... for all apps; a bigger matrix multiply unit doesn't "
                 f"help any DNN ({knob} x2)", "<= 1.00x each", knob, 2, APPS,
                 lambda y: round(y, 2) <= 1.0)
    out.append(_similar_means(weighted, geometric))
    for (program, n), r in sorted((example or {}).items()):
        paper_steps, paper_us = (9, 18.0) if n == 256 else (4, 32.0)
        out.append(Verdict(
            f"lstm1-{program}-{n}", f"LSTM1's 600x600 matrix on a {n}x{n} unit ({program})",
            f"{paper_steps} steps, {paper_us:.0f} us", f"{r['steps']} steps, {r['us']:.1f} us",
            r["steps"] == paper_steps and _about(r["us"], paper_us)))
    if prime:
        out += _prime_rows(prime)
    if ub_mib:
        from .paper import TABLE8_SUFFICIENT_MIB, TABLE8_UB_MIB
        out.append(Verdict(
            "table8-ub", "Table 8: the most of the 24 MiB Unified Buffer each app uses; "
            f"\"a {TABLE8_SUFFICIENT_MIB:g} MiB Unified Buffer is sufficient for these apps\"",
            ", ".join(f"{a} {TABLE8_UB_MIB[a]:g}" for a in ub_mib if a in TABLE8_UB_MIB)
            + f" MiB (all <= {TABLE8_SUFFICIENT_MIB:g})",
            ", ".join(f"{a} {v:.1f}" for a, v in ub_mib.items()) + " MiB",
            all(v <= TABLE8_SUFFICIENT_MIB for v in ub_mib.values())))
    return out


def _similar_means(weighted: dict, geometric: dict) -> Verdict:
    claim = "It plots weighted means, but the geometric means look similar"
    paper = "similar (the paper's TPU': GM 2.6, WM 3.9)"
    points = []
    for knob, line in weighted.items():
        for x, w in line:
            g = _at(geometric.get(knob), x)
            if g is not None:
                points.append((abs(math.log(g / w)), knob, x, w, g))
    if not points:
        return Verdict("gm-similar", claim, paper, "", None)
    limit = math.log(3.9 / 2.6)

    def similar(w, g):
        same_side = (w - 1) * (g - 1) >= 0 or max(abs(w - 1), abs(g - 1)) <= 0.05
        return same_side and abs(math.log(g / w)) <= limit + 1e-9
    ok = sum(1 for _, _, _, w, g in points if similar(w, g))
    _, knob, x, w, g = max(points)
    return Verdict("gm-similar", claim, paper,
                   f"{ok} of {len(points)} points similar; farthest apart {knob} x{x:g}: "
                   f"GM {g:.2f} vs WM {w:.2f}", ok == len(points))


def _prime_rows(prime: dict) -> list[Verdict]:
    rows = []
    c, m, b = prime.get("clock"), prime.get("memory"), prime.get("both")
    if c:
        rows.append(Verdict(
            "tpu'-clock", "TPU': increasing clock rate to 1050 MHz but not helping memory "
            "makes almost no change", "almost none (1.0x +- 5 %)",
            f"weighted {c['weighted']:.2f}x, geometric {c['geometric']:.2f}x",
            _about(c["weighted"], 1.0, 0.05) and _about(c["geometric"], 1.0, 0.05)))
    if m:
        rows.append(Verdict(
            "tpu'-memory", "TPU': clock at 700 MHz, GDDR5 Weight Memory (ridge 1350 -> 250, "
            "bandwidth x5.4): the geometric mean jumps to 2.6 and the weighted mean to 3.9",
            "GM 2.6, WM 3.9", f"GM {m['geometric']:.2f}, WM {m['weighted']:.2f}",
            _about(m["geometric"], 2.6) and _about(m["weighted"], 3.9)))
    if b and m:
        # the sentence is about the change from GDDR5 alone: the GM rises (2.6 -> 2.9,
        # +12 %), the WM does not (within 5 %); the absolute level is the row above's
        gm_rise, wm_rise = b["geometric"] / m["geometric"], b["weighted"] / m["weighted"]
        rows.append(Verdict(
            "tpu'-both", "TPU': doing both (GDDR5 and 1050 MHz) raises the geometric mean "
            "(2.9) but not the weighted mean", "GM 2.6 -> 2.9 (+12 %), WM stays 3.9",
            f"GM {m['geometric']:.2f} -> {b['geometric']:.2f} ({gm_rise - 1:+.0%}), "
            f"WM {m['weighted']:.2f} -> {b['weighted']:.2f} ({wm_rise - 1:+.0%})",
            gm_rise >= 1.05 and _about(wm_rise, 1.0, 0.05)))
    return rows


def claims_text(verdicts: list[Verdict]) -> str:
    lines = ["| claim (section 7) | paper | emulator | match |", "|---|---|---|---|"]
    for v in verdicts:
        mark = {True: "yes", False: "**no**", None: "(not run)"}[v.match]
        lines.append(f"| {v.claim} | {v.paper} | {v.ours} | {mark} |")
    return "\n".join(lines)


def tpu_prime(rows: list[dict], knobs) -> dict:
    """The TPU' points of a figure-11 CSV: {"clock" | "memory" | "both": {"weighted",
    "geometric", "apps": {app: relative performance}}} (apps missing a point are left out
    of that point's means)."""
    import math

    from .paper import WORKLOAD_SHARE
    base, points = {}, {"clock": {}, "memory": {}, "both": {}}
    for r in rows:
        if r.get("status") != "ok" or not r.get("time_us"):
            continue
        setting = {k: r.get(k) for k in knobs}
        others = all(v == "1" for k, v in setting.items() if k not in TPU_PRIME)
        if not others:
            continue
        c, m = setting.get("clock"), setting.get("memory")
        which = {("1", "1"): "base", (TPU_PRIME_TEXT["clock"], "1"): "clock",
                 ("1", TPU_PRIME_TEXT["memory"]): "memory",
                 (TPU_PRIME_TEXT["clock"], TPU_PRIME_TEXT["memory"]): "both"}.get((c, m))
        if which == "base":
            base.setdefault(r["target"], float(r["time_us"]))
        elif which:
            points[which][r["target"]] = float(r["time_us"])
    out = {}
    for which, times in points.items():
        rel = {a: base[a] / t for a, t in times.items() if a in base}
        if not rel:
            continue
        share = {a: WORKLOAD_SHARE.get(a, 1.0) for a in rel}
        out[which] = {
            "apps": rel,
            "weighted": sum(share[a] * y for a, y in rel.items()) / sum(share.values()),
            "geometric": math.exp(sum(math.log(y) for y in rel.values()) / len(rel))}
    return out


def is_tpu_prime_row(row: dict, knobs) -> bool:
    """A TPU' point that is not also a Figure 11 point (clock x1.5, memory x5.4, or both)."""
    return any(row.get(k) == TPU_PRIME_TEXT[k] for k in TPU_PRIME if k in knobs)
