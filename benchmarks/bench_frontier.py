"""The width-frontier search against the full grid, on one real small grid, side by side in one run.

    python -m benchmarks.bench_frontier            (about 6 minutes on 2 cores)
    python -m benchmarks.bench_frontier --quick    (a minute: 2 sizes x 4 widths, 100 steps; checks the wiring)
    python -m benchmarks.bench_frontier --replay results/trials.csv --slots 8     (seconds: nothing is trained)

Runs the real sweep stage (Ray Tune, Lightning, a scratch SQLite MLflow, no reuse) three times on the same data
and seeds: the full grid with fixed budgets (every trial runs all its steps; the verdict still records whether
and when it was solved), the full grid stopping each trial once solved, and the frontier search stopping once
solved. Prints trials trained, total training PFLOPs, wall seconds, and whether each minimum-width table equals
the fixed-budget grid's. No budget is extended and no trial is judged converged before its budget ends, in all
three, so that a trial's verdict cannot depend on the mode: a trial stopped once solved follows the same steps as
its fixed-budget twin up to that point, and one that is not is judged at its budget's end by the same rule.

``--replay TRIALS`` trains nothing: it replays every strategy (``pipeline/search/frontier.py``'s plans) over the
trials a grid sweep recorded (its ``results/trials.csv``, ``pipeline/search/replay.py``), scheduled on ``--slots``
slots, and prints for each: trials, training PFLOPs, wall time, and whether its table equals the full grid's.

The figures go to ``docs/benchmarks/bench_frontier.json`` (``--out``; a ``--quick`` run writes none unless given),
with the command line, date and commit (``benchmarks/results.py``). Each is one run: the FLOPs are exact counts, the
wall seconds a single timing.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import yaml

os.environ.setdefault("OMP_NUM_THREADS", "1")

from benchmarks.results import Results, figure, out_option, out_path  # noqa: E402
from pipeline.common import config as config_mod  # noqa: E402
from pipeline.generate import generate_task  # noqa: E402
from pipeline.reporting.tables import min_gflops  # noqa: E402
from pipeline.search.frontier import PLANS  # noqa: E402
from pipeline.search.replay import load_trials, replay  # noqa: E402
from pipeline.sweep import sweep  # noqa: E402

GRID = {  # lis n = 4, 5, 6 x 5 widths: the minimum width grows with n on this CPU budget
    "generate": {"train_samples": 20000, "test_samples": 500, "datasets": {"lis": [4, 5, 6]}},
    "sweep": {"architectures": ["standard"], "widths": [8, 16, 24, 32, 48], "depths": [2], "seeds": [0],
              "heads": 4, "batch_size": 128, "epochs": 100, "max_steps": 800, "lr": 3e-3, "warmup_fraction": 0.1,
              "val_every_steps": 50, "val_samples": 256, "eval_samples": 500, "patience": 2,
              "convergence_min_steps": 800, "max_budget_factor": 1, "reuse": False},
}
QUICK = {  # toy sizes; the toy models plateau at 41-59% (lis 3) and 28-49% (lis 4): 52% splits them
    "generate": {"train_samples": 3000, "test_samples": 200, "datasets": {"lis": [3, 4]}},
    "sweep": {"architectures": ["standard"], "widths": [8, 16, 32, 64], "depths": [1], "seeds": [0], "epochs": 2,
              "max_steps": 100,
              "val_every_steps": 10, "val_samples": 128, "eval_samples": 200, "patience": 1,
              "convergence_min_steps": 100, "max_budget_factor": 1, "reuse": False},
    "report": {"accuracy_threshold": 0.52},
}
MODES = {"grid, fixed budget": {"search": "grid", "stop_when_solved": False},
         "grid, stop when solved": {"search": "grid", "stop_when_solved": True},
         "frontier, stop when solved": {"search": "frontier", "stop_when_solved": True}}


def load(work: Path, grid: dict, mode: dict) -> config_mod.Config:
    params = {"profile": "tiny", "tasks": ["lis"], "generate": grid["generate"], "sweep": grid["sweep"] | mode,
              "report": grid.get("report", {}), "cluster": {"mlflow_tracking_uri": f"sqlite:///{work / 'mlflow.db'}"}}
    path = work / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return config_mod.load(path)


def run_modes(grid: dict, work: Path) -> dict[str, dict]:
    """Every mode of ``MODES`` on the same data: trials trained, training PFLOPs, wall seconds, min-width table."""
    cfg = load(work, grid, {})
    generate_task(cfg, "lis", work / "data", check=False)
    out = {}
    for name, mode in MODES.items():
        cfg = load(work, grid, mode)
        start = time.perf_counter()
        table = sweep(cfg, work / "data", work / name.replace(" ", "_").replace(",", ""))
        trained = table[table.measured]
        out[name] = {"trials": len(trained), "pflops": float(trained.train_pflops.sum()),
                     "wall": time.perf_counter() - start, "cells": table,
                     "table": min_gflops(table)[["task", "size", "depth", "arch", "width", "min_paper_gflops",
                                                 "min_exact_gflops"]].reset_index(drop=True)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_frontier", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a toy grid, to check the wiring in seconds")
    ap.add_argument("--replay", type=Path, metavar="TRIALS", help="a grid sweep's trials.csv to replay, untrained")
    ap.add_argument("--slots", type=int, default=2, help="trial slots of the replay (default: %(default)s)")
    out_option(ap, "bench_frontier")
    args = ap.parse_args(argv)
    if args.replay:
        return replayed(args, argv)
    grid = QUICK if args.quick else GRID
    with tempfile.TemporaryDirectory(prefix="bench-frontier-") as tmp:
        modes = run_modes(grid, Path(tmp))
    reference = modes["grid, fixed budget"]
    res = Results("bench_frontier", argv)
    settings = {"datasets": grid["generate"]["datasets"], "train_samples": grid["generate"]["train_samples"],
                **{k: grid["sweep"][k] for k in ("architectures", "widths", "depths", "seeds", "max_steps")}}
    figures = res.section("modes", settings)
    for name, m in modes.items():
        figures[name] = {"trials": m["trials"], "train_pflops": figure(m["pflops"], "PFLOP"),
                         "fixed_grid_over_mode": figure(reference["pflops"] / m["pflops"], "x"),
                         "wall_s": figure(m["wall"], "s"), "same_table": bool(m["table"].equals(reference["table"])),
                         "min_widths": m["table"][["task", "size", "depth", "arch", "width"]].to_dict("records")}
    print(f"\nlis n={grid['generate']['datasets']['lis']} x widths {grid['sweep']['widths']}, standard, depth "
          f"{grid['sweep']['depths']}, {grid['sweep']['max_steps']} steps budget, 1 seed\n")
    print(f"{'mode':28} {'trials':>6} {'train PFLOPs':>13} {'fixed grid / this':>17} {'wall s':>7}  same table")
    for name, m in modes.items():
        same = m["table"].equals(reference["table"])
        print(f"{name:28} {m['trials']:6d} {m['pflops']:13.5f} {reference['pflops'] / m['pflops']:16.2f}x "
              f"{m['wall']:7.1f}  {same}")
    print("\nsmallest solved width per size (fixed-budget grid):")
    print(reference["table"].to_string(index=False))
    print("\nsmallest solved width per size (frontier):")
    print(modes["frontier, stop when solved"]["table"].to_string(index=False))
    res.write(out_path(args, "bench_frontier"))
    return 0


def replayed(args: argparse.Namespace, argv: list[str] | None) -> int:
    """Every strategy over a recorded grid's trials, side by side; the grid's replay is the reference."""
    recorded = load_trials(args.replay)
    runs = {name: replay(plan(list(recorded)), recorded, args.slots) for name, plan in PLANS.items()}
    reference = runs["grid"]
    res = Results("bench_frontier", argv)
    figures = res.section("replay", {"trials_csv": str(args.replay), "slots": args.slots, "cells": len(recorded)})
    print(f"\n{args.replay}: {len(recorded)} cells, {sum(map(len, recorded.values()))} trials recorded; "
          f"{args.slots} slots\n")
    print(f"{'strategy':10} {'trials':>6} {'train PFLOPs':>13} {'grid / this':>11} {'wall s':>8}  same table")
    for name, run in runs.items():
        ratio = reference.pflops / run.pflops if run.pflops else float("nan")
        same = run.table == reference.table
        print(f"{name:10} {run.trials:6d} {run.pflops:13.5f} {ratio:10.2f}x {run.wall:8.1f}  {same}")
        figures[name] = {"trials": run.trials, "train_pflops": figure(run.pflops, "PFLOP"),
                         "grid_over_strategy": figure(ratio, "x"), "wall_s": figure(run.wall, "s"), "same_table": same}
    if args.out is not None:
        res.write(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
