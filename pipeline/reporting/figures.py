"""The papers' figures, drawn from the sweep's results (and, for learning curves, the MLflow metric histories).

Every figure function returns the ``Figure`` it drew, or one whose ``name`` is None and whose caption says why
it was left out (the profile did not produce its data): never an empty plot. Seeds: accuracies are the mean over
the measured seeds, with their spread (min to max) as error bars or a band.

- DP paper Figure 1: accuracy heatmaps, width x size, per (task, architecture) at the shallowest depth;
  Figure 3: the same at every deeper depth; Figure 2: minimum solved width against n, ed_local beside ed.
  An undecided cell (a trial ran out of steps while still improving) is dotted and labelled "undecided", never
  drawn as unsolved; a minimum width with undecided cells below it is an open marker (an upper bound).
- Separations paper: best test accuracy against input length N per architecture (index lookup, Dyck, the
  equality tasks), and the width scan (accuracy against width at each N).
- Learning curves per (task, size): validation accuracy against step and against training PFLOPs, one line per
  (architecture, width, depth), the winning learning rate's run of each seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from pipeline.reporting.tables import BORDERLINE, cell_means, min_gflops  # noqa: E402
from tasks import TASKS  # noqa: E402

SEPARATIONS_TASKS = tuple(name for name, task in TASKS.items() if task.paper == "separations")
MARKS = {"diverged": "div", "failed": "fail"}


@dataclass(frozen=True)
class Figure:
    section: str
    name: str | None  # the PNG in the report directory; None: left out
    caption: str  # what it shows, or why it was left out


def left_out(section: str, why: str) -> Figure:
    return Figure(section, None, f"left out: {why}")


def save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cell_label(cell) -> tuple[str, str | None]:
    """A heatmap cell's (label, hatch): the mean test accuracy (``BORDERLINE`` before it when a seed's is within
    noise of the threshold) with its spread, a mark for seeds that diverged or failed, * when every seed solved;
    "undecided" under a dotted hatch when a seed is undecided; an inferred cell's verdict under a hatch."""
    if not cell.measured:
        verdict = "undecided" if cell.undecided else "solved" if cell.solved else "unsolved"
        return f"{verdict}\n(inferred)", "..." if cell.undecided else "///"
    label = f"{BORDERLINE if cell.borderline else ''}{cell.accuracy:.2f}" if pd.notna(cell.accuracy) else ""
    if pd.notna(cell.accuracy_std) and cell.accuracy_std > 0:
        label += f"\n±{cell.accuracy_std:.2f}"
    mark = next((m for status, m in MARKS.items() if status in cell.statuses), "")
    label = f"{label} {mark}".strip() + ("*" if cell.solved == cell.seeds else "")
    return (f"{label}\nundecided", "...") if cell.undecided else (label, None)


def heatmap(cells: pd.DataFrame, task: str, arch: str, depth: int, path: Path) -> None:
    """Accuracy by width and size, each cell labelled by ``cell_label``."""
    mine = cells[(cells.task == task) & (cells.arch == arch) & (cells.depth == depth)]
    grid = mine.pivot_table(index="size", columns="width", values="accuracy", dropna=False)
    info = mine.set_index(["size", "width"])
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * grid.shape[1], 1.0 + 0.6 * grid.shape[0]))
    image = ax.imshow(grid.values, cmap="viridis", vmin=0, vmax=1, origin="lower", aspect="auto")
    ax.set_xticks(range(grid.shape[1]), [str(w) for w in grid.columns])
    ax.set_yticks(range(grid.shape[0]), [str(s) for s in grid.index])
    ax.set_xlabel("width D")
    ax.set_ylabel("size")
    ax.set_title(f"{task} - {arch} - depth {depth}", fontsize=9)
    for y, size in enumerate(grid.index):
        for x, width in enumerate(grid.columns):
            if (size, width) not in info.index:
                continue
            cell = info.loc[size, width]
            label, hatch = cell_label(cell)
            if hatch:
                ax.add_patch(plt.Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, hatch=hatch, edgecolor="0.6"))
            dark = pd.isna(cell.accuracy) or cell.accuracy < 0.6  # viridis' dark end: white text
            colour, fontsize = ("white" if dark else "black", 7) if cell.measured else ("0.3", 6)
            ax.text(x, y, label, ha="center", va="center", fontsize=fontsize, color=colour)
    fig.colorbar(image, ax=ax, fraction=0.05, label="test accuracy")
    save(fig, path)


