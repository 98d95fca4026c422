"""MLflow bookkeeping, all of it in the driver process: one parent run per sweep, one child run per trial.

Trials never talk to MLflow: they report to Ray Tune, and ``ChildRuns`` (a Tune callback, so it runs in the
driver) turns each report into metrics of that trial's child run. One writer means no SQLite lock contention and
no half-created experiments when many trials start at once.
"""

from __future__ import annotations

import math
import socket
from pathlib import Path

import mlflow
import psutil
from mlflow.tracking import MlflowClient
from ray import tune

from pipeline.common.cell import CellSpec
from pipeline.common.config import ROOT
from pipeline.training.status import Status
from pipeline.training.train import CELL_METRICS, TRIAL_METRICS

EXPERIMENT_KIND = "mlflow.experimentKind"  # the tag MLflow's UI reads (model training, or GenAI)


def start_parent(uri: str, experiment: str, run_name: str, params: dict, tags: dict) -> tuple[MlflowClient, str]:
    """Create (or reuse) the experiment and a parent run; returns the client and the parent run id."""
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        location = (ROOT / "mlartifacts").as_uri() if uri.startswith("sqlite:") else None
        exp_id = client.create_experiment(experiment, artifact_location=location)
    else:
        exp_id = exp.experiment_id
    if exp is None or EXPERIMENT_KIND not in exp.tags:
        # what the experiment is: MLflow's UI then opens it on its runs, not on an (empty) GenAI traces overview
        client.set_experiment_tag(exp_id, EXPERIMENT_KIND, "custom_model_development")
    run = client.create_run(exp_id, run_name=run_name, tags=tags)
    for key, value in params.items():
        client.log_param(run.info.run_id, key, value)
    return client, run.info.run_id


def driver_tags() -> dict[str, str]:
    """Who runs this sweep: a later sweep closes the runs of one whose process is gone (``close_orphans``)."""
    me = psutil.Process()
    return {
        "driver_host": socket.gethostname(),
        "driver_pid": str(me.pid),
        "driver_started": repr(me.create_time()),
        "checkout": str(ROOT),
    }


def driver_alive(tags: dict) -> bool:
    """The process that created the run still runs (same pid and start time: pids are reused)."""
    try:
        return repr(psutil.Process(int(tags["driver_pid"])).create_time()) == tags["driver_started"]
    except (psutil.Error, KeyError, ValueError):
        return False


def close_orphans(client: MlflowClient, experiment_id: str) -> dict[str, str]:
    """Sweeps of this machine whose driver died (kill -9, a lost node) leave their parent and children RUNNING
    forever: mark them KILLED. Returns trial key -> run id of the killed children (a resumed trial takes over its
    curve). Sweeps of other machines, or still alive here, are left alone."""
    host = socket.gethostname()
    parents = client.search_runs(
        [experiment_id],
        max_results=10_000,
        filter_string=f"attributes.status = 'RUNNING' and tags.driver_host = '{host}'",
    )
    killed = {}
    for parent in parents:
        if driver_alive(parent.data.tags):
            continue
        children = client.search_runs(
            [experiment_id],
            max_results=50_000,
            order_by=["attributes.start_time ASC"],
            filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'",
        )
        for child in children:
            if child.info.status == "RUNNING":
                client.set_tag(child.info.run_id, "reason", "killed: its sweep's driver died")
                client.set_terminated(child.info.run_id, "KILLED")
                killed[child.data.tags["trial_key"]] = child.info.run_id
        client.set_tag(parent.info.run_id, "reason", "killed: the driver process died before the sweep ended")
        client.set_terminated(parent.info.run_id, "KILLED")
    return killed


def numeric(result: dict) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in result.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


