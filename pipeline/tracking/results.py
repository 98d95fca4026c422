"""What a sweep records when it ends: its tables and headline, as files and on the MLflow parent run.

- ``results/trials.csv`` (``trial_table``): one row per learning-rate run, trained now or reused (its MLflow run is
  then the original's, under the sweep that trained it);
- ``results/sweep.csv`` (``cell_table``): one row per cell of the grid, measured (its best run) or inferred by the
  plan, with its verdict, reason, test accuracy, costs and whether the verdict is borderline;
- ``results/curves.csv`` (``curve_table``): every validation of every run trained now (step, validation accuracy
  and loss, training PFLOPs so far), what ``python -m benchmarks.bench_frontier --replay`` replays strategies on;
- ``results/sweep.json`` (``summarise``): the headline counts and costs, also the parent run's metrics.
The per-cell table is also logged to the parent run as an MLflow table (``TABLE``), and so are the reused trials
with links to their runs (``REUSED``): the parent of a sweep that trained nothing has no child runs.
Each file is written whole or not at all (``write_atomic``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pandas as pd
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE

from pipeline.common.cell import CellSpec
from pipeline.common.config import Config
from pipeline.common.status import Status, borderline_rows
from pipeline.search.frontier import Outcome, Plan
from pipeline.search.searcher import CellSearcher
from pipeline.tracking.runs import ChildRuns
from pipeline.tracking.services import ui_link
from pipeline.training.train import CELL_METRICS, TRIAL_METRICS

TRIAL_KEYS = ("node", *TRIAL_METRICS)  # trials.csv only
CELL_KEYS = ("cell_id", "task", "size", "max_len", "arch", "width", "depth", "seed", "data_hash")
ORDER = ["task", "size", "arch", "width", "depth", "seed"]  # rows of both tables
TABLE = "tables/sweep.json"  # the per-cell table on the parent run, as an MLflow table
REUSED = "tables/reused.json"  # the reused trials on the parent run, each with a link to its (original) run


def cell_row(cell: CellSpec, outcome: Outcome, best: dict | None) -> dict:
    """One row of results/sweep.csv: a measured cell's best learning-rate run, or an inferred cell."""
    row = {k: getattr(cell, k) for k in CELL_KEYS} | {"measured": outcome.measured}
    if best is None:
        row |= {"status": outcome.status, "reason": outcome.reason, "lr": None}
        row |= {k: getattr(cell, k, None) for k in CELL_METRICS}
    else:
        row |= {"status": best["status"], "reason": best.get("reason", ""), "lr": best["lr"]}
        row |= {k: best.get(k, getattr(cell, k, None)) for k in CELL_METRICS}
        row["mlflow_run_id"] = best.get("mlflow_run_id")
    return row | {"lrs": " ".join(f"{lr:g}" for lr in cell.lrs)}


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def trial_table(searcher: CellSearcher, cells: dict, children: ChildRuns) -> pd.DataFrame:
    """results/trials.csv: one row per learning-rate run, trained now (with its MLflow run and, if it raised, its
    error) or reused (with the run it was taken from, in both ``mlflow_run_id`` and ``reused_from``)."""
    runs = []
    for cell_key, by_lr in searcher.runs.items():
        for run in by_lr.values():
            trial = run.get("trial_id")
            if trial is not None:
                run.setdefault("mlflow_run_id", children.by_key.get(run["trial_key"]))
                if run["status"] == Status.FAILED:
                    run["reason"] = children.errors.get(trial, run["reason"])
            runs.append(
                {k: getattr(cells[cell_key], k) for k in CELL_KEYS}
                | {
                    "lr": run["lr"],
                    "status": run["status"],
                    "reason": run.get("reason", ""),
                    "reused_from": run.get("reused_from"),
                }
                | {k: run.get(k) for k in CELL_METRICS + TRIAL_KEYS}
                | {
                    "restarts": children.restarts.get(trial, 0) if trial is not None else 0,
                    "mlflow_run_id": run.get("mlflow_run_id"),
                }
            )
    return pd.DataFrame(runs).sort_values([*ORDER, "lr"])


def curve_table(searcher: CellSearcher) -> pd.DataFrame:
    """results/curves.csv: one row per validation of every (cell, learning rate) run trained now."""
    rows = [
        cell._asdict() | {"lr": lr, "step": step} | point
        for (cell, lr), points in searcher.curves.items()
        for step, point in sorted(points.items())
    ]
    columns = [*ORDER, "lr", "step", "val_accuracy", "val_loss", "train_pflops"]
    return pd.DataFrame(rows, columns=columns).sort_values([*ORDER, "lr", "step"])


def cell_table(searcher: CellSearcher, cells: dict, threshold: float) -> pd.DataFrame:
    """results/sweep.csv: one row per cell of the grid, measured (its best run) or inferred by the plan; a
    decided cell whose test accuracy could lie on the other side of ``threshold`` is ``borderline``."""
    rows = [cell_row(cells[c], o, searcher.best(c)) for c, o in searcher.plan.outcomes().items()]
    table = pd.DataFrame(rows).sort_values(ORDER)
    return table.assign(borderline=borderline_rows(table, threshold))


