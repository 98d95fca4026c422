"""How often is "unsolved" wrong? Re-train every cell a finished sweep called unsolved with 4x the steps and no
early stop, and count the verdicts that flip to solved.

    python -m benchmarks.bench_verdicts                               (the last `dvc repro`'s results/)
    python -m benchmarks.bench_verdicts --sweep old=OLD/results@OLD/params.yaml --sweep new=results

Each ``--sweep LABEL=DIR[@PARAMS]`` is a finished sweep's results directory (its ``sweep.csv``), made from the
datasets in ``--data`` with the grid and settings of ``PARAMS`` (default ``--params``: this repo's
``params.yaml``; profiles are read from this repo's conf/). For every measured cell whose best
run ended unsolved, the cell's winning learning rate is re-trained from scratch with the same seed and data for 4x
(``--factor``) the steps that run trained, with no convergence stop and no budget extension (it still stops once
solved: a flip is a flip wherever it happens). Cells ended undecided are not verdicts of incapacity and are not
re-trained; they are counted beside.

A re-trained trial never judges convergence (its ``convergence_min_steps`` is out of reach), so one not solved
within its steps ends ``undecided``: read ``retrain_status`` as solved or not.

Prints, per sweep and per reason of its unsolved verdicts (the first word of the reason: ``converged`` under
today's rules; ``plateau`` and ``budget`` under the rules before them), how many were re-trained and how many
flipped, side by side. The per-cell figures and the totals go to ``docs/benchmarks/bench_verdicts.json``
(``--out``). Trials run ``--slots`` at a time, one CPU thread each.
"""

from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pandas as pd  # noqa: E402

from benchmarks.results import Results, out_option, out_path  # noqa: E402
from pipeline.common.cell import Cell  # noqa: E402
from pipeline.common.config import ROOT, Config, load_config  # noqa: E402
from pipeline.search.cells import build_cells  # noqa: E402
from pipeline.training.settings import TrainSettings  # noqa: E402
from pipeline.training.train import TrialSpec, run_trial  # noqa: E402

KEYS = ["task", "size", "arch", "width", "depth", "seed"]
NO_STOP = 10**9  # convergence_min_steps that no re-trained trial reaches: only a solve ends it early


def reason_kind(reason: str) -> str:
    """``converged``, ``plateau``, ``budget``, ...: the word a verdict's reason starts with."""
    return str(reason).split(":")[0].split()[0] if isinstance(reason, str) and reason.strip() else "unknown"


def unsolved_cells(table: pd.DataFrame) -> pd.DataFrame:
    """The measured cells a sweep called unsolved, with the reason's kind."""
    mine = table[table.measured & (table.status == "unsolved")]
    return mine.assign(kind=[reason_kind(r) for r in mine.reason])


def retrain(spec: TrialSpec) -> dict:
    result = run_trial(spec)
    keys = ("status", "reason", "final_accuracy", "val_accuracy", "train_steps", "solve_step", "train_seconds")
    return {k: result[k] for k in keys}


def specs(cfg: Config, data: Path, rows: pd.DataFrame, factor: int) -> list[TrialSpec]:
    """The re-training of each row: its cell, seed and learning rate, ``factor`` x its steps, no early stop but
    the solve."""
    cells = build_cells(cfg, data)
    train = TrainSettings.of(cfg).params() | {"max_budget_factor": 1, "convergence_min_steps": NO_STOP,
                                              "stop_when_solved": True, "epochs": NO_STOP, "threads": 1,
                                              "workers": 1, "use_gpu": False}
    out = []
    for r in rows.itertuples():
        cell = cells[Cell(r.task, int(r.size), r.arch, int(r.width), int(r.depth), int(r.seed))]
        out.append(TrialSpec.for_cell(cell, train | {"lr": float(r.lr), "max_steps": factor * int(r.train_steps)}))
    return out


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per reason: unsolved verdicts re-trained, how many flipped to solved, the share."""
    by = rows.groupby("kind").agg(unsolved=("flipped", "size"), flipped=("flipped", "sum"))
    by.loc["all"] = [len(rows), int(rows.flipped.sum())]
    return by.assign(share=by.flipped / by.unsolved.where(by.unsolved > 0))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_verdicts", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", action="append", metavar="LABEL=DIR[@PARAMS]",
                    help="a finished sweep's results directory (repeat: side by side); default: new=results")
    ap.add_argument("--data", type=Path, default=ROOT / "data", help="the datasets the sweeps trained on")
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    ap.add_argument("--profile", default=None, help="the profile the sweeps ran (default: params.yaml's)")
    ap.add_argument("--factor", type=int, default=4, help="re-train with this many times the trial's steps")
    ap.add_argument("--slots", type=int, default=os.cpu_count() or 1, help="trials at once, one thread each")
    ap.add_argument("--limit", type=int, default=None, help="re-train at most this many cells per sweep")
    out_option(ap, "bench_verdicts", quick_note=False)
    args = ap.parse_args(argv)
    if args.factor < 1 or args.slots < 1:
        ap.error("--factor and --slots are at least 1")
    sweeps = {}
    for item in args.sweep or [f"new={ROOT / 'results'}"]:
        label, sep, where = item.partition("=")
        directory, _, params = where.partition("@")
        if not sep or not label or not directory:
            ap.error(f"--sweep {item!r}: give LABEL=DIR[@PARAMS], e.g. new=results")
        table_path = Path(directory) / "sweep.csv"
        if not table_path.is_file():
            ap.error(f"--sweep {item!r}: no sweep.csv in {directory} (run the sweep first)")
        sweeps[label] = (pd.read_csv(table_path), load_config(params or args.params, profile=args.profile))

    res = Results("bench_verdicts", argv)
    tables = {}
    for label, (table, cfg) in sweeps.items():
        rows = unsolved_cells(table).head(args.limit) if args.limit else unsolved_cells(table)
        undecided = int((table.measured & (table.status == "undecided")).sum())
        print(f"{label}: {len(rows)} unsolved cells to re-train with {args.factor}x their steps "
              f"({undecided} undecided, not re-trained)", file=sys.stderr, flush=True)
        with ProcessPoolExecutor(args.slots) as pool:
            results = list(pool.map(retrain, specs(cfg, args.data, rows, args.factor)))
        rows = rows.assign(
            steps=rows.train_steps.astype(int),
            retrain_steps=[r["train_steps"] for r in results],
            retrain_status=[r["status"] for r in results],
            retrain_accuracy=[r["final_accuracy"] for r in results],
            solve_step=[r["solve_step"] for r in results],
            flipped=[r["status"] == "solved" for r in results],
        )
        tables[label] = summary(rows)
        figures = res.section(label, {"factor": args.factor, "profile": cfg.profile, "undecided_cells": undecided})
        figures["by_reason"] = tables[label].reset_index().to_dict("records")
        figures["cells"] = rows[[*KEYS, "lr", "kind", "reason", "steps", "retrain_steps", "retrain_status",
                                 "retrain_accuracy", "solve_step", "final_accuracy"]].to_dict("records")
        print(f"\n{label}: unsolved verdicts re-trained with {args.factor}x the steps")
        print(rows[[*KEYS, "kind", "steps", "final_accuracy", "retrain_status", "solve_step",
                    "retrain_accuracy"]].to_string(index=False))
    print(f"\nunsolved verdicts that flip to solved with {args.factor}x the steps, per reason:")
    side = pd.concat(tables, names=["sweep", "reason"]).reset_index()
    print(side.to_string(index=False, formatters={"share": "{:.0%}".format}))
    res.write(out_path(args, "bench_verdicts"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
