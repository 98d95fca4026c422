"""Search strategies against the full grid: live on a real CPU grid, or replayed on recorded or synthetic ones.

    python -m benchmarks.bench_frontier            (about 30 minutes on 2 cores)
    python -m benchmarks.bench_frontier --quick    (a few minutes: toy sizes; checks the wiring)
    python -m benchmarks.bench_frontier --replay results/trials.csv --slots 8     (seconds: nothing is trained)

The live mode runs the real sweep stage (Ray Tune, Lightning, a scratch SQLite MLflow, no reuse) four times on the
same data and seeds, on a grid of 2 architectures (standard and linear attention) x 5 widths x 4 sizes of lis x 3
learning rates, every mode under the same verdict rules (stop once solved, converged below the threshold, budget
extended while improving): the grid with every learning rate to its verdict (the reference), the frontier, the
frontier with successive halving of the learning rates, and that with predicted widths too. It prints trials,
total training PFLOPs (summed over ``results/trials.csv``), wall seconds, dropped runs, and whether each
minimum-width table equals the grid's; then
replays every strategy on the grid's own recorded trials and curves, beside the live figures. A trial's verdict
cannot depend on the mode: its steps are the same wherever it runs (a run continued past a rung follows the steps
of one never paused), and each rule reads only the trial's own curve.

``--replay TRIALS`` trains nothing: it replays every strategy (the grid, the frontier, the frontier with predicted
widths, each with and without successive halving of the learning rates) over the trials a grid sweep recorded
(its ``results/trials.csv`` and ``results/curves.csv``, ``pipeline.search.replay``), scheduled on ``--slots``
slots, and prints for each: trials, training PFLOPs, wall and slot hours, the slot hours saved against the grid,
prediction misses, dropped learning rates, and whether its table equals the full grid's; and what an oracle that
knows every answer would still train to verify it (``replay.verified``). ``--synthetic paper``
(or ``separations``) replays them on a synthetic grid of that profile's shape (``benchmarks.synthetic_grids``:
the papers' frontiers drawn with noise, made-up curves; not a measurement of any model).

    python -m benchmarks.bench_frontier --synthetic separations --slots 64      (about 30 s)

The figures go to ``docs/benchmarks/bench_frontier.json`` (``--out``; a ``--quick`` run writes none unless given),
with the command line, date and commit (``benchmarks.results``). Each is one run: the FLOPs are exact counts, the
wall seconds a single timing.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

os.environ.setdefault("OMP_NUM_THREADS", "1")

from benchmarks import synthetic_grids  # noqa: E402
from benchmarks.results import Results, figure, out_option, out_path  # noqa: E402
from pipeline.common.cell import Cell  # noqa: E402
from pipeline.common.config import ROOT, Config, load_config, merge  # noqa: E402
from pipeline.common.status import Status  # noqa: E402
from pipeline.generate import generate_task  # noqa: E402
from pipeline.reporting.tables import min_gflops  # noqa: E402
from pipeline.scheduling.driver import sweep  # noqa: E402
from pipeline.search.frontier import FrontierPlan, GridPlan, Plan  # noqa: E402
from pipeline.search.halving import Halving  # noqa: E402
from pipeline.search.replay import load_trials, replay, verified  # noqa: E402

# lis n = 3..6, standard and linear attention, 5 widths, 3 learning rates: 120 (cell, rate) trials
GRID: dict[str, Any] = {
    "generate": {"train_samples": 20000, "test_samples": 500, "val_samples": 256, "datasets": {"lis": [3, 4, 5, 6]}},
    "sweep": {"grid": {"architectures": ["standard", "linear"], "widths": [8, 16, 24, 32, 48], "depths": [2],
                       "seeds": [0]},
              "model": {"heads": 4},
              "search": {"halving_rungs": [100, 200, 400], "halving_keep": 0.5, "lrs": [1e-3, 3e-3, 1e-2]},
              "optim": {"batch_size": 128, "epochs": 100, "max_steps": 800,
                        "warmup_fraction": 0.1},
              "verdict": {"patience": 2, "convergence_min_steps": 400, "max_budget_factor": 2},
              "evaluation": {"val_every_steps": 50, "val_samples": 256, "eval_samples": 500},
              "runs": {"reuse": False}},
}
QUICK: dict[str, Any] = {  # toy sizes; the toy models plateau at 41-59% (lis 3) and 28-49% (lis 4): 52% splits them
    "generate": {"train_samples": 3000, "test_samples": 200, "val_samples": 128, "datasets": {"lis": [3, 4]}},
    "sweep": {"grid": {"architectures": ["standard"], "widths": [8, 16, 32, 64], "depths": [1], "seeds": [0]},
              "search": {"halving_rungs": [30], "halving_keep": 0.5, "lrs": [1e-3, 3e-3]},
              "optim": {"epochs": 2, "max_steps": 100},
              "verdict": {"patience": 1, "convergence_min_steps": 100, "max_budget_factor": 1},
              "evaluation": {"val_every_steps": 10, "val_samples": 128, "eval_samples": 200},
              "runs": {"reuse": False}},
    "report": {"accuracy_threshold": 0.52},
}
PREDICT = ["seeds", "sizes", "neighbours"]  # every source of a predicted width
MODES: dict[str, dict[str, Any]] = {
    "grid": {"strategy": "grid", "lr_search": "all"},  # the reference: every (cell, rate) to its verdict
    "frontier": {"strategy": "frontier", "lr_search": "all"},
    "frontier+halving": {"strategy": "frontier", "lr_search": "halving"},
    "frontier+predict+halving": {"strategy": "frontier", "lr_search": "halving", "predict": PREDICT},
}


def load(work: Path, grid: dict, mode: dict) -> Config:
    params = {"profile": "tiny", "tasks": ["lis"], "generate": grid["generate"],
              "sweep": merge(grid["sweep"], {"verdict": {"stop_when_solved": True}, "search": mode}),
              "report": grid.get("report", {}),
              "cluster": {"mlflow_tracking_uri": f"sqlite:///{work / 'mlflow.db'}"}}
    path = work / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return load_config(path)


def run_modes(grid: dict, work: Path, names: tuple[str, ...] = tuple(MODES)) -> dict[str, dict]:
    """The modes ``names`` of ``MODES`` (the grid first, the reference) on the same data: (cell, rate) runs trained,
    their training PFLOPs, wall seconds, runs dropped, the min-width table, and where the sweep's outputs are (the
    grid's are replayed after)."""
    cfg = load(work, grid, {})
    generate_task(cfg, "lis", work / "data", check=False)
    out = {}
    for name in names:
        cfg = load(work, grid, MODES[name])
        out_dir = work / name.replace("+", "_")
        start = time.perf_counter()
        table = sweep(cfg, work / "data", out_dir)
        wall = time.perf_counter() - start
        trials = pd.read_csv(out_dir / "trials.csv")
        out[name] = {"trials": len(trials), "pflops": float(trials.train_pflops.sum()), "wall": wall,
                     "dropped": int((trials.status == Status.DROPPED).sum()), "out": out_dir,
                     "table": min_gflops(table)[["task", "size", "depth", "arch", "width", "min_paper_gflops",
                                                 "min_exact_gflops"]].reset_index(drop=True)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_frontier", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a toy grid, to check the wiring in seconds")
    ap.add_argument("--replay", type=Path, metavar="TRIALS", help="a grid sweep's trials.csv to replay, untrained")
    ap.add_argument("--synthetic", choices=("paper", "separations"),
                    help="replay on a synthetic grid of this profile's shape (benchmarks.synthetic_grids)")
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
    s = {key: value for section in grid["sweep"].values() for key, value in section.items()}  # the keys, by name
    halving = Halving(tuple(s["halving_rungs"]), s["halving_keep"])
    with tempfile.TemporaryDirectory(prefix="bench-frontier-") as tmp:
        modes = run_modes(grid, Path(tmp))
        recorded = load_trials(modes["grid"]["out"] / "trials.csv")
    replays = {name: replay(plan(list(recorded)), recorded, args.slots, h)
               for name, (plan, h) in strategies(halving).items()}
    reference = modes["grid"]
    res = Results("bench_frontier", argv)
    settings = {"datasets": grid["generate"]["datasets"], "train_samples": grid["generate"]["train_samples"],
                **{k: s[k] for k in ("architectures", "widths", "depths", "seeds", "lrs", "max_steps",
                                     "max_budget_factor", "halving_rungs", "halving_keep")}}
    figures = res.section("live", settings)
    print(f"\nlis n={grid['generate']['datasets']['lis']} x {s['architectures']} x widths {s['widths']} x learning "
          f"rates {s['lrs']}, depth {s['depths']}, {s['max_steps']} steps budget (up to {s['max_budget_factor']}x), "
          f"1 seed; halving rungs {s['halving_rungs']}, keep {s['halving_keep']:g}\n")
    print(f"{'live mode':25} {'trials':>6} {'train PFLOPs':>13} {'grid / this':>11} {'wall s':>7} {'dropped':>7}"
          "  same table")
    for name, m in modes.items():
        same = bool(m["table"].equals(reference["table"]))
        print(f"{name:25} {m['trials']:6d} {m['pflops']:13.5f} {reference['pflops'] / m['pflops']:10.2f}x "
              f"{m['wall']:7.1f} {m['dropped']:7d}  {same}")
        figures[name] = {"trials": m["trials"], "train_pflops": figure(m["pflops"], "PFLOP"),
                         "grid_over_mode": figure(reference["pflops"] / m["pflops"], "x"),
                         "wall_s": figure(m["wall"], "s"), "dropped": m["dropped"], "same_table": same,
                         "min_widths": m["table"][["task", "size", "depth", "arch", "width"]].to_dict("records")}
    print(f"\nthe same strategies replayed on the grid's recorded trials ({args.slots} slots):")
    print(f"{'strategy':25} {'trials':>6} {'train PFLOPs':>13} {'grid / this':>11} {'dropped':>7}  same table")
    for name, run in replays.items():
        ratio = replays["grid"].pflops / run.pflops
        same = run.table == replays["grid"].table
        print(f"{name:25} {run.trials:6d} {run.pflops:13.5f} {ratio:10.2f}x {run.dropped:7d}  {same}")
        figures[f"replayed {name}"] = {"trials": run.trials, "train_pflops": figure(run.pflops, "PFLOP"),
                                       "grid_over_strategy": figure(ratio, "x"), "dropped": run.dropped,
                                       "same_table": same}
    oracle(figures, replays["grid"].pflops, verified(recorded))
    print("\nsmallest solved width per size (grid):")
    print(reference["table"].to_string(index=False))
    res.write(out_path(args, "bench_frontier"))
    return 0


