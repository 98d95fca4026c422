"""MLflow bookkeeping, all of it in the driver process: one parent run per sweep, one child run per trial it trains.
A trial an earlier sweep of the experiment finished is not trained and not copied: the sweep refers to that run
(``finished``, ``reused_run``), so a rerun with nothing to train adds its parent run and no child.

Trials never talk to MLflow: they report to Ray Tune, and ``ChildRuns`` (a Tune callback as ``TuneChildRuns``, so it
runs in the driver) turns each report into metrics of that trial's child run. One writer means no SQLite lock
contention and no half-created experiments when many trials start at once; it writes from a thread of its own
(``pipeline.tracking.writer``), so Tune's loop never waits on MLflow.

The parent carries the driver's heartbeat (``Heartbeat``: a tag refreshed every ``cluster.heartbeat_s``), by which a
sweep on any host knows whether an unfinished sweep is alive; ``close_orphans`` closes a dead one's runs as KILLED and
``killed_runs`` hands their curves on.

Every child run records its cell's train and test files as MLflow dataset inputs (``dataset_inputs``: named
task-size-split, the file's hash as digest, its task, size, split and the profile in its profile), and the resource
use its trial reports with each validation as MLflow system metrics (``system/...``, the run's System metrics tab).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import threading
import time
from pathlib import Path

import mlflow
import psutil
from mlflow.entities import Dataset, DatasetInput, InputTag
from mlflow.tracking import MlflowClient
from mlflow.tracking.context.registry import resolve_tags
from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT, MLFLOW_GIT_COMMIT

from pipeline.common.cell import CellSpec
from pipeline.common.config import PROJECT
from pipeline.common.provenance import git_commit
from pipeline.common.signals import STOP
from pipeline.common.status import Status
from pipeline.tracking.services import EXPERIMENT_KIND, MODEL_TRAINING, ServiceError
from pipeline.tracking.writer import RunWriter
from pipeline.training.members import member_results, members
from pipeline.training.metrics import CELL_METRICS, TRIAL_METRICS
from pipeline.training.system import SYSTEM


def start_parent(uri: str, experiment: str, run_name: str, params: dict, tags: dict) -> tuple[MlflowClient, str]:
    """Create (or reuse) the experiment and a parent run; returns the client and the parent run id."""
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        location = (PROJECT / "mlartifacts").as_uri() if uri.startswith("sqlite:") else None
        exp_id = client.create_experiment(experiment, artifact_location=location)
    else:
        exp_id = exp.experiment_id
    if exp is None or EXPERIMENT_KIND not in exp.tags:
        # what the experiment is: MLflow's UI then opens it on its runs, not on an (empty) GenAI traces overview
        client.set_experiment_tag(exp_id, EXPERIMENT_KIND, MODEL_TRAINING)
    run = client.create_run(exp_id, run_name=run_name, tags=standard_tags() | tags)
    for key, value in params.items():
        client.log_param(run.info.run_id, key, value)
    return client, run.info.run_id


def standard_tags() -> dict[str, str]:
    """MLflow's own tags of a run (``mlflow.user``, ``mlflow.source.name`` and ``.type``, and the commit as
    ``mlflow.source.git.commit``), which its fluent API sets and the client API this project uses does not: the UI's
    User and Source columns, and a shared server's searches, read them."""
    return resolve_tags({MLFLOW_GIT_COMMIT: git_commit().sha})


def driver_tags(heartbeat_s: float) -> dict[str, str]:
    """Who runs this sweep, and its first heartbeat: a later sweep, on any host, closes the runs of one whose
    driver is gone (``close_orphans``); in which checkout, and as which DVC experiment (``dvc exp run`` names it in
    its stages' environment)."""
    me = psutil.Process()
    experiment = os.environ.get("DVC_EXP_NAME")
    return {
        "driver_host": socket.gethostname(),
        "driver_pid": str(me.pid),
        "driver_started": repr(me.create_time()),
        "checkout": str(PROJECT),
        HEARTBEAT: beat(heartbeat_s),
    } | ({"dvc_experiment": experiment} if experiment else {})


HEARTBEAT = "driver_heartbeat"  # the parent run's tag: {"version", "at" (unix time), "every_s"} as JSON
HEARTBEAT_VERSION = 1
MISSED = 3  # heartbeats missed in a row: the driver is dead
CLOCK_SKEW_S = 300.0  # hosts' clocks may differ by this much: an older heartbeat is missed whatever the clocks


class HeartbeatError(ServiceError):
    """A running sweep's heartbeat tag this version cannot read (a newer version wrote it)."""