class ChildRuns(tune.Callback):
    """Tune callback: a child run per trial (one learning-rate run of a cell), tagged with its cell id, trial key
    and, at the end, its verdict; every report becomes metrics at its step."""

    METRICS = ("train_loss", "val_loss", "val_token_accuracy", "val_accuracy", "final_accuracy", "train_pflops", "lr")

    def __init__(self, client: MlflowClient, experiment_id: str, parent_id: str, killed: dict[str, str] | None = None):
        self.client, self.experiment_id, self.parent_id = client, experiment_id, parent_id
        self.killed = killed or {}  # trial key -> run id of a dead sweep (``close_orphans``)
        self.runs: dict[str, str] = {}  # Tune trial id -> MLflow run id
        self.errors: dict[str, str] = {}  # Tune trial id -> the error's last line
        self.restarts: dict[str, int] = {}  # Tune trial id -> retries after a worker died or the trial raised
        self.nodes: dict[str, str] = {}  # Tune trial id -> the Ray node it runs on

    def child(self, cell: CellSpec, train: dict, trial_key: str, **tags) -> str:
        """A child run of the parent for one learning-rate run of ``cell``; returns the run id."""
        run = self.client.create_run(
            self.experiment_id,
            run_name=f"{cell.name}-lr{train['lr']:g}",
            tags={
                "mlflow.parentRunId": self.parent_id,
                "cell_id": cell.cell_id,
                "trial_key": trial_key,
                "run_key": cell.run_key,
                **tags,
            },
        )
        for key in ("task", "size", "arch", "width", "depth", "seed", "max_len", "data_hash", "cell_id"):
            self.client.log_param(run.info.run_id, key, getattr(cell, key))
        for key, value in train.items():
            self.client.log_param(run.info.run_id, f"train.{key}", value)
        return run.info.run_id

    def finished(self, run_key: str) -> dict[str, mlflow.entities.Run]:
        """trial key -> the newest finished run of this experiment with the same run key (data, settings, code)."""
        runs = self.client.search_runs(
            [self.experiment_id],
            max_results=50_000,
            order_by=["attributes.start_time DESC"],
            filter_string=f"tags.run_key = '{run_key}' and attributes.status = 'FINISHED'",
        )
        found: dict[str, mlflow.entities.Run] = {}
        for run in runs:
            if "final_accuracy" in run.data.metrics and run.data.tags.get("status") in VERDICTS:
                found.setdefault(run.data.tags["trial_key"], run)
        return found

    def reuse(self, cell: CellSpec, train: dict, trial_key: str, source) -> dict:
        """Record an already finished run under this parent: a child run with the source's final metrics and
        verdict; returns it as a run record."""
        origin = source.data.tags.get("reused_from", source.info.run_id)
        tags = {k: source.data.tags[k] for k in ("status", "reason") if k in source.data.tags}
        run_id = self.child(cell, train, trial_key, reused_from=origin, **tags)
        metrics = {k: v for k, v in source.data.metrics.items() if k in CELL_METRICS + TRIAL_METRICS}
        step = int(metrics.get("train_steps", 0))
        for key, value in metrics.items():
            self.client.log_metric(run_id, key, value, step=step)
        self.client.set_terminated(run_id, "FINISHED")
        return metrics | tags | {"mlflow_run_id": run_id, "reused_from": origin}

    def run_of(self, trial) -> str:
        """The trial's run id, its run created on first need: a trial whose actor dies while starting gets
        ``on_trial_recover`` or ``on_trial_error`` from Tune without any ``on_trial_start`` before it."""
        if trial.trial_id in self.runs:  # a retry or a later event: the same run goes on
            return self.runs[trial.trial_id]
        config = trial.config
        run_id = self.child(
            CellSpec(**config["cell"]), config["train"], config["trial_key"], ray_trial_id=trial.trial_id
        )
        self.runs[trial.trial_id] = run_id
        previous = self.killed.get(config["trial_key"])
        if config.get("resume") and previous:  # one curve: the dead sweep's run up to the checkpoint, then ours
            self.client.set_tag(run_id, "resumed_from_run", previous)
            history = [
                m
                for key in self.METRICS
                for m in self.client.get_metric_history(previous, key)
                if m.step < config["resume_step"]
            ]  # the resumed trial reports the checkpoint's step
            for chunk in range(0, len(history), 1000):
                self.client.log_batch(run_id, metrics=history[chunk : chunk + 1000])
        return run_id

    def on_trial_start(self, iteration, trials, trial, **info):
        self.run_of(trial)

    def on_trial_recover(self, iteration, trials, trial, **info):
        self.restarts[trial.trial_id] = self.restarts.get(trial.trial_id, 0) + 1
        self.client.set_tag(self.run_of(trial), "restarts", self.restarts[trial.trial_id])

    def on_trial_result(self, iteration, trials, trial, result, **info):
        run_id = self.run_of(trial)
        step = int(result.get("step", iteration))
        metrics = numeric({k: result[k] for k in self.METRICS if k in result})
        if "node" in result and self.nodes.get(trial.trial_id) != result["node"]:  # first report, or a new node
            self.nodes[trial.trial_id] = result["node"]
            self.client.set_tag(run_id, "node", result["node"])
        if result.get("final"):
            metrics.update(numeric({k: v for k, v in result.items() if k in CELL_METRICS + TRIAL_METRICS}))
            for key in ("status", "reason"):
                self.client.set_tag(run_id, key, result[key])
        for key, value in metrics.items():
            self.client.log_metric(run_id, key, value, step=step)

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.client.set_terminated(self.run_of(trial), "FINISHED")

    def on_trial_error(self, iteration, trials, trial, **info):
        run_id = self.run_of(trial)
        self.errors[trial.trial_id] = error_line(trial.error_file)
        for key, value in {
            "status": Status.FAILED,
            "reason": self.errors[trial.trial_id],
            "error": str(trial.error_file),
        }.items():
            self.client.set_tag(run_id, key, value)
        self.client.set_terminated(run_id, "FAILED")


def error_line(error_file: str | None) -> str:
    """The last line of a trial's error file: the exception, named."""
    if error_file is None:
        return "error: the trial raised (no error file)"
    try:
        lines = [line for line in Path(error_file).read_text().splitlines() if line.strip()]
    except OSError:
        return "error: the trial raised (no error file)"
    return f"error: {lines[-1].strip()}" if lines else "error: the trial raised"


VERDICTS = (Status.SOLVED, Status.UNDECIDED, Status.UNSOLVED, Status.DIVERGED)  # what a finished trial reports
