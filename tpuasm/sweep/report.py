"""Sweep results for people: the CSV stream, a rich table, terminal and image plots.

Performance relative to the baseline = baseline time / point time, per target; the
baseline of a target is its point with every swept parameter at "1" (knobs) or "base"
(fields, in `--each` grids), else its first point.  The weighted mean weights each app by
its share of the paper's workload when every target is one of the six apps, else equally.
"""
from __future__ import annotations

import csv
from pathlib import Path

from .point import RESULT_COLUMNS


class CsvStream:
    """Rows written and flushed as they arrive (bounded memory for any sweep size), into a
    temporary file beside `path` (tpuasm.files.StagedFile) that replaces `path` only at
    `close()`: a sweep that fails to start, is interrupted or hits a full disk leaves an
    existing `path` as it was (the finished points are in the cache).  `discard()` drops
    the rows.  Write errors are OutputFileError."""

    def __init__(self, path: Path, axes: list[str]):
        from ..files import StagedFile
        self.columns = ["target", *axes, *RESULT_COLUMNS, "cached"]
        self.file = StagedFile(path, what="the results")
        self.writer = csv.DictWriter(self.file, self.columns, extrasaction="ignore")
        self.writer.writeheader()

    def write(self, row: dict) -> None:
        self.writer.writerow(row)
        self.file.flush()

    def close(self) -> None:
        self.file.commit()

    def discard(self) -> None:
        self.file.discard()


def read_rows(path: Path) -> list[dict]:
    """The rows of a results CSV (a regular file of bounded size: tpuasm.files)."""
    import io

    from ..files import read_text
    from ..limits import MAX_RESULTS_BYTES
    text = read_text(path, what="results CSV", limit=MAX_RESULTS_BYTES)
    return list(csv.DictReader(io.StringIO(text, newline="")))


def factor(text: str) -> float | None:
    """The x-axis value of a setting: a knob's factor, x0.5 -> 0.5, base -> 1, a number."""
    if text in ("", None):
        return None
    if text == "base":
        return 1.0
    t = text[1:] if text[:1] in "xX*" else text
    try:
        return float(t)
    except ValueError:
        return None


def _is_baseline(row: dict, axes: list[str]) -> bool:
    return all(row.get(a) in ("1", "base", "x1") for a in axes)


def relative(rows: list[dict], axes: list[str]) -> dict:
    """{(target, axis): [(x, performance relative to baseline)]}, x sorted, ok rows only.
    In an --each grid a row belongs to the axis that is off its baseline (the baseline
    row to every axis)."""
    ok = [r for r in rows if r.get("status") == "ok" and r.get("time_us")]
    base: dict = {}
    for r in ok:
        if _is_baseline(r, axes):
            base.setdefault(r["target"], float(r["time_us"]))
    for r in ok:
        base.setdefault(r["target"], float(r["time_us"]))
    out: dict = {}
    for r in ok:
        off = [a for a in axes if r.get(a) not in ("1", "base", "x1")]
        for a in (off if len(off) == 1 else axes if not off else []):
            x = factor(r.get(a, ""))
            if x is None:
                continue
            out.setdefault((r["target"], a), []).append((x, base[r["target"]] / float(r["time_us"])))
    return {k: sorted(v) for k, v in out.items()}


def weighted_mean(rel: dict, axes: list[str], partial: bool = False) -> dict:
    """{axis: [(x, weighted mean relative performance)]} over the targets: at the points
    every target has, or with `partial` at every point over the targets it has
    (`present` names them).  Weights: each app's share of the paper's workload when every
    target is one of the six apps, else equal."""
    from ..apps.paper import WORKLOAD_SHARE
    targets = sorted({t for t, _ in rel})
    apps = all(t in WORKLOAD_SHARE for t in targets)
    weight = {t: (WORKLOAD_SHARE[t] if apps else 1.0) for t in targets}
    return _mean(rel, axes, partial, weight,
                 lambda vals: sum(w * y for w, y in vals) / sum(w for w, _ in vals))


def geometric_mean(rel: dict, axes: list[str], partial: bool = False) -> dict:
    """{axis: [(x, geometric mean relative performance)]}: every target counts once, as
    in the paper's geometric means (its Table 6 and section 7 give both); the same points
    as weighted_mean."""
    import math
    weight = {t: 1.0 for t, _ in rel}
    return _mean(rel, axes, partial, weight,
                 lambda vals: math.exp(sum(math.log(y) for _, y in vals) / len(vals)))


def _mean(rel: dict, axes: list[str], partial: bool, weight: dict, combine) -> dict:
    targets = sorted(weight)
    out = {}
    for a in axes:
        xs = sorted({x for t in targets for x, _ in rel.get((t, a), [])})
        line = []
        for x in xs:
            vals = [(weight[t], y) for t in targets for xx, y in rel.get((t, a), []) if xx == x]
            if len(vals) == len(targets) or (partial and vals):
                line.append((x, combine(vals)))
        if line:
            out[a] = line
    return out