def beat(every_s: float) -> str:
    return json.dumps({"version": HEARTBEAT_VERSION, "at": round(time.time(), 3), "every_s": every_s})


def read_beat(run: mlflow.entities.Run) -> dict | None:
    """A parent run's heartbeat (None: a sweep of a version before heartbeats); ``HeartbeatError`` for one this
    version cannot read."""
    text = run.data.tags.get(HEARTBEAT)
    if text is None:
        return None
    where = f"MLflow run {run.info.run_id} (a sweep on host {run.data.tags.get('driver_host', '?')})"
    try:
        value = json.loads(text)
        version = int(value["version"])
    except (ValueError, TypeError, KeyError):
        raise HeartbeatError(f"{where}: its {HEARTBEAT} tag {text!r} is not a heartbeat this version reads") from None
    if version > HEARTBEAT_VERSION:
        raise HeartbeatError(
            f"{where} carries a {HEARTBEAT} tag of version {version}, newer than this checkout's "
            f"({HEARTBEAT_VERSION}): a newer version of the pipeline runs against this experiment; update this "
            "checkout (git pull) before it closes or continues that sweep's runs"
        )
    try:
        return {"at": float(value["at"]), "every_s": float(value["every_s"])}
    except (ValueError, TypeError, KeyError):
        raise HeartbeatError(f"{where}: its {HEARTBEAT} tag {text!r} lacks a time or an interval") from None


class Heartbeat:
    """Refreshes the parent run's heartbeat tag every ``every_s`` seconds from a thread of its own until ``stop``:
    how a sweep on another host knows this driver is alive. A refresh that fails is tried again at the next beat
    (a sweep that cannot reach MLflow for ``MISSED`` beats is taken for dead)."""

    def __init__(self, client: MlflowClient, run_id: str, every_s: float):
        self.client, self.run_id, self.every_s = client, run_id, every_s
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.wait(self.every_s):
            with contextlib.suppress(Exception):  # MLflow's errors, after its own retries
                self.client.set_tag(self.run_id, HEARTBEAT, beat(self.every_s))

    def stop(self) -> None:
        self.stopped.set()


def driver_alive(tags: dict) -> bool:
    """The process that created the run still runs (same pid and start time: pids are reused)."""
    try:
        return repr(psutil.Process(int(tags["driver_pid"])).create_time()) == tags["driver_started"]
    except (psutil.Error, KeyError, ValueError):
        return False


def watch_beats(client: MlflowClient, watched: dict[str, tuple[str, dict]]) -> dict[str, str]:
    """Sweeps on other hosts whose heartbeat is young (run id -> its tag as first read, the heartbeat), watched until
    each moves or ends (alive) or ``MISSED`` beats pass: the dead ones, run id -> why."""
    dead: dict[str, str] = {}
    if not watched:
        return dead
    longest = MISSED * max(h["every_s"] for _, h in watched.values())
    print(
        f"sweep: {len(watched)} running sweep(s) on other hosts: watching their heartbeats for up to {longest:g} s",
        flush=True,
    )
    started = time.monotonic()
    while watched:
        for run_id, (tag, heartbeat) in list(watched.items()):
            now = client.get_run(run_id)
            if now.info.status != "RUNNING" or now.data.tags.get(HEARTBEAT) != tag:  # ended, or alive
                del watched[run_id]
            elif time.monotonic() - started > MISSED * heartbeat["every_s"]:
                dead[run_id] = missed(now.data.tags, heartbeat)
                del watched[run_id]
        time.sleep(min(1.0, longest / 10))
    return dead


