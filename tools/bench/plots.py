"""For benchmarking: the small plotting functions every benchmark page's figure is drawn with.

    from tools.bench import plots
    plt = plots.pyplot()                     # None without matplotlib (``pip install -e .[plot]``)
    fig, ax = plt.subplots(figsize=plots.size(1))
    plots.hbars(ax, ["0", "1", "2", "3"], {"measured": [4, 3, 2, 1]}, "KiB per rank")
    plots.save_svg(fig, "docs/benchmarks/peak.svg", fields)   # fields: report.stamp_fields()

matplotlib is imported only by ``pyplot``, so that a benchmark runs, and writes its tables, without
it. Figures are SVG with text as text (small, searchable, sharp at any width), written
reproducibly (no date, fixed ids: the same results draw the same file) and atomically, with the
run's stamp (command, date, commit, machine) in their last line, as on the page. A page's content
column is about 870 px wide at a 1400 px window (tests/unit/test_docs_width.py): ``size`` keeps a
figure's width at that, so that its text is not scaled down.
"""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Dict, Optional, Sequence

from tools.bench.report import stamp_line, write_atomic

WIDTH_IN = 9.0  # inches at 96 px: the content column's 870 px, less a margin
COLORS = ("#3f6fb5", "#e08a2c", "#4a9a5b", "#c44e52", "#8172b2", "#937860", "#5f9ea0", "#b0b0b0")


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive SVG backend, or None where matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "mindone_zero", "font.size": 9,
                         "axes.titlesize": 10, "axes.spines.top": False, "axes.spines.right": False,
                         "legend.fontsize": 8, "legend.frameon": False})
    return plt


def size(rows: int = 1, height_in: float = 3.2) -> tuple:
    """``figsize`` of a figure of ``rows`` rows of panels, each ``height_in`` inches high."""
    return WIDTH_IN, rows * height_in + 0.5


def hbars(ax, labels: Sequence[str], series: Dict[str, Sequence[Optional[float]]], xlabel: str,
          stacked: bool = False, colors: Sequence[str] = COLORS) -> None:
    """Horizontal bars, one group per label (top to bottom), one bar per series (side by side, or
    stacked). A None value draws nothing."""
    n, k = len(labels), max(1, len(series))
    height = 0.8 if stacked else 0.8 / k
    left = [0.0] * n
    for i, (name, values) in enumerate(series.items()):
        ys = [y if stacked else y - 0.4 + height * (i + 0.5) for y in range(n)]
        vals = [0.0 if v is None else float(v) for v in values]
        ax.barh(ys, vals, height, left=left if stacked else None, label=name, color=colors[i % len(colors)])
        if stacked:
            left = [a + b for a, b in zip(left, vals)]
    ax.set_yticks(range(n))
    ax.set_yticklabels(labels)
    if not ax.yaxis_inverted():  # the first label on top (axes sharing y are inverted once)
        ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)


def marks(ax, values: Sequence[Optional[float]], label: str, horizontal: bool = True, color: str = "black") -> None:
    """A tick per group at ``values`` (an estimate or a bound against the bars of ``hbars`` or ``vbars``)."""
    points = [(i, v) for i, v in enumerate(values) if v is not None]
    if not points:
        return
    idx, vals = zip(*points)
    if horizontal:
        ax.scatter(vals, idx, marker="|", s=400, color=color, label=label, zorder=3)
    else:
        ax.scatter(idx, vals, marker="_", s=400, color=color, label=label, zorder=3)


def vbars(ax, labels: Sequence[str], series: Dict[str, Sequence[Optional[float]]], ylabel: str,
          colors: Sequence[str] = COLORS) -> None:
    """Vertical bars, one group per label (left to right), one bar per series side by side."""
    k = max(1, len(series))
    width = 0.8 / k
    for i, (name, values) in enumerate(series.items()):
        xs = [x - 0.4 + width * (i + 0.5) for x in range(len(labels))]
        ax.bar(xs, [0.0 if v is None else float(v) for v in values], width, label=name, color=colors[i % len(colors)])
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)


def lines(ax, xs: Sequence[float], series: Dict[str, Sequence[Optional[float]]], xlabel: str, ylabel: str,
          log_x: bool = False, colors: Sequence[str] = COLORS, styles: Optional[Dict[str, str]] = None) -> None:
    """One marked line per series over ``xs`` (None leaves a gap)."""
    for i, (name, values) in enumerate(series.items()):
        ys = [float("nan") if v is None else float(v) for v in values]
        ax.plot(xs, ys, (styles or {}).get(name, "o-"), label=name, color=colors[i % len(colors)])
    if log_x:
        ax.set_xscale("log", base=2)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([f"{x:g}" for x in xs])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)


def goal(ax, value: float, label: str, horizontal_line: bool = True) -> None:
    """A dashed goal (or reference) line at ``value``, labelled in the legend."""
    draw = ax.axhline if horizontal_line else ax.axvline
    draw(value, color="#c44e52", linestyle="--", linewidth=1.2, label=label)


def legend_below(ax, ncol: int = 2, extra=None) -> None:
    """The axes' legend under its x label (about 40 points below the axes), out of the bars' way;
    ``extra``: more axes (a twin) whose entries join it."""
    handles, labels = ax.get_legend_handles_labels()
    for other in extra or ():
        more = other.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    height_pt = ax.get_position().height * ax.figure.get_figheight() * 72
    ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -40 / height_pt), ncol=ncol, fontsize=7,
              borderaxespad=0)


def save_svg(fig, path, fields: dict, title: str = "") -> str:
    """Write ``fig`` to ``path`` (SVG) with the run's stamp (``report.stamp_fields``) as its last
    line and in its metadata; reproducible and atomic. Closes the figure; returns the path."""
    import matplotlib.pyplot as plt

    path = Path(path)
    fig.tight_layout()
    fig.canvas.draw()
    bottom = min(ax.get_tightbbox(fig.canvas.get_renderer()).y0 for ax in fig.axes) / fig.dpi / fig.get_figheight()
    fig.text(0.01, min(0.0, bottom) - 0.02, "\n".join(textwrap.wrap(stamp_line(fields), 140)), fontsize=6.5,
             color="#555555", ha="left", va="top", family="monospace")
    metadata = {"Date": None, "Title": title or path.stem, "Description": stamp_line(fields)}
    try:
        return write_atomic(path, lambda tmp: fig.savefig(tmp, format="svg", bbox_inches="tight", pad_inches=0.1,
                                                          metadata=metadata))
    finally:
        plt.close(fig)
