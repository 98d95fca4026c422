"""What the sweep's driver spends on each trial result: the real Tune callbacks of the sweep (the
MLflow child runs and the progress line, over a real ``CellSearcher``) fed the reports of N simulated trials,
logging to a real MLflow server on 127.0.0.1 (or a SQLite store).

    python -m benchmarks.bench_driver                          # 500 trials x 20 validations, 200 at a time
    python -m benchmarks.bench_driver --trials 50 --validations 5 --store sqlite --out -

Each trial is suggested by the searcher, started, reports ``--validations`` times (the metrics a trial reports at
a validation), reports its final metrics and verdict, and completes; ``--running`` trials interleave their
reports, as a cluster's running trials do, and Tune's loop calls ``on_step_begin`` between results. Prints, per
repeat: the time of one result's processing by the callbacks (median and 95th percentile: the part of Tune's
``process_trial_result`` that is ours, which Ray warns about above 0.5 s), of a trial's start and completion, and
results per second end to end (from the first trial's start until every MLflow write is done). Target: median
result processing at most 50 ms, at least 200 results/s.

The figures go to ``docs/benchmarks/bench_driver.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from mlflow.tracking import MlflowClient

from benchmarks.repeats import spread
from benchmarks.results import Results, figure, out_option, out_path
from pipeline.common.cell import Cell, CellSpec
from pipeline.common.status import Status
from pipeline.scheduling.console import SweepProgress
from pipeline.search.frontier import GridPlan
from pipeline.search.searcher import CellSearcher
from pipeline.tracking.runs import ChildRuns, start_parent
from pipeline.tracking.writer import GATHER
from tests.helpers.services import mlflow_server


@dataclass
class SimulatedTrial:
    """What the callbacks read of a Tune ``Trial``."""

    trial_id: str
    config: dict
    error_file: str | None = None


@dataclass
class Timings:
    result: list[float] = field(default_factory=list)  # seconds per result, the callbacks together
    start: list[float] = field(default_factory=list)
    complete: list[float] = field(default_factory=list)


def cells(n: int) -> dict[Cell, CellSpec]:
    """``n`` cells of one dataset (nothing is read from it: the callbacks log its name, hash and path)."""
    out = {}
    for i in range(n):
        at = Cell("lis", 4, "standard", 16 * (1 + i % 8), 2, i // 8)
        out[at] = CellSpec(
            cell=at, arch_options={}, lrs=(1e-3,), train_path="/data/lis/4/train.parquet",
            test_path="/data/lis/4/test.parquet", val_path="/data/lis/4/val.parquet",
            sha256={"train_path": "a" * 64, "test_path": "b" * 64, "val_path": "d" * 64},
            data_hash="c" * 16, vocab_size=32, family="dp", vocab=("0",), train_samples=20000, max_len=40,
            cell_id=f"{i:016x}", name=f"lis4-standard-w{at.width}-d2-s{at.seed}", run_key="bench", params=1000,
            paper_gflops=0.1, exact_gflops=0.1, state_bytes=100,
        )  # fmt: skip
    return out


def validation(step: int, k: int) -> dict:
    """A validation's report, as ``pipeline.scheduling.trainable`` sends it (Tune adds its own fields)."""
    return {
        "node": "127.0.0.1", "step": step, "train_pflops": 1e-6 * step, "lr": 1e-3, "train_loss": 1.0 / k,
        "val_loss": 1.1 / k, "val_token_accuracy": 1 - 0.5 / k, "val_accuracy": 1 - 0.6 / k,
        "system/cpu_utilization_percentage": 90.0, "system/process_memory_rss_megabytes": 800.0,
        "time_this_iter_s": 1.0, "training_iteration": k, "done": False, "should_checkpoint": True,
    }  # fmt: skip


def final(step: int) -> dict:
    return {
        "node": "127.0.0.1", "step": step, "final": True, "status": Status.SOLVED, "reason": "solved at step 10",
        "final_accuracy": 0.95, "val_accuracy": 0.96, "token_accuracy": 0.99, "params": 1000, "paper_gflops": 0.1,
        "exact_gflops": 0.1, "train_pflops": 1e-6 * step, "solve_step": step, "solve_pflops": 1e-6 * step,
        "state_bytes": 100, "train_steps": step, "budget_steps": step, "train_seconds": 10.0, "eval_seconds": 1.0,
        "eval_samples": 1000, "resumed_step": None, "checkpoints": 20, "checkpoint_seconds": 0.5,
        "checkpoint_bytes": 1e6,
    }  # fmt: skip


