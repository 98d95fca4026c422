"""Stage `report`: accuracy heatmaps and the minimum-GFLOPs tables from the sweep's results table.

    python -m pipeline.report

Writes ``report/``: ``index.html`` (the page to open), one heatmap per (task, architecture, depth) with width
on x and size on y (the DP paper's Figure 1 layout; cells the frontier search inferred are hatched, never drawn
as measured), ``min_gflops.md`` / ``.csv`` (the DP paper's Table 2, one table per depth: per (task, size,
architecture) the smallest width solved by every seed and its forward GFLOPs), and ``results.csv``. Headline
numbers go to ``results/report.json`` (a DVC metrics file); the same files are logged to the sweep's MLflow
parent run. A cell is solved when its validation accuracy reached the threshold (``pipeline/verdict.py``);
accuracies shown are test-set final-answer accuracies, the mean over seeds.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import shutil
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from pipeline import config as config_mod  # noqa: E402
from pipeline.frontier import Cell, Outcome, min_widths  # noqa: E402

REQUIRED = ("task", "size", "max_len", "arch", "width", "depth", "seed", "measured", "status", "reason",
            "final_accuracy", "paper_gflops", "exact_gflops", "parent_run_id")


class ReportError(RuntimeError):
    pass


def load_results(path: Path) -> pd.DataFrame:
    if not path.exists():
        raise ReportError(f"{path} is missing: run the sweep stage first (`dvc repro`)")
    table = pd.read_csv(path)
    missing = [c for c in REQUIRED if c not in table.columns]
    if missing:
        raise ReportError(f"{path} lacks columns {missing}: written by another version of the sweep stage?")
    return table


def cell_means(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (task, size, arch, width, depth): test accuracy averaged over the seeds that were measured
    (NaN where the search inferred every seed), and how the seeds ended."""
    keys = ["task", "size", "max_len", "arch", "width", "depth"]
    return (table.assign(scored=table.final_accuracy.where(table.measured))
                 .groupby(keys, as_index=False)
                 .agg(accuracy=("scored", "mean"), seeds=("seed", "nunique"), measured=("measured", "sum"),
                      solved=("status", lambda st: int((st == "solved").sum())),
                      statuses=("status", lambda st: ",".join(sorted(set(st)))),
                      paper_gflops=("paper_gflops", "first"), exact_gflops=("exact_gflops", "first")))


def min_gflops(table: pd.DataFrame) -> pd.DataFrame:
    """Per (task, size, arch, depth): the smallest width solved by every seed (``frontier.min_widths``, the same
    rule the search uses) and its paper-convention and exact forward GFLOPs."""
    outcomes = {Cell(r.task, r.size, r.arch, r.width, r.depth, r.seed): Outcome(r.status == "solved", r.measured)
                for r in table.itertuples()}
    cells = cell_means(table).set_index(["task", "size", "arch", "width", "depth"])
    rows = []
    for (task, size, arch, depth), width in sorted(min_widths(outcomes).items()):
        group = cells.loc[(task, size, arch)].xs(depth, level="depth")
        row = {"task": task, "size": size, "L": int(group.max_len.iloc[0]), "depth": depth, "arch": arch,
               "best_accuracy": round(float(group.accuracy.max()), 4) if group.accuracy.notna().any() else None}
        if width is not None:
            best = group.loc[width]
            row.update(min_paper_gflops=float(best.paper_gflops), min_exact_gflops=float(best.exact_gflops),
                       width=int(width), accuracy=None if pd.isna(best.accuracy) else round(float(best.accuracy), 4))
        rows.append(row)
    cols = ["task", "size", "L", "depth", "arch", "min_paper_gflops", "min_exact_gflops", "width", "accuracy",
            "best_accuracy"]
    return pd.DataFrame(rows).reindex(columns=cols)


def min_gflops_pivot(table: pd.DataFrame) -> pd.DataFrame:
    """A row per (task, size, L, depth), a column per architecture; '-' where no width solved."""
    def fmt(r) -> str:
        best = "n/a" if pd.isna(r.best_accuracy) else f"{r.best_accuracy:.0%}"
        if pd.isna(r.min_paper_gflops):
            return f"- (best {best})"
        accuracy = "" if pd.isna(r.accuracy) else f", {r.accuracy:.0%}"
        return f"{r.min_paper_gflops:.3g} / {r.min_exact_gflops:.3g} (D={r.width:.0f}{accuracy})"

    shown = table.assign(cell=table.apply(fmt, axis=1))
    pivot = shown.pivot_table(index=["task", "size", "L", "depth"], columns="arch", values="cell", aggfunc="first")
    return pivot.rename_axis(columns=None).reset_index()