def close_orphans(client: MlflowClient, experiment_id: str) -> list[str]:
    """Sweeps whose driver died (kill -9, a lost node, a job or pod gone) leave their parent and children RUNNING
    forever: marks them KILLED, with why, so that a sweep on any host takes their trials over (``killed_runs``).
    A driver on this host is dead when its process is gone; one elsewhere when its heartbeat has missed ``MISSED``
    beats: one older than that and ``CLOCK_SKEW_S`` is missed already, a younger one is watched, by this host's
    clock, until it moves or ``MISSED`` beats have passed. A sweep of a version before heartbeats, on another host,
    is left alone. Returns the closed parents' run ids."""
    host = socket.gethostname()
    running = client.search_runs(
        [experiment_id], max_results=10_000, filter_string="attributes.status = 'RUNNING' and tags.stage = 'sweep'"
    )
    dead: dict[str, str] = {}  # run id -> why
    watched: dict[str, tuple[str, dict]] = {}  # run id -> (its heartbeat tag as first read, the heartbeat)
    for parent in running:
        tags, run_id = parent.data.tags, parent.info.run_id
        heartbeat = read_beat(parent)  # HeartbeatError before anything is closed
        if tags.get("driver_host") == host:
            if not driver_alive(tags):
                dead[run_id] = f"its driver (pid {tags.get('driver_pid')} on {host}) died before the sweep ended"
        elif heartbeat is not None:
            age = time.time() - heartbeat["at"]
            if age > MISSED * heartbeat["every_s"] + CLOCK_SKEW_S:
                dead[run_id] = missed(tags, heartbeat)
            else:
                watched[run_id] = (tags[HEARTBEAT], heartbeat)
    dead |= watch_beats(client, watched)
    for run_id, why in dead.items():
        children = client.search_runs(
            [experiment_id],
            max_results=50_000,
            order_by=["attributes.start_time ASC"],
            filter_string=f"tags.mlflow.parentRunId = '{run_id}' and attributes.status = 'RUNNING'",
        )
        for child in children:
            client.set_tag(child.info.run_id, "reason", f"killed: its sweep's driver is gone: {why}")
            client.set_terminated(child.info.run_id, "KILLED")
        client.set_tag(run_id, "reason", f"killed: {why}")
        client.set_terminated(run_id, "KILLED")
        print(f"sweep: closed the runs of sweep {run_id} as KILLED: {why}", flush=True)
    return list(dead)


def missed(tags: dict, heartbeat: dict) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(heartbeat["at"]))
    return (
        f"its driver (pid {tags.get('driver_pid')} on {tags.get('driver_host')}) missed {MISSED} heartbeats "
        f"(every {heartbeat['every_s']:g} s; the last at {when} by that host's clock)"
    )


def killed_runs(client: MlflowClient, experiment_id: str, run_key: str) -> dict[str, str]:
    """trial key -> the newest KILLED child run with this run key: a trial of a sweep that died (``close_orphans``)
    or stopped (a lost node, Ctrl-C), whose curve a resumed trial takes over."""
    runs = client.search_runs(
        [experiment_id],
        max_results=50_000,
        order_by=["attributes.start_time DESC"],
        filter_string=f"tags.run_key = '{run_key}' and attributes.status = 'KILLED'",
    )
    killed: dict[str, str] = {}
    for run in runs:
        killed.setdefault(run.data.tags["trial_key"], run.info.run_id)
    return killed


def numeric(result: dict) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in result.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


SPLITS = {"train": "train_path", "test": "test_path", "val": "val_path"}


def dataset_inputs(cells: list[CellSpec], profile: str) -> list[DatasetInput]:
    """The distinct train, test and validation files of ``cells`` as MLflow dataset inputs: named task-size-split,
    the file's hash as digest, where it was read from as source; task, size, split, the dataset's data hash and the
    profile in the profile (the UI's Datasets column and panel show them)."""
    inputs: dict[tuple[str, str], DatasetInput] = {}
    for cell in cells:
        for split, key in SPLITS.items():
            digest = cell.sha256[key][:16]
            about = {"task": cell.task, "size": cell.size, "split": split, "data_hash": cell.data_hash}
            about |= {"profile": profile, "max_length": cell.max_len}
            about |= {"samples": cell.train_samples} if split == "train" else {}
            dataset = Dataset(
                name=f"{cell.task}-{cell.size}-{split}",
                digest=digest,
                source_type="local",
                source=json.dumps({"uri": getattr(cell, key)}),
                profile=json.dumps(about),
            )
            inputs.setdefault((dataset.name, digest), DatasetInput(dataset, [InputTag(MLFLOW_DATASET_CONTEXT, split)]))
    return list(inputs.values())


