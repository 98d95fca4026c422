"""Stage `sweep`: a Ray Tune grid over architecture x width x (task, size) x depth x seed, recorded in MLflow.

    python -m pipeline.sweep                    (dvc.yaml runs this after every `generate`)

Before anything starts: the config is validated, every dataset file is opened and hashed, MLflow and the Ray head
are checked. Cells this MLflow experiment already finished with the same data, training settings and training code
(same cell id and run key) are reused, so an interrupted or extended sweep trains only what is missing
(``sweep.reuse: false`` retrains everything). Ray (local ``ray.init`` on this machine's cores, or the head at
``cluster.ray_address`` / $RAY_ADDRESS) runs one trial per remaining cell; each trial trains with Lightning and
scores the test set.
Outputs (DVC's): ``results/sweep.csv`` (one row per cell) and ``results/sweep.json`` (headline metrics).
MLflow's store and Ray's trial directories are not DVC outputs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import asdict, fields
from pathlib import Path

import pandas as pd

from pipeline import config as config_mod
from pipeline.datasets import DatasetError, dataset_path, file_hash, read_metadata
from pipeline.train import TrialSpec

RESULTS = config_mod.ROOT / "results"
RESULT_KEYS = ("final_accuracy", "token_accuracy", "params", "paper_gflops", "exact_gflops", "train_pflops",
               "state_bytes", "train_steps", "train_seconds", "eval_seconds", "eval_samples")
TRAIN_KEYS = ("heads", "dropout", "batch_size", "epochs", "max_steps", "lr", "weight_decay", "warmup_fraction",
              "grad_clip", "precision", "val_samples", "val_every_steps", "eval_samples", "eval_batch_size")


def cell_id(cell: dict) -> str:
    """Stable id of a grid cell: the same cell on the same data gets the same id in every rerun."""
    key = {k: cell[k] for k in ("task", "size", "arch", "width", "depth", "seed", "data_hash")}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def run_key(train: dict) -> str:
    """What, beyond the cell, decides a trial's result: the training settings and the code that trains.
    A finished run with the same cell id and run key is reused instead of trained again (``sweep.reuse``)."""
    h = hashlib.sha256(json.dumps(train, sort_keys=True).encode())
    root = config_mod.ROOT
    for path in sorted([*root.glob("models/*.py"), root / "pipeline" / "train.py", root / "pipeline" / "datasets.py"]):
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def build_cells(cfg: config_mod.Config, data_dir: Path) -> list[dict]:
    """Every cell of the grid, with its dataset checked and hashed (raises DatasetError first)."""
    datasets = {}
    for task, size in cfg.sweep_datasets():
        train, test = (dataset_path(data_dir, task, size, s) for s in ("train", "test"))
        meta = [read_metadata(train), read_metadata(test)]
        datasets[task, size] = {
            "train_path": str(train), "test_path": str(test), "vocab_size": len(meta[0]["vocab"]),
            "family": meta[0]["family"], "vocab": meta[0]["vocab"],
            "max_len": max(m["stats"]["max_length"] for m in meta),
            "data_hash": hashlib.sha256((file_hash(train) + file_hash(test)).encode()).hexdigest()[:16]}
    s = cfg.sweep
    cells = []
    for arch in s.architectures:
        for width in s.widths:
            for (task, size), data in datasets.items():
                for depth in s.depths_for(arch):
                    for seed in s.seeds:
                        cell = {"task": task, "size": size, "arch": arch, "width": width, "depth": depth,
                                "seed": seed, "arch_options": s.arch_options.get(arch, {}), **data}
                        cell["cell_id"] = cell_id(cell)
                        cell["name"] = f"{task}{size}-{arch}-w{width}-d{depth}-s{seed}"
                        cells.append(cell)
    return cells


def trial_spec(cell: dict, train: dict) -> TrialSpec:
    names = {f.name for f in fields(TrialSpec)}
    return TrialSpec(**{k: v for k, v in {**cell, **train}.items() if k in names})


def run_cell(config: dict) -> None:
    """Ray Tune trainable (runs in a Ray worker): one cell, reporting every validation and the final metrics."""
    import lightning as L
    import torch
    from ray import tune

    from pipeline.train import run_trial

    logging.getLogger("lightning").setLevel(logging.WARNING)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    spec = trial_spec(config["cell"], config["train"])
    if spec.use_gpu and not torch.cuda.is_available():
        raise RuntimeError("the profile asks for GPUs (sweep.gpus_per_trial > 0) but this Ray worker has none")

    class Report(L.Callback):
        def on_validation_end(self, trainer, module):
            m = trainer.callback_metrics
            tune.report({"step": trainer.global_step, "train_pflops": module.train_flops / 1e15,
                         "lr": trainer.optimizers[0].param_groups[0]["lr"] if trainer.optimizers else 0.0,
                         **{k: float(m[k]) for k in ("train_loss", "val_loss", "val_token_accuracy") if k in m}})

    result = run_trial(spec, callbacks=[Report()])
    tune.report({**result, "step": result["train_steps"], "final": True})


def result_row(cell: dict, metrics: dict, status: str, run_id: str, parent: str) -> dict:
    """One row of results/sweep.csv."""
    row = {k: cell[k] for k in ("cell_id", "task", "size", "max_len", "arch", "width", "depth", "seed", "data_hash")}
    row.update({k: metrics.get(k) for k in RESULT_KEYS})
    return row | {"status": status, "mlflow_run_id": run_id, "parent_run_id": parent}


def connect_ray(address: str | None, cpus: int) -> str:
    import ray

    try:
        if address:
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        else:
            ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError) as err:
        from pipeline.tracking import ServiceError
        raise ServiceError(f"cannot start or join Ray at {address or 'a local ray.init'}: {err}") from None
    return address or "local"


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=config_mod.ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def reporter():
    """Ray's trial table, compact: a row per cell (named task-arch-width-depth-seed) with its cell id, step and
    accuracies; refreshed every 30 s in logs."""
    from ray.tune import CLIReporter

    return CLIReporter(parameter_columns={"cell/cell_id": "cell id"},
                       metric_columns={"step": "step", "val_token_accuracy": "token acc", "final_accuracy": "answer acc"},
                       max_report_frequency=10 if sys.stdout.isatty() else 30, max_progress_rows=40)


def sweep(cfg: config_mod.Config, data_dir: Path, out_dir: Path) -> pd.DataFrame:
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # the classic trial table, not a box per trial and result
    from ray import tune

    from pipeline.tracking import ChildRuns, check_mlflow, check_ray, start_parent

    cells = build_cells(cfg, data_dir)  # DatasetError before anything starts
    uri = cfg.cluster.mlflow()
    check_mlflow(uri)
    check_ray(cfg.cluster.ray())
    s = cfg.sweep
    train = {k: getattr(s, k) for k in TRAIN_KEYS} | {"threads": s.cpus_per_trial, "use_gpu": s.gpus_per_trial > 0}
    # threads change speed, not results; architecture options change results but are not part of the cell id
    key = run_key({k: v for k, v in train.items() if k != "threads"} | {"arch_options": s.arch_options})
    for cell in cells:
        cell["run_key"] = key
    started = time.time()
    client, parent = start_parent(
        uri, s.experiment, f"sweep-{cfg.profile}-{time.strftime('%Y%m%d-%H%M%S')}",
        params={"profile": cfg.profile, "trials": len(cells), "architectures": ",".join(s.architectures),
                "widths": ",".join(map(str, s.widths)), "depths": ",".join(map(str, s.depths)),
                "seeds": ",".join(map(str, s.seeds)), "run_key": key, **{f"train.{k}": v for k, v in train.items()}},
        tags={"git_commit": git_commit(), "profile": cfg.profile, "stage": "sweep"})
    status = "FAILED"
    try:
        client.log_text(parent, config_mod.yaml.safe_dump(cfg.model_dump(), sort_keys=False), "config.yaml")
        children = ChildRuns(client, client.get_run(parent).info.experiment_id, parent)
        finished = children.finished(key) if s.reuse else {}
        rows = []
        for cell in cells:
            if cell["cell_id"] in finished:
                run_id, metrics = children.reuse(cell, train, finished[cell["cell_id"]])
                rows.append(result_row(cell, metrics, "ok", run_id, parent))
        todo = [c for c in cells if c["cell_id"] not in finished]
        print(f"sweep: profile {cfg.profile}, {len(cells)} cells: {len(cells) - len(todo)} already finished with "
              f"the same data, settings and code (reused), {len(todo)} to train; MLflow {uri}", flush=True)
        if todo:
            address = connect_ray(cfg.cluster.ray(), os.cpu_count() or 1)
            client.log_param(parent, "ray", address)
            tuner = tune.Tuner(
                tune.with_resources(run_cell, {"cpu": s.cpus_per_trial, "gpu": s.gpus_per_trial}),
                param_space={"cell": tune.grid_search(todo), "train": train},
                tune_config=tune.TuneConfig(
                    max_concurrent_trials=s.max_concurrent_trials, reuse_actors=True,
                    trial_name_creator=lambda t: t.config["cell"]["name"],
                    trial_dirname_creator=lambda t: f"{t.config['cell']['name']}-{t.trial_id}"),
                run_config=tune.RunConfig(
                    name=f"{cfg.profile}-{int(started)}", storage_path=str(config_mod.ROOT / "ray_results"),
                    callbacks=[children], verbose=1, progress_reporter=reporter(),
                    failure_config=tune.FailureConfig(max_failures=0)))
            for result in tuner.fit():
                metrics = result.metrics or {}
                rows.append(result_row(result.config["cell"], metrics, "error" if result.error else "ok",
                                       children.runs.get(metrics.get("trial_id", ""), ""), parent))
        table = pd.DataFrame(rows).sort_values(["task", "size", "arch", "width", "depth", "seed"])
        ok = table[table.status == "ok"]
        summary = {"profile": cfg.profile, "trials": len(table), "failed": int((table.status != "ok").sum()),
                   "mean_final_accuracy": round(float(ok.final_accuracy.mean()), 4) if len(ok) else None,
                   "cells_above_threshold": int((ok.final_accuracy > cfg.report.accuracy_threshold).sum()),
                   "reused": len(cells) - len(todo), "wall_seconds": round(time.time() - started, 1),
                   "mlflow_parent_run": parent}
        for name in ("trials", "failed", "mean_final_accuracy", "cells_above_threshold", "reused", "wall_seconds"):
            if summary[name] is not None:
                client.log_metric(parent, name, summary[name])
        write_atomic(out_dir / "sweep.csv", table.to_csv(index=False))
        write_atomic(out_dir / "sweep.json", json.dumps(summary, indent=2) + "\n")
        status = "FINISHED" if summary["failed"] == 0 else "FAILED"
        print(table[["task", "size", "arch", "width", "depth", "seed", "final_accuracy", "paper_gflops",
                     "status"]].to_string(index=False))
        print(json.dumps(summary))
        if summary["failed"]:
            raise RuntimeError(f"{summary['failed']} of {len(table)} trials failed: see the MLflow runs tagged "
                               f"'error' under parent run {parent} and {config_mod.ROOT / 'ray_results'}")
        return table
    finally:
        client.set_terminated(parent, status)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.sweep", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default=str(config_mod.ROOT / "params.yaml"), help="params file (default: %(default)s)")
    ap.add_argument("--data", default=str(config_mod.ROOT / "data"), help="data directory (default: %(default)s)")
    ap.add_argument("--out", default=str(RESULTS), help="results directory (default: %(default)s)")
    args = ap.parse_args(argv)
    from pipeline.tracking import ServiceError

    try:
        sweep(config_mod.load(args.params), Path(args.data), Path(args.out))
    except (config_mod.ConfigError, DatasetError, ServiceError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
