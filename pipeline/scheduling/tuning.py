"""A sweep's Tune run (``train_trials``) and what Ray Tune calls during it, kept apart from the logic it drives so
that the forecast, the replay and a trial outside Tune import no Ray: the cell searcher with Tune's ``Searcher`` as
its base, the trials' MLflow runs (``ChildRuns``) as a Tune callback, the callbacks that learn where a paused trial
left its checkpoint and delete a finished trial's, the one that watches for lost Ray nodes, and the one that ends
Tune's loop when the sweep is asked to stop."""

from __future__ import annotations

import os
import time
from pathlib import Path

from ray import tune
from ray.tune.search import Searcher

from pipeline.common.config import Config
from pipeline.common.signals import STOP
from pipeline.common.status import Status
from pipeline.data.storage import location_of
from pipeline.scheduling import cluster
from pipeline.scheduling.cluster import LostNode, alive_nodes, fits, let_go, shortfall, trial_bundle
from pipeline.scheduling.console import SweepProgress, reporter, trial_name
from pipeline.search.searcher import CellSearcher
from pipeline.tracking.parent import SweepRun
from pipeline.tracking.runs import ChildRuns
from pipeline.training.checkpoint_store import checkpoint_dirs, drop_checkpoints, drop_member, drop_trial
from pipeline.training.members import member_results, members

RESUME = (
    "a sweep resumes with `dvc repro` (or python -m pipeline.sweep), not Tuner.restore: its state is the runs "
    "MLflow holds (a finished one is reused) and the trials' checkpoints (an unfinished one continues from its "
    "newest); see docs/cluster.md, 'Surviving failures'"
)


# Ray's annotation of ``suggest`` leaves out Searcher.FINISHED, which its docstring and SearchGenerator accept
class TuneSearcher(CellSearcher, Searcher):  # type: ignore[misc]
    """``CellSearcher`` as Tune's ``search_alg`` (its ``suggest``, ``on_trial_result``, ``on_trial_complete``
    override Tune's; the rest is Tune's own)."""

    def save(self, checkpoint_path: str) -> None:
        """Tune saves a searcher with its experiment; this one's state is not Tune's to keep (``RESUME``), so the
        file says where it is."""
        Path(checkpoint_path).write_text(RESUME + "\n")

    def restore(self, checkpoint_path: str) -> None:
        raise RuntimeError(f"Tuner.restore cannot continue this sweep: {RESUME}")


class TuneChildRuns(ChildRuns, tune.Callback):
    """``ChildRuns`` as a Tune callback (its ``on_trial_*`` hooks override Tune's; the rest is Tune's own)."""


class RungCheckpoints(tune.Callback):
    """Where a trial that paused at a rung left its checkpoint (the last one it reported, at the rung's
    validation), for the searcher to continue it from; ``storage``: the sweep's storage path."""

    def __init__(self, searcher: CellSearcher, storage: str):
        self.searcher, self.storage = searcher, storage

    def on_trial_result(self, iteration, trials, trial, result, **info):
        paused = any(r.get("status") == Status.PAUSED for r in member_results(result))
        if result.get("final") and paused and trial.checkpoint is not None:
            self.searcher.rung_checkpoints[trial.trial_id] = location_of(trial.checkpoint.path, self.storage)


class DropFinished(tune.Callback):
    """Listed after ``ChildRuns`` (which has then set the trial's MLflow run FINISHED, with its verdict): a trial
    that ended deletes its checkpoints, and those of the dead sweep's trial it continued from. A trial that failed
    keeps them (``on_trial_error``, not ``on_trial_complete``), one paused at a rung of successive halving too: it
    may go on from them (the sweep deletes a dropped one's, ``drop_trial``). A fused trial's members each apart: one
    that paused keeps its directory of the trial's checkpoints, the others' are deleted."""

    def on_trial_complete(self, iteration, trials, trial, **info):
        fs, reports = trial.storage.storage_filesystem, member_results(trial.last_result)
        paused = [r.get("status") == Status.PAUSED for r in reports]
        if not any(paused):
            drop_checkpoints(fs, trial.path)
        elif not all(paused):  # a fused trial's members that ended
            for checkpoint in checkpoint_dirs(fs, trial.path):
                for report, waits in zip(reports, paused):
                    if not waits:
                        drop_member(fs, checkpoint, report["trial_key"])
        for member in members(trial.config):  # <storage>/<dead sweep or paused attempt>/<trial>/checkpoint_NNNNNN
            if member.get("resume"):
                drop_trial(member["resume"])


