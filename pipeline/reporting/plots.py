"""The data files that `dvc plots show` and `dvc plots diff` draw (dvc.yaml's top-level ``plots``, with our
Vega-Lite templates in ``.dvc/plots/``), written by the report stage to ``results/plots/``:

- ``curves/<task>_<size>.csv``: one file, so one DVC plot, per (task, size) (DVC draws a plot per file of a
  directory): validation accuracy at every validation step of each measured cell's winning run, and the training
  PFLOPs spent by then; ``line`` names the (architecture, width, depth) a line is coloured by, one line per seed;
- ``frontier.csv``: per (task, size, architecture, depth) the smallest width every seed solves
  (``tables.min_gflops``); ``kind`` says what ``width`` is where it is not that: an upper bound (a narrower cell is
  undecided), or the widest width trained where none solved (``none solved``) or none is decided (``undecided``);
- ``accuracy.csv``: per (task, size, architecture, width, depth) the mean test accuracy over the measured seeds,
  how the seeds ended (``status``), and the report heatmap's label of the cell (``figures.cell_label``).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from pipeline.reporting.figures import cell_label
from pipeline.reporting.tables import cell_means

CURVES = "curves"
CURVE_COLUMNS = ["line", "arch", "width", "depth", "seed", "step", "train_pflops", "val_accuracy"]
FRONTIER_KINDS = {
    "solved": "smallest width every seed solves",
    "bound": "upper bound: a narrower cell is undecided",
    "none": "none solved up to this width",
    "undecided": "undecided up to this width",
}


def line_label(arch: str, width: int, depth: int) -> str:
    return f"{arch} D={width} d{depth}"


def curves(histories: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per (task, size), its file's name and rows (``figures.load_histories``' rows with a validation accuracy)."""
    if histories.empty:  # no measured cell logged a curve: no columns either
        return {}
    shown = histories.dropna(subset=["val_accuracy"]).sort_values(["arch", "width", "depth", "seed", "step"])
    shown = shown.assign(line=[line_label(r.arch, r.width, r.depth) for r in shown.itertuples()])
    return {f"{task}_{size}.csv": mine[CURVE_COLUMNS] for (task, size), mine in shown.groupby(["task", "size"])}


def frontier(table: pd.DataFrame, best: pd.DataFrame) -> pd.DataFrame:
    """One row per (task, size, architecture, depth) of ``best`` (``tables.min_gflops`` of ``table``):
    ``min_width`` (empty where no width solved) and the width the plot draws: the minimum where there is one, else
    the widest trained, with its ``kind`` (``FRONTIER_KINDS``)."""
    widest = table.groupby(["task", "size", "arch", "depth"]).width.max()
    rows = []
    for r in best.itertuples():
        solved = pd.notna(r.width)
        kind = ("bound" if r.undecided else "solved") if solved else ("undecided" if r.undecided else "none")
        rows.append(
            {
                "task": r.task,
                "size": r.size,
                "arch": r.arch,
                "depth": r.depth,
                "series": f"{r.arch} d{r.depth}",
                "min_width": int(r.width) if solved else None,
                "width": int(r.width) if solved else int(widest[r.task, r.size, r.arch, r.depth]),
                "kind": FRONTIER_KINDS[kind],
                "undecided": r.undecided,
            }
        )
    return pd.DataFrame(rows).astype({"min_width": "Int64"})


def accuracy(table: pd.DataFrame) -> pd.DataFrame:
    """One row per cell: mean test accuracy over the measured seeds (empty where the search inferred every seed),
    the seeds' verdicts and the heatmap label."""
    cells = cell_means(table)
    labels = [cell_label(cell)[0].replace("\n", " ") for cell in cells.itertuples()]
    shown = cells.assign(accuracy=cells.accuracy.round(4), label=labels, status=cells.statuses)
    return shown[["task", "size", "arch", "width", "depth", "accuracy", "seeds", "measured", "status", "label"]]


def write(table: pd.DataFrame, best: pd.DataFrame, histories: pd.DataFrame | None, out: Path) -> None:
    """The files above into ``out`` (the report writes it beside the report and swaps both in together); ``best``:
    the report's minimum-width table. No histories (the report ran without MLflow): ``curves/`` is empty."""
    (out / CURVES).mkdir(parents=True)
    for name, rows in curves(histories if histories is not None else pd.DataFrame()).items():
        rows.to_csv(out / CURVES / name, index=False)
    frontier(table, best).to_csv(out / "frontier.csv", index=False)
    accuracy(table).to_csv(out / "accuracy.csv", index=False)
