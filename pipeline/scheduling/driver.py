"""The sweep stage's driver: the process that checks the config's services and datasets, plans the trials, runs
them with Ray Tune and records them in MLflow (``sweep``); ``pipeline.sweep`` is its command line, which checks the
config before importing this module (Ray, MLflow and Lightning take seconds to import).
"""

from __future__ import annotations

import os
import time
from dataclasses import astuple, replace
from pathlib import Path

import pandas as pd
import psutil
import ray
from mlflow.tracking import MlflowClient

from pipeline.common.cell import DATA_FILES, Cell, CellSpec
from pipeline.common.config import ROOT, STORES_LOCK, Config
from pipeline.common.locks import owned
from pipeline.common.signals import STOP, Stopped
from pipeline.data import storage
from pipeline.scheduling import cluster
from pipeline.scheduling.cluster import check_ray
from pipeline.scheduling.tuning import TuneChildRuns, TuneSearcher, train_trials
from pipeline.search.cells import (
    build_cells,
    expected_cost,
    model_costs,
    run_key,
    unfusable,
)
from pipeline.search.frontier import make_plan
from pipeline.search.halving import Halving
from pipeline.search.searcher import trial_key
from pipeline.tracking.parent import SweepRun, open_parent_run
from pipeline.tracking.results import SweepResult, cell_table, curve_table, record, summarise, trial_table
from pipeline.tracking.runs import (
    Heartbeat,
    close_orphans,
    killed_runs,
    reused_run,
)
from pipeline.tracking.services import check_job_paths, check_mlflow, ui_link
from pipeline.training import checkpoint_store
from pipeline.training.settings import TrainSettings
from tasks.registry import training_targets


def sweep(cfg: Config, data_dir: Path, out_dir: Path) -> pd.DataFrame:
    """The stage: cells built from the datasets, MLflow and Ray checked, the project's stores taken (waiting for
    another sweep of the project to end), a local Ray started (a cluster is joined later, only if something needs
    training), then ``run_sweep``; Ray is left when it ends, however it ends."""
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # the classic trial table, not a box per trial and result
    # Tune saves its experiment state whenever a trial has made checkpoints_to_keep checkpoints, and warns about it
    # at every validation of short trials; we restore from our own checkpoints, not from that state
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    # MLflow's client prints a "View run" link for every run it ends on a server: one per trial
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    # Tune's own SIGINT handler ends its loop as if the sweep had finished; the sweep's (STOP) closes it as stopped
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    stage_start = psutil.Process().create_time()  # the stage's process, imports included
    check_job_paths(cfg.cluster.mlflow(), cfg.cluster.storage(), ROOT)  # a submitted job's stores, before its data
    cells = build_cells(cfg, data_dir)  # DatasetError before anything starts
    check_mlflow(cfg.cluster.mlflow(), cfg.sweep.runs.experiment)
    check_ray(cfg.cluster.ray())
    local = cfg.cluster.ray() is None
    # sweeps of one project (DVC's queue workers, a `dvc repro` beside a queue) train one after another: two at once
    # would each start a local Ray on every core, train their common trials twice (neither finished when the
    # other plans) and continue each other's live checkpoints
    waiting = f"sweep: waiting for the sweep training against this project's stores ({{holder}}) to end: {STORES_LOCK}"
    with owned(STORES_LOCK, waiting, wait=True, waiting=waiting):
        try:
            if local:
                cluster.connect_ray(None, os.cpu_count() or 1)
                STOP.install()  # ray.init set its own SIGTERM handler
            return run_sweep(cfg, cells, out_dir, stage_start, local)
        finally:
            ray.shutdown()


def run_sweep(cfg: Config, cells: dict[Cell, CellSpec], out_dir: Path, stage_start: float, local: bool) -> pd.DataFrame:
    """The sweep once its cells are built (and a local Ray is up): MLflow runs, the plan, Tune, the outputs."""
    s = cfg.sweep
    # a solved trial trains on to the highest threshold a claim on its task reads
    targets = training_targets(sorted({c.task for c in cells}), cfg.report.accuracy_threshold)
    train = TrainSettings.of(cfg, targets).params()
    key = run_key(reuse_settings(cfg, train))
    published = prepare_cells(cells, key, s.model.heads, cfg.cluster.storage())
    started = time.time()
    client, parent = open_parent_run(cfg, cells, train, key)
    run = SweepRun(client, parent, out_dir, started, stage_start)
    heartbeat = Heartbeat(client, parent, cfg.cluster.heartbeat_s)  # this driver alive, for sweeps on other hosts
    status = "FAILED"
    children = None
    try:
        children, searcher, to_train = prepare_searcher(cfg, client, parent, cells, train, key)
        slots = train_trials(cfg, run, searcher, children, published, local) if to_train else 0
        children.writer.flush()  # every child run's data is in MLflow before the tables name the runs
        trials = trial_table(searcher, cells, children).assign(parent_run_id=parent)
        table = cell_table(searcher, cells, cfg.report.accuracy_threshold).assign(parent_run_id=parent)
        summary = summarise(cfg, run, table, trials, searcher.plan, slots)
        summary["mlflow_write_errors"] = len(children.writer.errors)
        # the forecast beside what was spent: the grid's training at its first budget, every learning rate
        summary["grid_pflops"] = round(sum(expected_cost(c, s.optim) * len(c.lrs) for c in cells.values()) / 1e6, 6)
        result = SweepResult(table, trials, curve_table(searcher), summary, searcher.plan, children.writer.errors)
        record(run, result)
        status = "FINISHED" if summary["failed"] == 0 else "FAILED"
        return table
    except BaseException as err:  # a lost node, an error, a signal: no run is left RUNNING, none holds a result
        reason = f"killed: the sweep stopped: {type(err).__name__}: {err}"
        client.set_tag(parent, "reason", reason)
        if children is not None:
            children.stop(reason)
        status = "KILLED" if isinstance(err, Stopped) else "FAILED"  # stopped when asked, or by what went wrong
        raise
    finally:
        heartbeat.stop()
        client.set_terminated(parent, status)