@contextlib.contextmanager
def store(kind: str, work: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{work / 'mlflow.db'}"
    else:
        with mlflow_server(work) as server:
            yield server.uri


def feed(uri: str, trials: int, validations: int, running: int, gather: float) -> tuple[Timings, float, int]:
    """One sweep's worth of simulated trials through the callbacks; returns the timings, the seconds from the
    first start until every write is done, and the results fed."""
    client, parent = start_parent(uri, "bench-driver", "bench", params={"trials": trials}, tags={})
    grid = cells(trials)
    searcher = CellSearcher(GridPlan(grid), grid, {"lr": 1e-3}, reusable=lambda cell, lr: None, cost=lambda cell: 1.0)
    searcher.needs_training()
    experiment = client.get_run(parent).info.experiment_id
    children = ChildRuns(client, experiment, parent, profile="bench")
    children.writer.gather = gather
    progress = SweepProgress(searcher, children.writer, parent, out=io.StringIO())
    t = Timings()
    began = time.perf_counter()
    fed = 0
    pending = [SimulatedTrial(f"t{i:05d}", {}) for i in range(trials)]
    live: list[tuple[SimulatedTrial, int]] = []
    iteration = 0
    while pending or live:
        while pending and len(live) < running:
            trial = pending.pop(0)
            config = searcher.suggest(trial.trial_id)
            assert isinstance(config, dict), config  # the bench starts no more trials than the plan holds
            trial.config = config
            tick = time.perf_counter()
            children.on_trial_start(iteration, [], trial)
            t.start.append(time.perf_counter() - tick)
            live.append((trial, 0))
        trial, k = live.pop(0)
        iteration += 1
        progress.on_step_begin(iteration, [])
        k += 1
        result = validation(10 * k, k) if k <= validations else final(10 * validations)
        tick = time.perf_counter()
        for callback in (children, progress):
            callback.on_trial_result(iteration, [], trial, result)  # type: ignore[arg-type]  # a stand-in Trial
        t.result.append(time.perf_counter() - tick)
        fed += 1
        time.sleep(0)  # Tune's loop waits on Ray between results, which lets other threads run
        if k <= validations:
            live.append((trial, k))
            continue
        tick = time.perf_counter()
        searcher.on_trial_complete(trial.trial_id, result)
        children.on_trial_complete(iteration, [], trial)
        t.complete.append(time.perf_counter() - tick)
    progress.on_experiment_end([])
    children.on_experiment_end([])
    seconds = time.perf_counter() - began
    check(client, parent, trials, validations)
    return t, seconds, fed


def check(client: MlflowClient, parent: str, trials: int, validations: int) -> None:
    """Everything fed is in MLflow: a child per trial, finished, with its whole curve and verdict."""
    experiment = client.get_run(parent).info.experiment_id
    runs = client.search_runs([experiment], f"tags.mlflow.parentRunId = '{parent}'", max_results=50_000)
    assert len(runs) == trials, f"{len(runs)} child runs for {trials} trials"
    assert all(r.info.status == "FINISHED" and r.data.tags.get("status") == Status.SOLVED for r in runs)
    history = client.get_metric_history(runs[0].info.run_id, "val_accuracy")
    # one point per validation: the final report repeats the last one, which the run has already
    assert len(history) == validations, f"{len(history)} val_accuracy points, {validations} validations reported"


def ms(values: list[float], q: float) -> float:
    return 1000 * (statistics.quantiles(values, n=100)[int(q * 100) - 1] if q < 1 else max(values))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_driver", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=500)
    ap.add_argument("--validations", type=int, default=20, help="reports per trial before its final one")
    ap.add_argument("--running", type=int, default=200, help="trials whose reports interleave")
    ap.add_argument("--store", choices=("server", "sqlite"), default="server",
                    help="an `mlflow server` on 127.0.0.1 (a cluster's setup) or a SQLite file (the default profile's)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gather", type=float, nargs="+", default=[GATHER],
                    help="seconds the MLflow writer waits for more writes to send together; several: side by side")
    out_option(ap, "bench_driver")
    args = ap.parse_args(argv)
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # as the sweep does
    res = Results("bench_driver", argv)
    settings = {k: getattr(args, k) for k in ("trials", "validations", "running", "store", "repeats", "gather")}
    names = ("result_median_ms", "result_p95_ms", "start_median_ms", "complete_median_ms", "results_per_s")
    rows: dict[float, dict[str, list[float]]] = {g: {k: [] for k in names} for g in args.gather}
    print(f"{args.trials} trials x ({args.validations} validations + 1 final), {args.running} at a time, "
          f"MLflow {args.store}")
    for r in range(args.repeats):
        # several gathering waits side by side, the order turned every round: a slow spell favours none
        for gather in args.gather if r % 2 == 0 else args.gather[::-1]:
            with tempfile.TemporaryDirectory(prefix="bench-driver-") as tmp, store(args.store, Path(tmp)) as uri:
                t, seconds, fed = feed(uri, args.trials, args.validations, args.running, gather)
            row = {"result_median_ms": 1000 * statistics.median(t.result), "result_p95_ms": ms(t.result, 0.95),
                   "start_median_ms": 1000 * statistics.median(t.start),
                   "complete_median_ms": 1000 * statistics.median(t.complete), "results_per_s": fed / seconds}
            for k, v in row.items():
                rows[gather][k].append(v)
            print(f"round {r + 1}, gather {gather:g} s: result {row['result_median_ms']:.2f} ms median, "
                  f"{row['result_p95_ms']:.2f} ms p95; trial start {row['start_median_ms']:.1f} ms, completion "
                  f"{row['complete_median_ms']:.1f} ms; {row['results_per_s']:.0f} results/s ({fed} results in "
                  f"{seconds:.1f} s, every write done)")
    figures = res.section(args.store, settings)
    for gather, measured in rows.items():
        figures[f"gather {gather:g} s"] = {
            k: figure(v, "results/s" if k == "results_per_s" else "ms") for k, v in measured.items()
        }
        print(f"gather {gather:g} s: {spread(measured['results_per_s'], '.0f')} results/s, result "
              f"{spread(measured['result_median_ms'], '.2f')} ms median")
    res.write(out_path(args, "bench_driver"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
