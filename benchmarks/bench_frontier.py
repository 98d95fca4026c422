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

``--replay TRIALS`` trains nothing: it replays every strategy (the grid, the frontier, the frontier with predicted
widths, each with and without successive halving of the learning rates) over the trials a grid sweep recorded
(its ``results/trials.csv`` and ``results/curves.csv``, ``pipeline/search/replay.py``), scheduled on ``--slots``
slots, and prints for each: trials, training PFLOPs, wall and slot hours, the slot hours saved against the grid,
prediction misses, dropped learning rates, and whether its table equals the full grid's. ``--synthetic paper``
(or ``separations``) replays them on a synthetic grid of that profile's shape (``benchmarks/synthetic_grids.py``:
the papers' frontiers drawn with noise, made-up curves; not a measurement of any model).

    python -m benchmarks.bench_frontier --synthetic separations --slots 64      (about 30 s)

The figures go to ``docs/benchmarks/bench_frontier.json`` (``--out``; a ``--quick`` run writes none unless given),
with the command line, date and commit (``benchmarks/results.py``). Each is one run: the FLOPs are exact counts, the
wall seconds a single timing.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

os.environ.setdefault("OMP_NUM_THREADS", "1")

from benchmarks import synthetic_grids  # noqa: E402
from benchmarks.results import Results, figure, out_option, out_path  # noqa: E402
from pipeline.common import config as config_mod  # noqa: E402
from pipeline.generate import generate_task  # noqa: E402
from pipeline.reporting.tables import min_gflops  # noqa: E402
from pipeline.search.frontier import Cell, FrontierPlan, GridPlan, Plan  # noqa: E402
from pipeline.search.halving import Halving  # noqa: E402
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
    ap.add_argument("--synthetic", choices=("paper", "separations"),
                    help="replay on a synthetic grid of this profile's shape (benchmarks/synthetic_grids.py)")
    ap.add_argument("--seed", type=int, default=0, help="the synthetic grid's draw (default: %(default)s)")
    ap.add_argument("--gpu-tflops", type=float, default=100.0,
                    help="a synthetic slot's sustained TFLOP/s, for its hours (default: %(default)s)")
    ap.add_argument("--slots", type=int, default=2, help="trial slots of the replay (default: %(default)s)")
    ap.add_argument("--rungs", type=int, nargs="+", help="halving rungs in steps (default: the profile's, or 1/8, "
                    "1/4, 1/2 of the budget)")
    ap.add_argument("--keep", type=float, default=0.5, help="halving: fraction kept per rung (default: %(default)s)")
    out_option(ap, "bench_frontier")
    args = ap.parse_args(argv)
    if args.replay or args.synthetic:
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


def strategies(halving: Halving) -> dict[str, tuple[Callable[[list[Cell]], Plan], Halving | None]]:
    """Every search strategy: a plan and, or not, successive halving of the learning rates."""
    predict = ["seeds", "sizes", "neighbours"]
    return {
        "grid": (GridPlan, None),
        "frontier": (FrontierPlan, None),
        "frontier+predict": (lambda cells: FrontierPlan(cells, predict), None),
        "frontier+halving": (FrontierPlan, halving),
        "frontier+predict+halving": (lambda cells: FrontierPlan(cells, predict), halving),
    }


def default_rungs(budget: int, every: int) -> tuple[int, ...]:
    """Rungs at 1/8, 1/4 and 1/2 of the first budget, on validations."""
    return tuple(sorted({max(every, budget // k // every * every) for k in (8, 4, 2)}))


def replayed(args: argparse.Namespace, argv: list[str] | None) -> int:
    """Every strategy over a recorded grid (a sweep's trials.csv and curves.csv, or a synthetic paper-shaped one),
    side by side; the grid's replay (every learning rate to its verdict) is the reference."""
    if args.synthetic:
        cfg = config_mod.load(config_mod.ROOT / "params.yaml", profile=args.synthetic)
        recorded = synthetic_grids.grid(args.synthetic, seed=args.seed, gpu_tflops=args.gpu_tflops)
        source = f"synthetic {args.synthetic} grid (draw {args.seed}, {args.gpu_tflops:g} TFLOP/s per slot)"
    else:
        cfg = None
        recorded = load_trials(args.replay)
        source = str(args.replay)
    s = cfg.sweep if cfg else None
    if args.rungs:
        rungs = tuple(args.rungs)
    elif s is not None and s.halving_rungs:
        rungs = tuple(s.halving_rungs)
    else:
        steps = max(r.steps for runs in recorded.values() for r in runs.values())
        every = min((c[1][0] - c[0][0] for runs in recorded.values() for r in runs.values() if len(c := r.curve) > 1),
                    default=1)
        budget = s.max_steps if s is not None and s.max_steps > 0 else steps
        rungs = default_rungs(budget, every)
    halving = Halving(rungs, args.keep)
    chosen = strategies(halving)
    if not all(r.curve for runs in recorded.values() for r in runs.values()):
        print("no curves.csv beside the trials: the strategies with halving are left out (they need validations)")
        chosen = {name: strategy for name, strategy in chosen.items() if strategy[1] is None}
    runs = {name: replay(plan(list(recorded)), recorded, args.slots, h) for name, (plan, h) in chosen.items()}
    reference = runs["grid"]
    res = Results("bench_frontier", argv)
    settings = {"source": source, "slots": args.slots, "cells": len(recorded), "rungs": list(rungs), "keep": args.keep,
                "trials": sum(map(len, recorded.values()))}
    figures = res.section(f"replay {args.synthetic or 'recorded'}", settings)
    print(f"\n{source}: {len(recorded)} cells, {settings['trials']} (cell, learning rate) trials recorded; "
          f"{args.slots} slots; halving rungs {list(rungs)}, keep {args.keep:g}\n")
    print(f"{'strategy':25} {'trials':>6} {'starts':>6} {'train PFLOPs':>13} {'grid / this':>11} {'wall h':>7} "
          f"{'slot-h':>8} {'saved slot-h':>12} {'misses':>6} {'dropped':>7}  same table")
    for name, run in runs.items():
        ratio = reference.pflops / run.pflops if run.pflops else float("nan")
        same = run.table == reference.table
        print(f"{name:25} {run.trials:6d} {run.attempts:6d} {run.pflops:13.5g} {ratio:10.2f}x {run.wall / 3600:7.2f} "
              f"{run.busy / 3600:8.1f} {(reference.busy - run.busy) / 3600:12.1f} {run.misses:6d} {run.dropped:7d}  "
              f"{same}")
        figures[name] = {"trials": run.trials, "starts": run.attempts, "train_pflops": figure(run.pflops, "PFLOP"),
                         "grid_over_strategy": figure(ratio, "x"), "wall_s": figure(run.wall, "s"),
                         "slot_hours": figure(run.busy / 3600, "h"),
                         "slot_hours_saved": figure((reference.busy - run.busy) / 3600, "h"), "misses": run.misses,
                         "dropped": run.dropped, "same_table": same,
                         "differs": [f"{k}: {reference.table[k]} -> {run.table.get(k)}" for k in reference.table
                                     if run.table.get(k) != reference.table[k]][:20]}
        for line in figures[name]["differs"][:3]:
            print(f"    table differs: {line}")
    if args.out is not None:
        res.write(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