def reuse_settings(cfg: Config, train: dict) -> dict:
    """What the reuse key hashes besides the code and the libraries: the trials' settings ``train`` but the threads,
    which change speed, not results; the architecture options, which change results but are not part of the cell id;
    the halving rungs, which decide which learning rates a sweep drops."""
    halving = Halving.of(cfg.sweep.search)
    rungs = {"halving": list(astuple(halving))} if halving.rungs else {}
    return {k: v for k, v in train.items() if k != "threads"} | {"arch_options": cfg.sweep.grid.arch_options} | rungs


def prepare_cells(cells: dict[Cell, CellSpec], key: str, heads: int, store: str) -> dict[str, str]:
    """Gives every cell its run key and model costs, and publishes each dataset file once to the storage every
    node reads (the cells then point there); returns local file -> published location."""
    published: dict[str, str] = {}
    for at, cell in cells.items():
        for k in DATA_FILES:
            path = getattr(cell, k)
            if path not in published:
                published[path] = storage.publish(Path(path), store, cell.sha256[k])
        cells[at] = replace(
            cell,
            run_key=key,
            train_path=published[cell.train_path],
            test_path=published[cell.test_path],
            val_path=published[cell.val_path],
            **model_costs(cell, heads),
        )
    return published


def prepare_searcher(
    cfg: Config, client: MlflowClient, parent: str, cells: dict[Cell, CellSpec], train: dict, key: str
) -> tuple[TuneChildRuns, TuneSearcher, bool]:
    """The searcher over the plan, knowing which runs this experiment already finished (reused, not trained) and
    which a dead sweep left unfinished (continued from their checkpoints); the dead sweep's runs are closed.
    Also says whether anything needs training."""
    s = cfg.sweep
    experiment = client.get_run(parent).info.experiment_id
    close_orphans(client, experiment)  # runs of sweeps whose driver died: KILLED
    # trial key -> the newest checkpoint a dead or stopped sweep left (sweep.runs.reuse: false trains everything anew)
    unfinished = checkpoint_store.latest(cfg.cluster.storage(), key) if s.runs.reuse else {}
    children = TuneChildRuns(client, experiment, parent, cfg.profile, killed_runs(client, experiment, key))
    finished = children.finished(key) if s.runs.reuse else {}

    def reusable(cell: CellSpec, lr: float) -> dict | None:
        source = finished.get(trial_key(cell, lr))
        return None if source is None else reused_run(source)

    def dropped(run: dict) -> None:
        children.drop(run)
        if not s.runs.keep_checkpoints:
            checkpoint_store.drop_trial(run["checkpoint"])

    single = unfusable(cells, s.model.heads) if s.resources.fuse != "off" else {}
    for arch, why in single.items():
        print(
            f"sweep: sweep.resources.fuse: {s.resources.fuse}: {arch} cannot fuse ({why}): its learning rates train "
            f"as separate trials{sharing(s.resources.gpus_per_trial)}"
        )
    searcher = TuneSearcher(
        make_plan(s.search.strategy, cells, s.search.predict),
        cells,
        train,
        reusable,
        cost=lambda cell: expected_cost(cell, s.optim),
        resumable=unfinished,
        halving=Halving.of(s.search),
        dropped=dropped,
        fuse=lambda cell: s.resources.fuse == "learning_rates" and cell.arch not in single,
    )
    to_train = searcher.needs_training()  # settles the reused runs first, and fills the queue
    reused = sum("reused_from" in run for runs in searcher.runs.values() for run in runs.values())
    print(
        f"sweep: profile {cfg.profile}, {s.search.strategy} search over {len(cells)} cells, "
        f"{sum(len(c.lrs) for c in cells.values())} (cell, learning rate) runs at most: {reused} already "
        f"finished with the same data, settings and code (reused), {searcher.queued} to train"
        f"{' first (the search adds more as results come)' if s.search.strategy == 'frontier' else ''}; "
        f"MLflow {cfg.cluster.mlflow()}, runs at {ui_link(cfg.cluster.mlflow_ui(), experiment, parent)}",
        flush=True,
    )
    return children, searcher, to_train


def sharing(share: float) -> str:
    """How separate trials of ``share`` of a GPU each share one, in words (nothing for CPU trials)."""
    if 0 < share < 1:
        return f", packed {int(1 / share + 1e-9)} a GPU (sweep.resources.gpus_per_trial: {share:g})"
    if share:  # fusion takes one worker a trial (SweepConfig.fusion_fits): one GPU
        return ", a GPU each (sweep.resources.gpus_per_trial below 1 packs them)"
    return ""
