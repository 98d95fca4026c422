"""The atlas over time: every recorded night of a profile (``nightly/<date>_<commit>/``, oldest first) as long
tables, and the nightly section's figures of them.

- ``load``: per night and cell (task, size, arch, width, depth, seed) its verdict and test accuracy; per night and
  (task, size, arch, depth) the minimum width every seed solves, by ``tables.min_gflops`` on that night's sweep (the
  number the report's tables show, with its undecided and borderline marks).
- ``draw``: per (task, size), the minimum width (left) and the mean test accuracy over seeds (right) per night; the
  last night's regressions (``comparison.compare``'s) ringed in red, so that a regression is seen, not read.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import matplotlib.ticker
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from pipeline.nightly.comparison import cell_name, row_name
from pipeline.reporting.figures import Figure, plt, save
from pipeline.reporting.tables import borderline_cells, min_gflops

SECTION = "The atlas over time"
PREFIX = "nightly_history_"  # the figures' names: nightly_history_<task>_<size>.png
NOTE = (
    "Per (task, size), every recorded night of the profile. Left: the smallest width every seed solves, the "
    "report's Table 2 width (hollow, dotted into and out of it: undecided, an upper bound or none solved yet; x at "
    "'none': no width solved). Right: test accuracy, mean over the measured seeds, per (architecture, width, depth) "
    "(hollow: a seed undecided; 'failed': every measured seed failed or diverged); dashed: the threshold. Ringed in "
    "red: the last night's regressions of minimum width (left) and of verdict or accuracy (right); throughput and "
    "claim regressions are in the lists only. Nights by date and commit (* = uncommitted changes)."
)
NIGHTS = ["night", "date", "commit", "label"]
CELLS = ["night", "date", "task", "size", "arch", "width", "depth", "seed", "measured", "status", "final_accuracy"]
WIDTHS = ["night", "date", "task", "size", "arch", "depth", "min_width", "undecided", "borderline"]
CRASHED = ("failed", "diverged")  # verdicts without a test accuracy
FAILED_Y = -0.1  # where the accuracy panel draws a cell whose every measured seed crashed: below 0, labelled
MARKERS = "os^Dv<>Pp*"  # one per width on the accuracy panel (colour: architecture and depth, as on the left)
MAX_LABELS = 6  # labelled nights on an x axis: more would overlap
GREY = "0.4"


@dataclass(frozen=True)
class History:
    nights: pd.DataFrame  # NIGHTS: a row per night, oldest first; label: date and short commit, for the x axis
    cells: pd.DataFrame  # CELLS (and borderline): a row per night and cell
    widths: pd.DataFrame  # WIDTHS: a row per night and (task, size, arch, depth); min_width NaN: none solved


def nights(history: Path, profile: str) -> list[Path]:
    """The recorded nights of ``profile``, oldest first (a night's directory name begins with its date); a
    directory without ``meta.json`` is a night that never finished recording."""
    if not history.is_dir():
        return []
    return [
        d
        for d in sorted(history.iterdir())
        if (d / "meta.json").is_file() and json.loads((d / "meta.json").read_text())["profile"] == profile
    ]


def when(date: str) -> str:
    """A night's date as ``pipeline.nightly`` writes it, ``2026-05-09T073500``, as "2026-05-09 07:35"."""
    return f"{date[:10]} {date[11:13]}:{date[13:15]}"


def night_label(date: str, commit: str) -> str:
    """The date over the short commit, * for uncommitted changes (``0123456789ab-dirty``: "0123456*")."""
    sha, dirty = commit.removesuffix("-dirty"), commit.endswith("-dirty")
    return f"{when(date)}\n{sha[:7]}{'*' if dirty else ''}"


def load(history: Path, profile: str) -> History:
    """Every recorded night of ``profile`` under ``history`` (``nightly.history``)."""
    rows, cells, widths = [], [], []
    for night in nights(history, profile):
        meta = json.loads((night / "meta.json").read_text())
        sweep = pd.read_csv(night / "sweep.csv")
        key = {"night": night.name, "date": meta["date"]}
        rows.append(key | {"commit": meta["commit"], "label": night_label(meta["date"], meta["commit"])})
        cells.append(sweep.assign(**key)[CELLS].assign(borderline=borderline_cells(sweep)))
        widths.append(min_gflops(sweep).rename(columns={"width": "min_width"}).assign(**key)[WIDTHS])
    return History(
        pd.DataFrame(rows, columns=NIGHTS),
        pd.concat(cells, ignore_index=True) if cells else pd.DataFrame(columns=[*CELLS, "borderline"]),
        pd.concat(widths, ignore_index=True) if widths else pd.DataFrame(columns=WIDTHS),
    )


def regressed(history: History, result: dict) -> tuple[set[tuple], set[tuple]]:
    """The last night's regressions in ``result`` (``comparison.compare``'s) as the figures draw them: the
    (task, size, arch, width, depth) cells a seed of which regressed in verdict or accuracy, and the
    (task, size, arch, depth) rows whose minimum width regressed (matched by the names the comparison gives)."""
    cell_names = {c["where"] for c in result["regressions"] if c["what"] in ("verdict", "accuracy")}
    row_names = {c["where"] for c in result["regressions"] if c["what"] == "min_width"}
    last = history.nights.night.iloc[-1]
    cells = history.cells[history.cells.night == last]
    widths = history.widths[history.widths.night == last]
    return (
        {(r.task, r.size, r.arch, r.width, r.depth) for r in cells.itertuples() if cell_name(r) in cell_names},
        {
            (r.task, r.size, r.arch, r.depth)
            for r in widths.itertuples()
            if row_name(r.task, r.size, r.arch, r.depth) in row_names
        },
    )


def ring(ax, x: float, y: float) -> None:
    ax.plot(x, y, "o", ms=13, markerfacecolor="none", markeredgecolor="red", markeredgewidth=2, zorder=5)


def shifts(lines: list) -> dict:
    """A small shift along x per line, so that lines that meet (the same value on a night) lie side by side."""
    step = min(0.08, 0.4 / len(lines))
    return {line: (i - (len(lines) - 1) / 2) * step for i, line in enumerate(lines)}


def widths_panel(ax, rows: pd.DataFrame, grid: list[int], x: dict, colours: dict, red: set) -> None:
    """Minimum width per night, a line per (arch, depth), on a log2 axis of the profile's widths; "none" one
    doubling above the widest."""
    none_y = 2 * grid[-1]
    shift = shifts(sorted(set(zip(rows.arch, rows.depth))))
    for (arch, depth), line in rows.groupby(["arch", "depth"]):
        colour = colours[arch, depth]
        xs = line.night.map(x).to_numpy() + shift[arch, depth]
        ys = line.min_width.fillna(none_y).to_numpy(dtype=float)
        open_ = (line.undecided != "").to_numpy()
        none = line.min_width.isna().to_numpy()
        for i in range(len(xs) - 1):
            ax.plot(xs[i : i + 2], ys[i : i + 2], ":" if open_[i] or open_[i + 1] else "-", color=colour, lw=1)
        ax.plot(xs[~open_ & ~none], ys[~open_ & ~none], "o", color=colour, ms=5)
        ax.plot(xs[open_], ys[open_], "o", color=colour, ms=5, markerfacecolor="none")
        ax.plot(xs[~open_ & none], ys[~open_ & none], "x", color=colour, ms=7, mew=2)
        if (arch, depth) in red:
            ring(ax, xs[-1], ys[-1])  # the rows are in night order: the last point is the last night's
    ax.set_yscale("log", base=2)
    ax.set_yticks([*grid, none_y], [*map(str, grid), "none"])
    ax.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_ylim(grid[0] / 1.5, none_y * 1.5)
    ax.set_ylabel("smallest width every seed solves")


def accuracy_panel(
    ax, cells: pd.DataFrame, grid: list[int], x: dict, colours: dict, red: set, threshold: float
) -> None:
    """Test accuracy per night, mean over the measured seeds, a line per (arch, width, depth); hollow where a seed
    is undecided; a gap where every seed was inferred (no test accuracy)."""
    means = (
        cells.assign(
            scored=cells.final_accuracy.where(cells.measured.astype(bool)),
            crashed=cells.status.isin(CRASHED),
            open_=cells.status.eq("undecided"),
            x=cells.night.map(x),
        )
        .groupby(["arch", "width", "depth", "x"], as_index=False)
        .agg(accuracy=("scored", "mean"), crashed=("crashed", "any"), open_=("open_", "any"))
    )
    shift = shifts(sorted(set(zip(means.arch, means.width, means.depth))))
    for (arch, width, depth), line in means.groupby(["arch", "width", "depth"]):
        colour = colours[arch, depth]
        xs = line.x.to_numpy() + shift[arch, width, depth]
        ys = np.where(line.accuracy.notna(), line.accuracy, np.where(line.crashed, FAILED_Y, np.nan))
        marker = MARKERS[grid.index(width) % len(MARKERS)]
        ax.plot(xs, ys, "-", marker=marker, color=colour, lw=1, ms=4)
        open_ = line.open_.to_numpy()
        ax.plot(xs[open_], ys[open_], marker, color=colour, ms=4, markerfacecolor="white")
        if (arch, width, depth) in red:
            ring(ax, xs[-1], ys[-1])  # sorted by night: the last point is the last night's
    ax.axhline(threshold, ls="--", color=GREY, lw=1)
    ax.set_yticks([FAILED_Y, 0, 0.25, 0.5, 0.75, 1], ["failed", "0", "0.25", "0.5", "0.75", "1"])
    ax.set_ylim(FAILED_Y - 0.06, 1.04)
    ax.set_ylabel("test accuracy (mean over seeds)")


def nights_axis(ax, labels: list[str]) -> None:
    """A tick per night, at most ``MAX_LABELS`` of them labelled, the last night always."""
    n = len(labels)
    every = math.ceil(n / MAX_LABELS)
    labelled = [i for i in range(n) if (n - 1 - i) % every == 0]
    ax.set_xticks(labelled, [labels[i] for i in labelled], fontsize=7)
    ax.set_xticks(range(n), minor=True)
    ax.set_xlim(-0.5, n - 0.5)


def legend(colours: dict, grid: list[int], threshold: float, regressions: bool) -> list[Line2D]:
    handles = [Line2D([], [], color=c, marker="o", ms=5, label=f"{a} d{d}") for (a, d), c in colours.items()]
    handles += [
        Line2D([], [], color=GREY, marker=MARKERS[i % len(MARKERS)], ms=4, label=f"D={w}") for i, w in enumerate(grid)
    ]
    handles += [
        Line2D([], [], color=GREY, ls=":", marker="o", ms=5, markerfacecolor="none", label="undecided"),
        Line2D([], [], color=GREY, ls="", marker="x", ms=6, mew=2, label="none solved"),
        Line2D([], [], color=GREY, ls="--", label=f"threshold {threshold:.0%}"),
    ]
    if regressions:
        handles.append(
            Line2D(
                [],
                [],
                ls="",
                marker="o",
                ms=10,
                markerfacecolor="none",
                markeredgecolor="red",
                markeredgewidth=2,
                label="regression (last night)",
            )
        )
    return handles


def draw(history: History, result: dict, threshold: float, out: Path) -> list[Figure]:
    """A figure per (task, size) in ``out`` (``nightly_history_<task>_<size>.png``); ``result``: the last night's
    comparison with the one before (every list empty on a profile's first night)."""
    if history.nights.empty:
        return []
    x = {night: i for i, night in enumerate(history.nights.night)}
    labels = list(history.nights.label)
    red_cells, red_rows = regressed(history, result)
    figures = []
    for (task, size), cells in history.cells.groupby(["task", "size"]):
        rows = history.widths[(history.widths.task == task) & (history.widths["size"] == size)]
        grid = sorted(int(w) for w in cells.width.unique())
        colours = {line: f"C{i % 10}" for i, line in enumerate(sorted(set(zip(cells.arch, cells.depth))))}
        red_w = {(a, d) for t, s, a, d in red_rows if (t, s) == (task, size)}
        red_a = {(a, w, d) for t, s, a, w, d in red_cells if (t, s) == (task, size)}
        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
        widths_panel(left, rows, grid, x, colours, red_w)
        accuracy_panel(right, cells, grid, x, colours, red_a, threshold)
        for ax in (left, right):
            nights_axis(ax, labels)
        left.set_title(f"{task} {size}: minimum width per night", fontsize=9)
        right.set_title(f"{task} {size}: test accuracy per night", fontsize=9)
        right.legend(
            handles=legend(colours, grid, threshold, bool(red_w or red_a)),
            fontsize=6,
            loc="upper left",
            bbox_to_anchor=(1, 1),
        )
        name = f"{PREFIX}{task}_{size}.png"
        save(fig, out / name)
        n = len(labels)
        dates = history.nights.date
        caption = f"{task} {size}: {n} night{'s' if n > 1 else ''}, {when(dates.iloc[0])} to {when(dates.iloc[-1])}"
        if red_w or red_a:
            caption += (
                f"; ringed in red, the last night's regressions: {len(red_w)} of minimum width, {len(red_a)} of "
                "verdict or accuracy"
            )
        figures.append(Figure(SECTION, name, caption))
    return figures


def markdown(figures: list[Figure]) -> str:
    """The figures as a section of ``nightly.md``, which lies beside them."""
    return "\n".join([f"## {SECTION}", "", NOTE, "", *(f"![{f.caption}]({f.name})\n" for f in figures)])