class ChildRuns:
    """A child run per learning-rate run of a cell (a trial, or each member of a fused trial, as its separate
    trial's), tagged with its cell id, trial key and, at the end, its verdict; every report becomes metrics at its
    step. Its ``on_trial_*`` methods are Tune's callback hooks, which Tune calls on
    ``pipeline.scheduling.tuning.TuneChildRuns``."""

    METRICS = ("train_loss", "val_loss", "val_token_accuracy", "val_accuracy", "final_accuracy", "train_pflops", "lr")
    HISTORY = {"loss": "val_loss", "accuracy": "val_accuracy"}  # a resumed trial's validations, from its checkpoint
    VALIDATION = ("val_loss", "val_token_accuracy", "val_accuracy")  # what one validation logs

    def __init__(
        self,
        client: MlflowClient,
        experiment_id: str,
        parent_id: str,
        profile: str,
        killed: dict[str, str] | None = None,
    ):
        self.client, self.experiment_id, self.parent_id, self.profile = client, experiment_id, parent_id, profile
        self.writer = RunWriter(client)  # every write of a run after its creation
        self.killed = killed or {}  # trial key -> run id of a dead sweep (``close_orphans``)
        self.runs: dict[str, dict[str, str]] = {}  # Tune trial id -> trial key -> MLflow run id (fused: several)
        self.errors: dict[str, str] = {}  # Tune trial id -> the error's last line
        self.restarts: dict[str, int] = {}  # Tune trial id -> retries after a worker died or the trial raised
        self.nodes: dict[str, str] = {}  # Tune trial id -> the Ray node it runs on
        self.validated: dict[str, set[int]] = {}  # MLflow run id -> the steps of the validations logged on it
        self.by_key: dict[str, str] = {}  # trial key -> its run in this sweep (a rung's continuation goes on in it)
        self.open: set[str] = set()  # the runs of trials not ended yet
        self.standard = standard_tags()  # once: resolving them runs git

    def child(self, cell: CellSpec, train: dict, trial_key: str, **tags) -> str:
        """A child run of the parent for one learning-rate run of ``cell``; returns the run id."""
        run = self.client.create_run(
            self.experiment_id,
            run_name=f"{cell.name}-lr{train['lr']:g}",
            tags={
                **self.standard,
                "mlflow.parentRunId": self.parent_id,
                "cell_id": cell.cell_id,
                "trial_key": trial_key,
                "run_key": cell.run_key,
                **tags,
            },
        )
        run_id = run.info.run_id
        params = {k: getattr(cell, k) for k in ("task", "size", "arch", "width", "depth", "seed", "max_len")}
        params |= {"data_hash": cell.data_hash, "cell_id": cell.cell_id} | {f"train.{k}": v for k, v in train.items()}
        self.writer.log(run_id, params=params)
        self.writer.inputs(run_id, dataset_inputs([cell], self.profile))
        return run_id

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
            if "reused_from" in run.data.tags:  # a copy an earlier version of the sweep made: its original is here too
                continue
            status = run.data.tags.get("status")
            ended = status in VERDICTS and "final_accuracy" in run.data.metrics
            if ended or status == Status.DROPPED:
                found.setdefault(run.data.tags["trial_key"], run)
        return found

    def drop(self, run: dict) -> None:
        """Successive halving dropped this (cell, learning rate) run after it paused: its run says so and why."""
        run_id = self.by_key[run["trial_key"]]
        self.writer.log(run_id, tags={"status": Status.DROPPED, "reason": run["reason"]})

    def runs_of(self, trial) -> dict[str, str]:
        """trial key -> MLflow run id of each learning-rate run the trial trains (one, or a fused trial's
        members), created on first need: a trial whose actor dies while starting gets ``on_trial_recover`` or
        ``on_trial_error`` from Tune without any ``on_trial_start`` before it."""
        if trial.trial_id not in self.runs:  # else a retry or a later event: the same runs go on
            config = trial.config
            self.runs[trial.trial_id] = {m["trial_key"]: self.member_run(config, m, trial) for m in members(config)}
        return self.runs[trial.trial_id]

    def member_run(self, config: dict, member: dict, trial) -> str:
        """The run of one learning-rate run (``searcher.members``) of the trial's config."""
        key = member["trial_key"]
        if config.get("rung") and key in self.by_key:  # past a rung: the paused run goes on
            run_id = self.by_key[key]
            self.writer.reopen(run_id)
            self.writer.log(run_id, tags={"ray_trial_id": trial.trial_id, "status": "running", "reason": ""})
            self.open.add(run_id)
            return run_id
        train = config["train"] | {"lr": member["lr"]}
        run_id = self.by_key[key] = self.child(CellSpec(**config["cell"]), train, key, ray_trial_id=trial.trial_id)
        self.open.add(run_id)
        previous = self.killed.get(key)
        if member.get("resume") and previous:  # one curve: the dead sweep's run up to the checkpoint, then ours
            history = [
                m
                for name in self.METRICS
                if name not in self.HISTORY.values()  # the trial reports them from its checkpoint
                for m in self.client.get_metric_history(previous, name)
                if m.step < member["resume_step"]
            ]  # the resumed trial reports the checkpoint's step
            self.writer.log(run_id, history, tags={"resumed_from_run": previous})
        return run_id

    def on_trial_start(self, iteration, trials, trial, **info):
        self.runs_of(trial)

    def on_trial_recover(self, iteration, trials, trial, **info):
        self.restarts[trial.trial_id] = self.restarts.get(trial.trial_id, 0) + 1
        for run_id in self.runs_of(trial).values():
            self.writer.log(run_id, tags={"restarts": self.restarts[trial.trial_id]})

    def on_trial_result(self, iteration, trials, trial, result, **info):
        runs = self.runs_of(trial)
        tags = {}
        if "node" in result and self.nodes.get(trial.trial_id) != result["node"]:  # first report, or a new node
            self.nodes[trial.trial_id] = tags["node"] = result["node"]
        for report in member_results(result):  # a fused trial's members each to its own run
            run_id = runs[report["trial_key"]] if "members" in result else next(iter(runs.values()))
            self.log_report(run_id, report, iteration, tags)

    def log_report(self, run_id: str, result: dict, iteration: int, tags: dict) -> None:
        """One learning-rate run's report: metrics at its step, and its verdict if final."""
        metrics = numeric({k: v for k, v in result.items() if k in self.METRICS or k.startswith(SYSTEM)})
        if result.get("final"):
            metrics.update(numeric({k: v for k, v in result.items() if k in CELL_METRICS + TRIAL_METRICS}))
            tags = tags | {key: result[key] for key in ("status", "reason")}
        step = int(result.get("step", iteration))
        validated = self.validated.setdefault(run_id, set())
        # a resumed trial: the validations before its checkpoint, as the checkpoint holds them (its report has the
        # checkpoint's own)
        for check in result.get("history", []):
            if check["step"] < step and check["step"] not in validated:
                validated.add(check["step"])
                self.writer.log(run_id, numeric({self.HISTORY[k]: check[k] for k in self.HISTORY}), step=check["step"])
        if step in validated:  # a final or resumed report repeats its last validation, which the run has
            metrics = {k: v for k, v in metrics.items() if k not in self.VALIDATION}
        validated.update([step] if "val_accuracy" in metrics else [])
        self.writer.log(run_id, metrics, step=step, tags=tags)

    def on_trial_complete(self, iteration, trials, trial, **info):
        for run_id in self.runs_of(trial).values():
            self.end(run_id, "FINISHED")

    def on_trial_error(self, iteration, trials, trial, **info):
        runs = self.runs_of(trial)
        if STOP.requested:  # its worker died of the same stop (a process group or a pod signalled whole): KILLED
            return
        self.errors[trial.trial_id] = error_line(trial.error_file)
        tags = {"status": Status.FAILED, "reason": self.errors[trial.trial_id], "error": str(trial.error_file)}
        for run_id in runs.values():
            self.writer.log(run_id, tags=tags)
            self.end(run_id, "FAILED")

    def end(self, run_id: str, status: str) -> None:
        self.open.discard(run_id)
        self.writer.terminate(run_id, status)

    def stop(self, reason: str) -> None:
        """The sweep stopped before these trials ended (a lost node, an error, Ctrl-C): their runs are KILLED, with
        the reason, and hold no verdict; a rerun continues them from their checkpoints."""
        for run_id in sorted(self.open):
            self.writer.log(run_id, tags={"reason": reason})
            self.end(run_id, "KILLED")
        self.writer.flush()

    def on_experiment_end(self, trials, **info):
        self.writer.flush()


def reused_run(source: mlflow.entities.Run) -> dict:
    """A finished run taken as it is, as a run record: its final metrics and verdict, and the run itself as both
    ``mlflow_run_id`` and ``reused_from`` (its curves, datasets and parent stay where they are)."""
    tags = {k: source.data.tags[k] for k in ("status", "reason") if k in source.data.tags}
    metrics = {k: v for k, v in source.data.metrics.items() if k in CELL_METRICS + TRIAL_METRICS}
    return metrics | tags | {"mlflow_run_id": source.info.run_id, "reused_from": source.info.run_id}


def error_line(error_file: str | None) -> str:
    """The last line of a trial's error file: the exception, named."""
    if error_file is None:
        return "error: the trial raised (no error file)"
    try:
        lines = [line for line in Path(error_file).read_text().splitlines() if line.strip()]
    except OSError:
        return "error: the trial raised (no error file)"
    return f"error: {lines[-1].strip()}" if lines else "error: the trial raised"


VERDICTS = tuple(s for s in Status if s.verdict)  # how a finished trial ends on its own