def summarise(
    cfg: Config,
    table: pd.DataFrame,
    trials: pd.DataFrame,
    plan: Plan,
    started: float,
    stage_start: float,
    slots: int,
    parent: str,
) -> dict:
    """results/sweep.json: the headline counts and costs."""
    measured = table[table.measured]
    reused = int(trials.reused_from.notna().sum())
    trained = trials[trials.reused_from.isna()]
    busy = float((trained.train_seconds.fillna(0) + trained.eval_seconds.fillna(0)).sum())
    return {
        "profile": cfg.profile,
        "search": cfg.sweep.search.strategy,
        "cells": len(table),
        "measured": len(measured),
        "inferred": int((~table.measured).sum()),
        "trials": len(trials),
        "trained": len(trials) - reused,
        "reused": reused,
        "failed": int((trials.status == Status.FAILED).sum()),
        "dropped": int((trials.status == Status.DROPPED).sum()),
        "diverged": int((trials.status == Status.DIVERGED).sum()),
        "restarts": int(trials.restarts.sum()),
        "resumed": int(trials.resumed_step.notna().sum()),
        "solved_cells": int((table.status == Status.SOLVED).sum()),
        "undecided_cells": int((table.status == Status.UNDECIDED).sum()),
        "borderline_cells": int(table.borderline.sum()),
        "mean_final_accuracy": round(float(measured.final_accuracy.mean()), 4) if len(measured) else None,
        "train_pflops": round(float(trials.train_pflops.sum()), 6),
        "contradictions": len(plan.contradictions),
        "prediction_misses": len(plan.misses),
        "wall_seconds": round(time.time() - started, 1),
        # share of the Ray slots' time, from the stage's start, spent training and scoring
        "slot_utilisation": round(busy / (slots * (time.time() - stage_start)), 3) if slots else None,
        "mlflow_parent_run": parent,
    }


def record(
    client: MlflowClient,
    parent: str,
    out_dir: Path,
    table: pd.DataFrame,
    trials: pd.DataFrame,
    curves: pd.DataFrame,
    summary: dict,
    plan: Plan,
    mlflow_errors: list[str],
) -> None:
    """The outputs: metrics and the per-cell table (an MLflow table, which the UI shows as one) on the parent run,
    the three files (each written whole or not at all), the console."""
    for name, value in summary.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            client.log_metric(parent, name, value)
    client.log_table(parent, table.astype(object).where(table.notna(), None), TABLE)
    reused = trials[trials.reused_from.notna()]
    if len(reused):
        experiment = client.get_run(parent).info.experiment_id
        listed = reused[["cell_id", *ORDER, "lr", "status", "final_accuracy", "mlflow_run_id"]]
        listed = listed.assign(link=[ui_link(client.tracking_uri, experiment, run) for run in listed.mlflow_run_id])
        client.log_table(parent, listed.astype(object).where(listed.notna(), None), REUSED)
        note = (
            f"{len(reused)} of {len(trials)} trials were finished by earlier sweeps of this experiment with the same "
            f"data, settings and code: reused, not trained again. `{REUSED}` lists their runs (each under the sweep "
            f"that trained it) with links; `{TABLE}` names every cell's run."
        )
        client.set_tag(parent, MLFLOW_RUN_NOTE, note)  # the run's description in the UI
    contradictions, misses = plan.contradictions, plan.misses
    if contradictions:
        client.log_text(parent, "\n".join(contradictions) + "\n", "contradictions.txt")
    if misses:
        client.log_text(parent, "\n".join(misses) + "\n", "prediction_misses.txt")
    write_atomic(out_dir / "trials.csv", trials.to_csv(index=False))
    write_atomic(out_dir / "curves.csv", curves.to_csv(index=False))
    write_atomic(out_dir / "sweep.csv", table.to_csv(index=False))
    notes = {"contradiction_notes": contradictions, "prediction_miss_notes": misses}
    write_atomic(out_dir / "sweep.json", json.dumps(summary | notes, indent=2) + "\n")
    shown = [*ORDER, "measured", "status", "lr", "final_accuracy", "paper_gflops"]
    print(table[shown].to_string(index=False))
    for note in contradictions:
        print(f"contradiction: {note}")
    for note in misses:
        print(f"prediction missed: {note}")
    print(json.dumps(summary))
    if mlflow_errors:
        first = "\n  ".join(mlflow_errors[:5])
        print(
            f"warning: {len(mlflow_errors)} MLflow writes failed (the results files have every result):\n  {first}",
            file=sys.stderr,
        )
    if summary["failed"]:
        print(
            f"warning: {summary['failed']} of {len(trials)} trials failed; they are in results/trials.csv "
            f"with their errors, and under MLflow parent run {parent}",
            file=sys.stderr,
        )
