"""A pilot: a profile's grid trained on this machine without Ray, MLflow or DVC, several trials at once sharing its
devices, each trial's verdict written as one JSON line the moment it ends.

For a GPU machine lent for minutes (whose image has no Ray), to see what a recipe learns before a sweep is spent on
it. It is not a sweep: no search, no reuse, no tracking, and nothing the report or the claims read; its lines are
evidence for docs/fidelity.md, quoted with their command.

    python -m benchmarks.pilot --params benchmarks/pilot-eq.yaml --out DIR [--parallel 8] [--deadline-s 300] [--claims]

``--params``: a params file (a profile and overrides, as params.yaml). Trials start in the grid's order (tasks,
sizes, architectures, widths, depths, seeds, then learning rates); at the deadline the running ones are stopped and
written as ``cut off``, with the ones never started. ``pilot.json`` beside the lines says how they were measured
(command, commit, date, device, the effective config). Exit status 2 for input that cannot run (named before any
compute).

``--claims``: the lines are also a results table, one row per cell (its best learning rate, as the sweep keeps it;
a cut-off trial undecided), whose claim checks (``pipeline.reporting.claims``: the verdicts a sweep's report gives,
with their coverage and each length's reading) go to ``claims.json`` beside them, rewritten as each trial ends: a
claims run on a lent GPU gives the verdicts of the trials it finished, wherever it is cut.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from benchmarks.results import provenance
from pipeline.common.cell import Cell
from pipeline.common.config import Config, ConfigError, load_config
from pipeline.common.status import Status, best_run
from pipeline.data.datasets import DatasetError
from pipeline.generate import generate_task
from pipeline.reporting.claims import evaluate
from pipeline.search.cells import build_cells, check_architectures
from pipeline.training.settings import TrainSettings
from pipeline.training.train import TrialSpec, run_trial
from tasks.registry import training_targets


def trials(cfg: Config, data_dir: Path, parallel: int) -> list[tuple[str, dict, TrialSpec]]:
    """(name, cell fields and learning rate, spec) per (cell, learning rate), in the grid's order; on a GPU each
    takes 1/parallel."""
    cells = build_cells(cfg, data_dir)
    targets = training_targets(sorted({c.task for c in cells}), cfg.report.accuracy_threshold)
    gpu = torch.cuda.is_available()
    train = TrainSettings.of(cfg, targets).params() | {"use_gpu": gpu, "gpu_share": 1 / parallel if gpu else 1.0}
    if not gpu:
        train["precision"] = "32-true"  # the CPU rehearsal: bf16 autocast on a CPU is another model's speed
    return [
        (
            f"{spec.name} lr={lr:g}",
            cell._asdict() | {"lr": lr, "max_len": spec.max_len},
            TrialSpec.for_cell(spec, train | {"lr": lr}),
        )
        for cell, spec in cells.items()
        for lr in spec.lrs
    ]


def results_table(lines: list[dict]) -> pd.DataFrame:
    """The pilot's lines as results/sweep.csv's rows: per cell its best run (``status.best_run``); a trial cut off at
    the deadline is undecided, with that reason."""
    runs: dict[tuple, list[dict]] = {}
    for line in lines:
        if line["status"] == "cut off":
            line = line | {"status": Status.UNDECIDED, "sustained_accuracy": 0.0, "converged": 0.0}
        runs.setdefault(tuple(line[k] for k in Cell._fields), []).append(line)
    rows = [best_run(found) | {"measured": True, "mlflow_run_id": "", "parent_run_id": ""} for found in runs.values()]
    scored = ("final_accuracy", "paper_gflops", "exact_gflops", "solve_pflops", "eval_samples", "reason")
    return pd.DataFrame(rows).reindex(columns=list(dict.fromkeys([*rows[0], *scored])) if rows else scored)


def write_claims(cfg: Config, lines: list[dict], out: Path, shown: bool = False) -> None:
    """The claim checks on the pilot's cells so far, written whole to ``out``/claims.json; ``shown``: printed too
    (those the cells decide, and every separations claim)."""
    checks = [v.row() for v in evaluate(results_table(lines), swept_at=cfg.report.accuracy_threshold)]
    tmp = out / "claims.json.tmp"
    tmp.write_text(json.dumps(checks, indent=1, default=str) + "\n")
    tmp.replace(out / "claims.json")
    for c in checks if shown else []:
        if c["status"] != "not tested" or c["paper"] == "separations":
            print(f"claim {c['id']}: {c['status']} ({c['coverage']})", flush=True)


def one(spec: TrialSpec) -> dict:
    torch.set_num_threads(1)  # trials share the machine's cores
    start = time.perf_counter()
    result = run_trial(spec, log_every=10**9)
    return {k: (str(v) if k == "status" else v) for k, v in result.items()} | {"wall_s": time.perf_counter() - start}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.pilot", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--params", required=True, help="a params file: profile and overrides")
    ap.add_argument("--out", required=True, help="folder for data/ and pilot.jsonl")
    ap.add_argument("--parallel", type=int, default=2, help="trials at once (default: %(default)s)")
    ap.add_argument("--deadline-s", type=float, default=600, help="stop everything after this (default: %(default)s)")
    ap.add_argument("--claims", action="store_true", help="check the papers' claims on the cells: claims.json")
    args = ap.parse_args(argv)
    if args.parallel < 1 or args.deadline_s <= 0:
        ap.error("--parallel must be at least 1 and --deadline-s above 0")
    start = time.monotonic()
    out = Path(args.out)
    try:
        cfg = load_config(args.params)
        check_architectures(cfg)
        out.mkdir(parents=True, exist_ok=True)
        for task in cfg.generate.datasets:
            generate_task(cfg, task, out / "data", check=True)
        todo = trials(cfg, out / "data", args.parallel)
    except (ConfigError, DatasetError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    run = provenance("benchmarks.pilot", argv) | {"device": device, "params": cfg.model_dump(mode="json")}
    (out / "pilot.json").write_text(json.dumps(run, indent=1) + "\n")  # how pilot.jsonl's lines were measured
    print(f"pilot: {len(todo)} trials, {args.parallel} at once, deadline {args.deadline_s:g} s", flush=True)
    lines = out / "pilot.jsonl"
    pool = mp.get_context("spawn").Pool(args.parallel, maxtasksperchild=1)
    running = {name: (cell, pool.apply_async(one, (spec,))) for name, cell, spec in todo}
    ended = []
    with lines.open("a") as sink:
        while running:
            done = [name for name, (_, job) in running.items() if job.ready()]
            late = time.monotonic() - start > args.deadline_s
            for name in done if not late else list(running):
                cell, job = running.pop(name)
                if job.ready():
                    try:
                        row = job.get()
                    except Exception as err:  # noqa: BLE001 - a failed trial is a line, with its error
                        row = {"status": "failed", "reason": f"{type(err).__name__}: {err}"}
                else:
                    row = {"status": "cut off", "reason": f"still training or not started at {args.deadline_s:g} s"}
                row = {"trial": name, **cell, **row}
                ended.append(row)
                sink.write(json.dumps(row) + "\n")
                sink.flush()
                accuracy = row.get("final_accuracy", float("nan"))
                print(f"{name:55} {row['status']:10} test {accuracy:.3f}  {row.get('reason', '')}", flush=True)
            if done and args.claims and not late:  # a run cut from outside keeps the verdicts of what it finished
                write_claims(cfg, ended, out)
            if late:
                pool.terminate()
                break
            time.sleep(1)
    pool.close()
    if args.claims:
        write_claims(cfg, ended, out, shown=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
