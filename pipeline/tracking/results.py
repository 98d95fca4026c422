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
Each file is written whole or not at all (``write_atomic``). What a sweep found travels as one ``SweepResult``, and
``record`` writes it through one writer for each destination (``to_mlflow``, ``to_files``, ``to_console``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE

from pipeline.common.cell import CellSpec
from pipeline.common.config import Config
from pipeline.common.status import Status, borderline_rows
from pipeline.search.frontier import Outcome, Plan
from pipeline.search.searcher import CellSearcher
from pipeline.tracking.parent import SweepRun
from pipeline.tracking.runs import ChildRuns
from pipeline.tracking.services import ui_link
from pipeline.training.metrics import CELL_METRICS, TRIAL_METRICS

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


def summarise(cfg: Config, run: SweepRun, table: pd.DataFrame, trials: pd.DataFrame, plan: Plan, slots: int) -> dict:
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
        "wall_seconds": round(time.time() - run.started, 1),
        # share of the Ray slots' time, from the stage's start, spent training and scoring
        "slot_utilisation": round(busy / (slots * (time.time() - run.stage_start)), 3) if slots else None,
        "mlflow_parent_run": run.parent,
    }


@dataclass(frozen=True)
class SweepResult:
    """A sweep's result record: what it found, as ``record`` writes it to MLflow, the files and the console."""

    table: pd.DataFrame  # results/sweep.csv: a row a cell
    trials: pd.DataFrame  # results/trials.csv: a row a trial
    curves: pd.DataFrame  # results/curves.csv: each trial's validations
    summary: dict  # results/sweep.json: the headline counts and costs
    plan: Plan  # its contradictions and prediction misses
    mlflow_errors: list[str]  # MLflow writes that failed (the files have every result)


def record(run: SweepRun, result: SweepResult) -> None:
    """The outputs: MLflow's parent run, the four files (each written whole or not at all), the console."""
    to_mlflow(run, result)
    to_files(run.out_dir, result)
    to_console(run.parent, result)


def to_mlflow(run: SweepRun, result: SweepResult) -> None:
    """Metrics, the per-cell table (an MLflow table, which the UI shows as one), the reused runs with links and the
    plan's notes, on the parent run."""
    client, parent, trials = run.client, run.parent, result.trials
    for name, value in result.summary.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            client.log_metric(parent, name, value)
    client.log_table(parent, result.table.astype(object).where(result.table.notna(), None), TABLE)
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
    if result.plan.contradictions:
        client.log_text(parent, "\n".join(result.plan.contradictions) + "\n", "contradictions.txt")
    if result.plan.misses:
        client.log_text(parent, "\n".join(result.plan.misses) + "\n", "prediction_misses.txt")


def to_files(out_dir: Path, result: SweepResult) -> None:
    write_atomic(out_dir / "trials.csv", result.trials.to_csv(index=False))
    write_atomic(out_dir / "curves.csv", result.curves.to_csv(index=False))
    write_atomic(out_dir / "sweep.csv", result.table.to_csv(index=False))
    notes = {"contradiction_notes": result.plan.contradictions, "prediction_miss_notes": result.plan.misses}
    write_atomic(out_dir / "sweep.json", json.dumps(result.summary | notes, indent=2) + "\n")


def to_console(parent: str, result: SweepResult) -> None:
    shown = [*ORDER, "measured", "status", "lr", "final_accuracy", "paper_gflops"]
    print(result.table[shown].to_string(index=False))
    for note in result.plan.contradictions:
        print(f"contradiction: {note}")
    for note in result.plan.misses:
        print(f"prediction missed: {note}")
    print(json.dumps(result.summary))
    if result.mlflow_errors:
        first = "\n  ".join(result.mlflow_errors[:5])
        print(
            f"warning: {len(result.mlflow_errors)} MLflow writes failed (the results files have every result):\n"
            f"  {first}",
            file=sys.stderr,
        )
    if result.summary["failed"]:
        print(
            f"warning: {result.summary['failed']} of {len(result.trials)} trials failed; they are in "
            f"results/trials.csv with their errors, and under MLflow parent run {parent}",
            file=sys.stderr,
        )