def heatmaps(cells: pd.DataFrame, out: Path) -> list[Figure]:
    """Figure 1 (every task at its shallowest depth) and Figure 3 (the deeper depths)."""
    first, deeper = "Accuracy heatmaps (DP paper Figure 1)", "The deeper models (DP paper Figure 3)"
    figures = []
    for (task, arch, depth), mine in cells.groupby(["task", "arch", "depth"]):
        name = f"heatmap_{task}_{arch}_d{depth}.png"
        heatmap(cells, task, arch, depth, out / name)
        shallowest = depth == cells[cells.task == task].depth.min()
        undecided = int((mine.undecided > 0).sum())
        caption = f"{task}, {arch}, depth {depth}" + (f"; cells undecided (dotted): {undecided}" if undecided else "")
        figures.append(Figure(first if shallowest else deeper, name, caption))
    if not any(f.section == deeper for f in figures):
        figures.append(
            left_out(
                deeper, f"the profile trains one depth per task ({', '.join(map(str, sorted(cells.depth.unique())))})"
            )
        )
    return figures


def locality_figure(best: pd.DataFrame, out: Path) -> Figure:
    """Figure 2: the smallest solved width against n, ed_local (solid) beside ed (dashed), per architecture; an
    open marker where a narrower cell is undecided (an upper bound)."""
    section = "DP paper Figure 2: ed_local against ed"
    mine = best[best.task.isin(["ed", "ed_local"])]
    if set(mine.task) != {"ed", "ed_local"}:
        return left_out(section, "needs both ed and ed_local in the profile's sweep")
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    for (arch, depth), group in mine.groupby(["arch", "depth"]):
        for task, style in (("ed_local", "-"), ("ed", "--")):
            line = group[group.task == task].sort_values("size")
            colour = ax.plot(line["size"], line.width, style, label=f"{arch} d{depth} {task}")[0].get_color()
            bound = line.undecided != ""
            ax.plot(line["size"][~bound], line.width[~bound], "o", color=colour)
            ax.plot(line["size"][bound], line.width[bound], "o", color=colour, markerfacecolor="none")
    ax.set_xlabel("n")
    ax.set_ylabel("smallest solved width (missing: none)")
    ax.legend(fontsize=7)
    name = "fig2_ed_local_vs_ed.png"
    save(fig, out / name)
    return Figure(
        section,
        name,
        "smallest width every seed solves; open marker = an upper bound (a narrower cell is undecided); "
        "a gap = no width solved (where a cell is undecided: none yet)",
    )


def best_per_length(table: pd.DataFrame, task: str) -> pd.DataFrame:
    """Per (size, arch): the (width, depth) with the highest mean test accuracy over measured seeds, with the
    seeds' mean, min and max (the separations paper reports each architecture's best run)."""
    cells = cell_means(table[table.task == task]).dropna(subset=["accuracy"])
    top = cells.loc[cells.groupby(["size", "arch"]).accuracy.idxmax()]
    return top.sort_values(["arch", "size"])


def accuracy_vs_length(table: pd.DataFrame, out: Path) -> list[Figure]:
    section = "Separations paper: accuracy against input length"
    figures = []
    for task in SEPARATIONS_TASKS:
        top = best_per_length(table, task)
        if top.empty:
            figures.append(left_out(section, f"{task}: not in the profile's sweep"))
            continue
        if top["size"].nunique() < 2:
            figures.append(left_out(section, f"{task}: one length only (N={top['size'].iloc[0]})"))
            continue
        fig, ax = plt.subplots(figsize=(5.5, 3.5))
        for arch, line in top.groupby("arch"):
            spread = np.vstack([line.accuracy - line.accuracy_min, line.accuracy_max - line.accuracy])
            ax.errorbar(line["size"], line.accuracy, yerr=np.nan_to_num(spread), marker="o", capsize=3, label=arch)
        ax.set_xscale("log")
        ax.set_xticks(sorted(top["size"].unique()), [str(s) for s in sorted(top["size"].unique())])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # else "3x10^1" between the sizes
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("input length N")
        ax.set_ylabel("test accuracy (best width, depth)")
        ax.set_title(task, fontsize=9)
        ax.legend(fontsize=7)
        name = f"sep_length_{task}.png"
        save(fig, out / name)
        figures.append(
            Figure(
                section,
                name,
                f"{task}: each architecture's best (width, depth) per N; mean over seeds, bars min to max",
            )
        )
    return figures