def min_gflops_note(threshold: float) -> str:
    return (f"Minimum forward GFLOPs (paper convention / exact) of the smallest width D solved by every seed "
            f"(validation accuracy at or above {threshold:.0%}), with its mean test accuracy; one row per depth. "
            "'-' = no width solved (best measured test accuracy in brackets).")


MARKS = {"diverged": "div", "failed": "fail"}


def heatmap(cells: pd.DataFrame, task: str, arch: str, depth: int, path: Path) -> None:
    """Accuracy by width and size; a cell no seed measured is hatched and labelled with its inferred verdict."""
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
            if not cell.measured:
                ax.add_patch(plt.Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, hatch="///", edgecolor="0.6"))
                ax.text(x, y, "solved\n(inferred)" if cell.solved else "unsolved\n(inferred)", ha="center",
                        va="center", fontsize=6, color="0.3")
                continue
            value = cell.accuracy
            mark = next((m for status, m in MARKS.items() if status in cell.statuses), "")
            label = f"{value:.2f}" if pd.notna(value) else ""
            ax.text(x, y, f"{label} {mark}".strip() + ("*" if cell.solved == cell.seeds else ""), ha="center",
                    va="center", fontsize=8, color="white" if pd.isna(value) or value < 0.6 else "black")
    fig.colorbar(image, ax=ax, fraction=0.05, label="test accuracy")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def page(cfg: config_mod.Config, table: pd.DataFrame, figures: dict, best: pd.DataFrame, summary: dict) -> str:
    parts = [f"<!doctype html><meta charset='utf-8'><title>Capacity Atlas report: {cfg.profile}</title>",
             "<style>body{font-family:sans-serif;max-width:1200px;margin:auto}table{border-collapse:collapse;"
             "font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px}img{margin:4px}</style>",
             f"<h1>Capacity Atlas: profile <code>{cfg.profile}</code></h1>",
             f"<p>{summary['cells']} cells ({summary['measured']} trained, {summary['inferred']} inferred by the "
             f"width-frontier search), {summary['solved_cells']} solved; verdicts of the trained cells: "
             f"{html.escape(summary['verdicts'])}. MLflow parent run <code>{summary['mlflow_parent_run']}</code>. "
             f"Generated {time.strftime('%Y-%m-%d %H:%M')}.</p>",
             "<h2>Minimum GFLOPs at the accuracy threshold (DP paper, Table 2)</h2>",
             f"<p>{html.escape(min_gflops_note(cfg.report.accuracy_threshold))}</p>",
             min_gflops_pivot(best).to_html(index=False), "<h2>Accuracy heatmaps (DP paper, Figure 1 layout)</h2>",
             "<p>Test accuracy, mean over seeds; * = solved (validation at the threshold) by every seed; hatched = "
             "inferred by the frontier search, not trained; div / fail = a seed diverged / failed.</p>"]
    for task, images in figures.items():
        parts.append(f"<h3>{task}</h3>" + "".join(f"<img src='{name}' alt='{name}'>" for name in images))
    parts += ["<h2>Conventions</h2><ul>",
              "<li>Accuracy (mean over seeds): for chain-of-thought tasks, greedy decoding from the prompt with the "
              "model's cache, scoring only the token before the first &lt;eos&gt;; for classification tasks the "
              "label read out after the input; for eq_ncp, the share of strings whose prediction is right at "
              "every prefix.</li>",
              "<li>The separations paper samples a fresh batch every step; this pipeline pre-generates large "
              "datasets (profile <code>generate.train_samples</code>) instead. eq_random and eq_one have "
              "shortcuts (compare a prefix; count symbols); eq_ncp is the shortcut-free version.</li>",
              "<li>Paper GFLOPs: thop-style forward count over L + 2 tokens, 2 (L+2)(sum Linear in*out + 4D per "
              "LayerNorm); attention products are free. Exact GFLOPs: every matmul of one forward pass over L "
              "tokens, attention under the architecture's real pattern.</li>",
              "<li>Our choices where the papers are silent: lis value range R = max(n+150, 2n+50); sparse local "
              "window k = 1 block; see conf/ for the grid and optimiser.</li>",
              "<li>Verdicts: a trial stops once its final-answer accuracy on the validation split (held out from "
              "train, never the test set) is at or above the threshold at <code>sweep.patience</code> consecutive "
              "checks (solved), when it plateaus or its budget ends (unsolved), or when its loss is not finite "
              "(diverged); failed = it raised. A cell is its best learning rate, chosen on validation.</li></ul>",
              "<h2>All cells</h2>", table.to_html(index=False, float_format=lambda v: f"{v:.4g}")]
    return "\n".join(parts)