def oracle(figures: dict, grid_pflops: float, pflops: float) -> None:
    """The verify-only reference (``replay.verified``): what knowing every answer would still cost."""
    print(f"oracle, verify only (knows every answer; trains its cheapest solving run and every run of the width "
          f"below): {pflops:.5g} PFLOPs, grid / oracle {grid_pflops / pflops:.2f}x")
    figures["oracle (verify only)"] = {"train_pflops": figure(pflops, "PFLOP"),
                                       "grid_over_strategy": figure(grid_pflops / pflops, "x")}


def strategies(halving: Halving) -> dict[str, tuple[Callable[[list[Cell]], Plan], Halving | None]]:
    """Every search strategy: a plan and, or not, successive halving of the learning rates."""
    return {
        "grid": (GridPlan, None),
        "frontier": (FrontierPlan, None),
        "frontier+predict": (lambda cells: FrontierPlan(cells, PREDICT), None),
        "frontier+halving": (FrontierPlan, halving),
        "frontier+predict+halving": (lambda cells: FrontierPlan(cells, PREDICT), halving),
    }


def default_rungs(budget: int, every: int) -> tuple[int, ...]:
    """Rungs at 1/8, 1/4 and 1/2 of the first budget, on validations."""
    return tuple(sorted({max(every, budget // k // every * every) for k in (8, 4, 2)}))


def replayed(args: argparse.Namespace, argv: list[str] | None) -> int:
    """Every strategy over a recorded grid (a sweep's trials.csv and curves.csv, or a synthetic paper-shaped one),
    side by side; the grid's replay (every learning rate to its verdict) is the reference."""
    if args.synthetic:
        cfg = load_config(ROOT / "params.yaml", profile=args.synthetic)
        recorded = synthetic_grids.grid(args.synthetic, seed=args.seed, gpu_tflops=args.gpu_tflops)
        source = f"synthetic {args.synthetic} grid (draw {args.seed}, {args.gpu_tflops:g} TFLOP/s per slot)"
    else:
        cfg = None
        recorded = load_trials(args.replay)
        source = str(args.replay)
    s = cfg.sweep if cfg else None
    if args.rungs:
        rungs = tuple(args.rungs)
    elif s is not None and s.search.halving_rungs:
        rungs = tuple(s.search.halving_rungs)
    else:
        steps = max(r.steps for runs in recorded.values() for r in runs.values())
        every = min((c[1][0] - c[0][0] for runs in recorded.values() for r in runs.values() if len(c := r.curve) > 1),
                    default=1)
        budget = s.optim.max_steps if s is not None and s.optim.max_steps > 0 else steps
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
    oracle(figures, reference.pflops, verified(recorded))
    if args.out is not None:
        res.write(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