class NodeWatch(tune.Callback):
    """Watches the Ray nodes from Tune's loop, at most every ``every`` seconds. A node seen alive that is alive no
    more is named with the unfinished trials whose last report came from it; Tune retries those from their
    checkpoints on the nodes left (``sweep.runs.max_failures``). A node an autoscaler let go idle, running none, is said
    to have left, not counted as lost. Once no alive node can hold a trial (of ``cpu`` CPUs and ``gpu`` GPUs) for
    ``wait`` seconds, raises ``LostNode`` naming the lost nodes and their trials: Tune itself would wait for
    resources forever, warning that it cannot see any."""

    def __init__(self, cpu: float, gpu: float, wait: float, every: float = 1.0):
        self.bundle, self.wait, self.every = trial_bundle(cpu, gpu), wait, every
        self.seen: dict[str, str] = {}  # node id -> address, of every node seen alive
        self.lost: dict[str, str] = {}  # node id -> the node, when it was lost and what it was running
        self.gone: set[str] = set()  # node ids seen alive and gone: lost, or let go idle by an autoscaler
        self.where: dict[str, str] = {}  # trial name -> the address of the node its last report came from
        self.checked = 0.0
        self.short_since: float | None = None  # since when no alive node can hold a trial

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.where[str(trial)] = result.get("node_ip", "")  # Tune adds it to every result

    def on_step_begin(self, iteration, trials, **info):
        now = time.monotonic()
        if now - self.checked < self.every:
            return
        self.checked = now
        alive = alive_nodes()
        self.seen |= {n["NodeID"]: n["NodeManagerAddress"] for n in alive}
        for node_id in self.seen.keys() - {n["NodeID"] for n in alive} - self.gone:
            self.gone.add(node_id)
            address = self.seen[node_id]
            running = [str(t) for t in trials if not t.is_finished() and self.where.get(str(t)) == address]
            if not running and (why := let_go(node_id)):  # an autoscaler's idle node: nothing was lost
                print(f"sweep: Ray node {address} (node {node_id[:12]}) left the cluster idle: {why}", flush=True)
                continue
            self.lost[node_id] = (
                f"{address} (node {node_id[:12]}) at {time.strftime('%H:%M:%S')}, running "
                f"{', '.join(running) or 'no trial that had reported'}"
            )
            print(
                f"sweep: lost Ray node {self.lost[node_id]}; Tune retries its trials from their checkpoints on the "
                "nodes left",
                flush=True,
            )
        if any(fits(n["Resources"], self.bundle) for n in alive):
            self.short_since = None
            return
        self.short_since = self.short_since or now
        if now - self.short_since >= self.wait:
            raise LostNode(
                f"lost Ray node {'; lost Ray node '.join(self.lost.values()) or '(none seen)'}; for {self.wait:g} s "
                f"(cluster.node_wait_s) no node could run a trial: {shortfall(alive, self.bundle)}. The sweep stops: "
                "its finished trials are in MLflow, and `dvc repro` continues the others from their checkpoints"
            )