def report(cfg: config_mod.Config, results: Path, out_dir: Path, metrics_path: Path, log_mlflow: bool = True) -> dict:
    table = load_results(results)
    threshold = cfg.report.accuracy_threshold
    cells = cell_means(table)
    best = min_gflops(table)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    figures: dict[str, list[str]] = {}
    for (task, arch, depth), _ in cells.groupby(["task", "arch", "depth"]):
        name = f"heatmap_{task}_{arch}_d{depth}.png"
        heatmap(cells, task, arch, depth, tmp / name)
        figures.setdefault(task, []).append(name)
    best_md = min_gflops_note(threshold) + "\n\n" + min_gflops_pivot(best).to_markdown(index=False) + "\n"
    best.to_csv(tmp / "min_gflops.csv", index=False)
    (tmp / "min_gflops.md").write_text(best_md)
    table.to_csv(tmp / "results.csv", index=False)
    measured = table[table.measured]
    parent = str(table.parent_run_id.iloc[0])
    summary = {"profile": cfg.profile, "cells": len(table), "measured": len(measured),
               "inferred": len(table) - len(measured), "solved_cells": int((table.status == "solved").sum()),
               "failed": int((measured.status == "failed").sum()),
               "verdicts": ", ".join(f"{n} {status}" for status, n in measured.status.value_counts().items()),
               "cells_at_threshold": int((measured.final_accuracy >= threshold).sum()),
               "mean_final_accuracy": round(float(measured.final_accuracy.mean()), 4) if len(measured) else None,
               "mlflow_parent_run": parent,
               "min_paper_gflops": {f"{r.task}_{r.size}_{r.arch}_d{r.depth}": (None if pd.isna(r.min_paper_gflops)
                                                                               else float(r.min_paper_gflops))
                                    for r in best.itertuples()}}
    (tmp / "index.html").write_text(page(cfg, table, figures, best, summary))
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)  # the report appears whole or not at all
    metrics_path.parent.mkdir(parents=True, exist_ok=True)
    metrics_path.write_text(json.dumps(summary, indent=2) + "\n")
    if log_mlflow:
        from mlflow.tracking import MlflowClient

        from pipeline.tracking import check_mlflow

        uri = cfg.cluster.mlflow()
        check_mlflow(uri)
        client = MlflowClient(uri)
        client.log_artifacts(parent, str(out_dir), "report")
        client.log_metric(parent, "solved_cells", summary["solved_cells"])
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.report", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    root = config_mod.ROOT
    ap.add_argument("--params", default=str(root / "params.yaml"), help="params file (default: %(default)s)")
    ap.add_argument("--results", default=str(root / "results" / "sweep.csv"), help="sweep table (default: %(default)s)")
    ap.add_argument("--out", default=str(root / "report"), help="report directory (default: %(default)s)")
    ap.add_argument("--metrics", default=str(root / "results" / "report.json"), help="metrics file (default: %(default)s)")
    ap.add_argument("--no-mlflow", action="store_true", help="do not log the report to the MLflow parent run")
    args = ap.parse_args(argv)
    from pipeline.tracking import ServiceError

    try:
        summary = report(config_mod.load(args.params), Path(args.results), Path(args.out), Path(args.metrics),
                         log_mlflow=not args.no_mlflow)
    except (config_mod.ConfigError, ReportError, ServiceError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"report: {args.out}/index.html; {summary['solved_cells']} of {summary['cells']} cells solved")
    return 0


if __name__ == "__main__":
    sys.exit(main())