def means_table(weighted: dict, geometric: dict, axes: list[str]):
    """A rich table: each parameter's value (factor) with both means side by side."""
    from rich.table import Table
    t = Table(title="performance relative to the baseline: weighted and geometric means "
                    "over the targets", title_justify="left")
    for c in ("parameter", "factor", "weighted mean", "geometric mean"):
        t.add_column(c, justify="left" if c == "parameter" else "right")
    for a in axes:
        geo = dict(geometric.get(a, []))
        for x, y in weighted.get(a, []):
            g = geo.get(x)
            t.add_row(a, f"{x:g}", f"{y:.3f}", "" if g is None else f"{g:.3f}")
    return t


def present(rel: dict, axis: str, x: float) -> list[str]:
    """The targets with a result at scale factor x of `axis`."""
    return sorted(t for (t, a), line in rel.items()
                  if a == axis and any(abs(xx - x) < 1e-9 for xx, _ in line))


def rich_table(rows: list[dict], axes: list[str], limit: int = 60):
    from rich.table import Table
    t = Table(title=f"sweep results ({len(rows):,} points"
                    f"{'' if len(rows) <= limit else f', first {limit} shown; all in the CSV'})",
              title_justify="left")
    for c in ("target", *axes, "status", "cycles", "time (us)", "TOPS", "active %",
              "w.stall %", "w.shift %", "non-mat %"):
        t.add_column(c, justify="left" if c in ("target", "status", *axes) else "right")
    for r in rows[:limit]:
        cyc = float(r.get("cycles") or 0)

        def pct(k):
            return f"{100 * float(r[k]) / cyc:.1f}" if cyc and r.get(k) not in (None, "") else ""
        status = r.get("status", "")
        style = {"ok": "", "skipped": "yellow"}.get(status, "red")
        t.add_row(r.get("target", ""), *(r.get(a, "") for a in axes),
                  f"[{style}]{status}[/]" if style else status,
                  f"{int(cyc):,}" if cyc else "", r.get("time_us", ""), r.get("tops", ""),
                  pct("array_active_cycles"), pct("weight_stall_cycles"),
                  pct("weight_shift_cycles"), pct("non_matrix_cycles"))
    return t


def terminal_plot(rel: dict, mean: dict, axes: list[str]) -> str:
    """Relative performance against log2 of the scale factor, one line per parameter
    (weighted mean over the targets), as plotext text ('' when there is nothing to plot)."""
    import math

    import plotext
    fig = plotext.figure
    fig.clear()
    shown = False
    for a in axes:
        line = mean.get(a)
        if line and len(line) > 1:
            fig.draw(fig.signal([math.log2(x) for x, _ in line], [y for _, y in line])
                     .lines().label(a))
            shown = True
    if not shown:
        return ""
    fig.title("performance relative to the baseline (weighted mean over the targets)")
    fig.label("log2 of the scale factor", axis=0)
    text = fig.build().string(colorless=True)
    fig.clear()
    return text


def save_figure(rel: dict, mean: dict, axes: list[str], path, title: str = "",
                mean_label: str = "weighted mean", geo: dict | None = None) -> None:
    """Figure 11's shape: a panel per target plus the weighted mean; in each, one line per
    parameter, relative performance against the scale factor (log-log).  `geo`: the
    geometric mean, drawn dashed in the mean's panel (same colour per parameter).
    `path`: one file, or a list of them (one figure drawn, saved in each one's format)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    targets = sorted({t for t, _ in rel}, key=_paper_order)
    panels = targets + [mean_label]
    cols = min(4, len(panels))
    rows = (len(panels) + cols - 1) // cols
    fig, grid = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.8 * rows), squeeze=False,
                             sharex=True)
    for i, name in enumerate(panels):
        ax = grid[i // cols][i % cols]
        for a in axes:
            line = mean.get(a) if name == mean_label else rel.get((name, a))
            if line:
                drawn = ax.plot([x for x, _ in line], [y for _, y in line], marker="o", ms=3,
                                label=a)
                g = (geo or {}).get(a) if name == mean_label else None
                if g:
                    ax.plot([x for x, _ in g], [y for _, y in g], ls="--", lw=0.8,
                            color=drawn[0].get_color())
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.axhline(1.0, color="grey", lw=0.5)
        ax.set_title(f"{name} (dashed: geometric)" if name == mean_label and geo else name,
                     fontsize=9)
        ax.grid(True, which="both", lw=0.3)
    for j in range(len(panels), rows * cols):
        grid[j // cols][j % cols].axis("off")
    grid[0][0].legend(fontsize=7)
    fig.supxlabel("scale factor")
    fig.supylabel("relative performance")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    from ..files import atomic_write
    try:             # through a temporary file: a failed save leaves no half image
        for one in (path if isinstance(path, (list, tuple)) else [path]):
            kind = Path(one).suffix.lstrip(".").lower() or "png"
            atomic_write(one, lambda fh, kind=kind: fig.savefig(fh, format=kind),
                         what="the plot")
    finally:
        plt.close(fig)


def _paper_order(name: str):
    from ..apps.paper import APPS
    return (APPS.index(name), name) if name in APPS else (len(APPS), name)