def width_scan(table: pd.DataFrame, out: Path) -> list[Figure]:
    section = "Separations paper: width scan"
    figures = []
    for task in SEPARATIONS_TASKS:
        cells = cell_means(table[table.task == task]).dropna(subset=["accuracy"])
        if cells.empty or cells.width.nunique() < 2:
            why = "not in the profile's sweep" if cells.empty else "one width only"
            figures.append(left_out(section, f"{task}: {why}"))
            continue
        sizes = sorted(cells["size"].unique())
        fig, axes = plt.subplots(1, len(sizes), figsize=(3.2 * len(sizes), 3.2), squeeze=False, sharey=True)
        for ax, size in zip(axes[0], sizes):
            for (arch, depth), line in cells[cells["size"] == size].groupby(["arch", "depth"]):
                line = line.sort_values("width")
                spread = np.vstack([line.accuracy - line.accuracy_min, line.accuracy_max - line.accuracy])
                ax.errorbar(
                    line.width,
                    line.accuracy,
                    yerr=np.nan_to_num(spread),
                    marker="o",
                    capsize=3,
                    label=f"{arch} d{depth}",
                )
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted(cells.width.unique()), [str(w) for w in sorted(cells.width.unique())])  # not 2^6
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set_title(f"{task} N={size}", fontsize=9)
            ax.set_xlabel("width D")
            ax.set_ylim(0, 1.02)
        axes[0][0].set_ylabel("test accuracy")
        axes[0][-1].legend(fontsize=7)
        name = f"sep_width_{task}.png"
        save(fig, out / name)
        figures.append(Figure(section, name, f"{task}: measured cells only; mean over seeds, bars min to max"))
    return figures


def load_histories(client, table: pd.DataFrame) -> pd.DataFrame:
    """The winning run's val_accuracy and train_pflops at every validation step, per measured cell (a reused
    cell's run is the original, which holds its curve)."""
    frames = []
    for r in table[table.measured & table.mlflow_run_id.notna()].itertuples():
        series = {
            key: {m.step: m.value for m in client.get_metric_history(r.mlflow_run_id, key)}
            for key in ("val_accuracy", "train_pflops")
        }
        curve = pd.DataFrame(series).rename_axis("step").reset_index()
        frames.append(curve.assign(task=r.task, size=r.size, arch=r.arch, width=r.width, depth=r.depth, seed=r.seed))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def learning_curves(histories: pd.DataFrame | None, out: Path) -> list[Figure]:
    section = "Learning curves"
    if histories is None:
        return [left_out(section, "the report ran without MLflow (--no-mlflow): no metric histories")]
    curves = histories.dropna(subset=["val_accuracy"]) if len(histories) else histories
    if curves.empty:
        return [left_out(section, "no measured cell logged a validation curve")]
    figures = []
    for (task, size), mine in curves.groupby(["task", "size"]):
        fig, (by_step, by_flops) = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
        for i, ((arch, width, depth), line) in enumerate(mine.groupby(["arch", "width", "depth"])):
            style = ("-", "--", ":", "-.")[i // 10 % 4]  # the colour cycle has 10 colours: the 11th line is dashed
            # seeds: mean and min-max band at each validation step (steps a seed never reached are skipped)
            per_step = line.groupby("step").agg(
                mean=("val_accuracy", "mean"),
                low=("val_accuracy", "min"),
                high=("val_accuracy", "max"),
                pflops=("train_pflops", "mean"),
            )
            label = f"{arch} D={width} d{depth}"
            drawn = by_step.plot(per_step.index, per_step["mean"], style, label=label, lw=1)[0]
            by_step.fill_between(per_step.index, per_step.low, per_step.high, color=drawn.get_color(), alpha=0.2)
            by_flops.plot(per_step.pflops, per_step["mean"], style, color=drawn.get_color(), lw=1)
            by_flops.fill_between(per_step.pflops, per_step.low, per_step.high, color=drawn.get_color(), alpha=0.2)
        by_step.set_xlabel("step")
        by_step.set_ylabel("validation accuracy")
        by_flops.set_xlabel("training PFLOPs")
        by_flops.set_xscale("log")
        by_flops.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # minor labels overlap
        by_step.set_title(f"{task} {size}", fontsize=9)
        by_flops.legend(*by_step.get_legend_handles_labels(), fontsize=6, loc="upper left", bbox_to_anchor=(1, 1))
        name = f"curves_{task}_{size}.png"
        save(fig, out / name)
        figures.append(Figure(section, name, f"{task} {size}: mean over seeds, band min to max"))
    return figures


def draw_all(table: pd.DataFrame, out: Path, histories: pd.DataFrame | None) -> list[Figure]:
    cells = cell_means(table)
    figures = heatmaps(cells, out)
    figures.append(locality_figure(min_gflops(table), out))
    return figures + accuracy_vs_length(table, out) + width_scan(table, out) + learning_curves(histories, out)
