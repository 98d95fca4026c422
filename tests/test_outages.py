"""A sweep outlives its services: its MLflow server killed mid-sweep and started again 20 seconds later on the same
store and address (a restarted pod, a server job requeued onto its host); its head node lost, the whole Ray cluster
and its driver killed at once, and the job started again on a fresh head (a Slurm requeue, a new RayJob)."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
from mlflow.tracking import MlflowClient

from tests.helpers import KILLABLE_SWEEP, services
from tests.helpers.repo import copy_generated, mlflow_runs

pytestmark = [pytest.mark.slow, pytest.mark.integration]

NAMESPACES = services.namespace_problem()  # why a cluster cannot run here, or None
SAME = ["status", "reason", "final_accuracy", "val_accuracy", "train_steps", "train_pflops"]
OUTAGE_S = 20  # past MLflow's first retries: the writes in flight wait through it, as they would through a minute
STEPS = 5_000
# the tiny sweep's two trials, long enough to train through the outage and on after it: each runs its whole budget
# (no stop when solved or converged, no extension, no epoch limit: the tiny set is 10 batches), validating every 20
# steps
LONG_SWEEP = (
    KILLABLE_SWEEP.replace("max_steps: 1600", f"max_steps: {STEPS}")
    .replace("epochs: 100", "epochs: 10000")
    .replace("stop_when_solved: false", f"stop_when_solved: false\n    convergence_min_steps: {STEPS}")
    .replace("verdict:", "verdict:\n    max_budget_factor: 1")
)


def validations(client: MlflowClient, run_id: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, "val_accuracy"))


def test_a_sweep_whose_mlflow_server_restarts_midway_records_every_run_and_metric(generated, tmp_path):
    repo = copy_generated(generated, tmp_path / "checkout", LONG_SWEEP)
    with services.mlflow_server(tmp_path / "mlflow") as server:
        env = services.clean_env() | {"MLFLOW_TRACKING_URI": server.uri}
        sweep = subprocess.Popen([sys.executable, "-m", "pipeline.sweep"], cwd=repo, env=env, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            client = MlflowClient(server.uri)

            def validated() -> bool:  # both trials' runs have a validation on the server
                experiment = client.get_experiment_by_name("capacity-atlas")
                runs = client.search_runs(experiment.experiment_id) if experiment else []
                children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
                return len(children) == 2 and all("val_accuracy" in r.data.metrics for r in children)

            services.wait_for("both trials validated on the server", validated, [sweep], tmp_path / "none.log",
                              timeout=300)
            runs = client.search_runs(client.get_experiment_by_name("capacity-atlas").experiment_id)
            before = {r.info.run_id: validations(client, r.info.run_id)[-1:] for r in runs}
            for pid in server.pids():  # the server dies at once: no clean shutdown, requests cut mid-flight
                with contextlib.suppress(psutil.NoSuchProcess):
                    psutil.Process(pid).send_signal(signal.SIGKILL)
            time.sleep(OUTAGE_S)
            assert sweep.poll() is None, "the sweep ended during the outage: lengthen LONG_SWEEP"
            port = int(server.uri.rsplit(":", 1)[1])
            with services.mlflow_server(tmp_path / "mlflow", backend=server.backend_uri, port=port) as again:
                out, _ = sweep.communicate(timeout=900)
                assert sweep.returncode == 0, out[-3000:]
                client = MlflowClient(again.uri)
                runs = client.search_runs(client.get_experiment_by_name("capacity-atlas").experiment_id)
                histories = {r.info.run_id: validations(client, r.info.run_id) for r in runs}
        finally:
            if sweep.poll() is None:
                sweep.kill()
    summary = json.loads((repo / "results" / "sweep.json").read_text())
    assert summary["mlflow_write_errors"] == 0, out[-3000:]
    assert len(runs) == 3 and {r.info.status for r in runs} == {"FINISHED"}, out[-3000:]  # the parent and 2 trials
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    for child in children:  # every validation on the server, those it could not take when they came among them
        assert histories[child.info.run_id] == list(range(20, STEPS + 1, 20)), child.info.run_name
        assert before[child.info.run_id][0] < STEPS  # it was training when the server died
        assert "final_accuracy" in child.data.metrics


def checkpointed(storage: Path) -> int:
    """Trials with a checkpoint in ``storage`` now."""
    return sum(1 for trial in storage.glob("*/*-lr*") if any(trial.glob("checkpoint_*/meta.json")))


@pytest.mark.cluster
@pytest.mark.skipif(NAMESPACES is not None, reason=f"needs network namespaces: {NAMESPACES}")
def test_a_sweep_whose_head_node_is_lost_finishes_on_a_fresh_head_as_if_undisturbed(uninterrupted, generated,
                                                                                   tmp_path):
    local, _ = uninterrupted
    repo = copy_generated(generated, tmp_path / "checkout", KILLABLE_SWEEP)
    shared = tmp_path / "shared"  # the storage every node mounts, and the checkout, outlive the nodes
    with services.ray_cluster(tmp_path / "ray") as cluster:
        env = cluster.driver_env(CAPACITY_ATLAS_STORAGE=str(shared))
        sweep = subprocess.Popen(cluster.command([sys.executable, "-m", "pipeline.sweep"]), cwd=repo, env=env,
                                 text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            # once a trial has a checkpoint (not both: with a slot on each node, Tune may run the second trial on
            # the first one's actor once that ends, its checkpoints dropped)
            services.wait_for("a trial checkpointed", lambda: checkpointed(shared), [sweep], tmp_path / "none.log",
                              timeout=300)
            doomed = {pid for root in [*cluster.roots, sweep.pid] for pid in services.tree(root)}
            for pid in doomed:  # every Ray process of both nodes and the driver, at once
                with contextlib.suppress(psutil.NoSuchProcess):
                    psutil.Process(pid).send_signal(signal.SIGKILL)
            sweep.wait(timeout=30)
        finally:
            if sweep.poll() is None:
                sweep.kill()
    with services.ray_cluster(tmp_path / "ray-again") as cluster:  # the job requeued: a fresh head, a fresh Ray
        env = cluster.driver_env(CAPACITY_ATLAS_STORAGE=str(shared))
        result = subprocess.run(cluster.command([sys.executable, "-m", "pipeline.sweep"]), cwd=repo, env=env,
                                capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "closed the runs of sweep" in result.stdout  # the dead driver's runs, as KILLED
    again = pd.read_csv(repo / "results" / "trials.csv").set_index(["arch", "lr"]).sort_index()
    undisturbed = pd.read_csv(local / "results" / "trials.csv").set_index(["arch", "lr"]).sort_index()
    assert (again.resumed_step > 0).any(), again  # a trial went on from its checkpoint, not from the start
    pd.testing.assert_frame_equal(again[SAME], undisturbed[SAME])
    _, parents, children = mlflow_runs(repo)
    assert {r.info.status for r in [*parents, *children]} == {"FINISHED", "KILLED"}  # none left RUNNING