class RetriesOnProgress(tune.Callback):
    """``sweep.runs.max_failures`` counts a trial's failures in a row without progress: a trial whose last attempt
    saved a newer checkpoint than the one it started from gets its retries back, so a long trial on a cluster that
    kills often (each attempt past its last checkpoint) is not failed, while one that dies before any new checkpoint
    still fails after ``max_failures`` retries. Tune counts every failure (``Trial.num_failures``); at each recovery
    this sets the count back to this one failure where the checkpoint moved since the last."""

    def __init__(self):
        self.started_from: dict[str, str | None] = {}  # trial id -> the checkpoint its attempt continued from

    def on_trial_recover(self, iteration, trials, trial, **info):
        latest = trial.checkpoint.path if trial.checkpoint is not None else None
        if latest is not None and latest != self.started_from.get(trial.trial_id):
            trial.run_metadata.num_failures = 1  # this failure opens a new streak
        self.started_from[trial.trial_id] = latest


class StopOnSignal(tune.Callback):
    """Listed first: a stop request (SIGTERM, SIGINT: ``pipeline.common.signals.STOP``) that came during Tune's loop
    is raised at its next step, before the step reads its trials' events; Tune's own SIGINT handler would end the loop
    as if the sweep had finished."""

    def on_step_begin(self, iteration, trials, **info):
        STOP.check()


def run_cell(config: dict) -> None:
    """The trainable Tune runs in its workers, ``pipeline.scheduling.trainable.run_cell``, imported there only: the
    driver never loads Lightning (about a CPU-second a sweep)."""
    from pipeline.scheduling.trainable import run_cell as run

    run(config)


def train_trials(
    cfg: Config, run: SweepRun, searcher: TuneSearcher, children: TuneChildRuns, published: dict[str, str], local: bool
) -> int:
    """Joins the cluster (a local Ray is already up), checks it can run a trial, and runs Tune until the searcher
    has nothing left; returns the number of trial slots."""
    s, store = cfg.sweep, cfg.cluster.storage()
    address = "local" if local else cluster.connect_ray(cfg.cluster.ray(), os.cpu_count() or 1)
    STOP.install()  # ray.init set its own SIGTERM handler
    run.client.log_param(run.parent, "ray", address)
    wait = 0 if local else cfg.cluster.node_wait_s  # no node joins a local Ray
    cluster.check_resources(**s.resources.trial_resources(), wait=wait)
    if not local:  # a local Ray runs this process's code on files it has read: nothing to probe
        on_gpus = bool(s.resources.gpus_per_trial)
        bf16 = tuple(s.grid.architectures) if s.optim.precision == "bf16-mixed" and not on_gpus else ()
        cluster.probe_nodes(next(iter(published.values())), bf16=bf16, gpus=on_gpus)
    # Tune starts one trial at a time from a searcher unless told how many may run: say it, or the next trial
    # waits for the last one's worker to come up
    slots = cluster.trial_slots(**s.resources.trial_resources(), wanted=s.resources.max_concurrent_trials, local=local)
    tuner = tune.Tuner(
        tune.with_resources(run_cell, s.resources.trial_resources()),
        tune_config=tune.TuneConfig(
            search_alg=searcher,
            num_samples=-1,
            max_concurrent_trials=slots,
            reuse_actors=True,
            trial_name_creator=trial_name,
            trial_dirname_creator=lambda t: f"{trial_name(t)}-{members(t.config)[0]['trial_key']}-{t.trial_id}",
        ),
        run_config=tune.RunConfig(
            name=f"{cfg.profile}-{int(run.started)}",
            storage_path=store,
            verbose=1 if s.runs.console == "table" else 0,
            # a stop request first: it ends the loop before the others read a stopping cluster's events
            callbacks=[
                StopOnSignal(),
                children,
                SweepProgress(searcher, children.writer, run.parent),
                RungCheckpoints(searcher, store),
            ]
            + ([] if s.runs.keep_checkpoints else [DropFinished()])
            + [NodeWatch(**s.resources.trial_resources(), wait=wait), RetriesOnProgress()],
            progress_reporter=reporter() if s.runs.console == "table" else None,
            failure_config=tune.FailureConfig(max_failures=s.runs.max_failures),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=s.runs.checkpoints_to_keep),
        ),
    )
    with STOP.deferred():  # a signal stops Tune's loop between two events (StopOnSignal)
        tuner.fit()
    return slots
