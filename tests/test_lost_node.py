"""A lost Ray node neither hangs a sweep nor loses its work, for real: (a) a local Ray whose raylet dies mid-sweep
(killing one of its agents is enough: the raylet fate-shares with them) stops the sweep at once with ``LostNode``
naming the node and its trials, every MLflow run closed as a non-result, and a rerun continues the trials from their
checkpoints; (b) on a two-node cluster on loopback addresses of a network namespace, the worker node killed mid-sweep
has its trial retried on the head, from its checkpoint, and the sweep ends with every cell decided."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from tests.helpers import KILLABLE_SWEEP, services
from tests.helpers.repo import copy_repo, mlflow_runs, run

pytestmark = [pytest.mark.slow, pytest.mark.integration]
NO_NAMESPACES = services.namespace_problem()  # the cluster's test needs them (root)


def sweep_repo(dst: Path, data: Path, steps: int = 400) -> Path:
    """A copy of this checkout on KILLABLE_SWEEP, its trials ``steps`` long, with the tiny profile's datasets in data/
    (the sweep stage alone runs)."""
    sweep = KILLABLE_SWEEP.replace("max_steps: 1600", f"max_steps: {steps}").replace(
        "stop_when_solved: false", f"stop_when_solved: false\n    convergence_min_steps: {steps}")  # none stops before
    repo = copy_repo(dst, sweep)
    shutil.copytree(data, repo / "data", dirs_exist_ok=True)
    return repo


def checkpoint_steps(storage: Path) -> dict[str, int]:
    """trial key -> the step of its newest checkpoint under ``storage``."""
    newest: dict[str, int] = {}
    for meta in storage.glob("*/*/checkpoint_*/meta.json"):
        try:
            m = json.loads(meta.read_text())
        except (FileNotFoundError, json.JSONDecodeError):  # Tune removing an old one, or writing
            continue
        newest[m["trial_key"]] = max(newest.get(m["trial_key"], 0), m["step"])
    return newest


def wait_for(condition, what: str, proc: subprocess.Popen, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        assert proc.poll() is None, f"the sweep ended while waiting for {what}: {proc.stdout.read()[-3000:]}"
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def descendants(pid: int, name: str) -> list[psutil.Process]:
    return [p for p in psutil.Process(pid).children(recursive=True) if name in " ".join(p.cmdline())]


def test_a_local_sweep_whose_raylet_dies_stops_naming_the_node_and_a_rerun_resumes(tiny_data, tmp_path):
    # long enough that the faster trial is still training when the slower one has a checkpoint: the stop must name both
    repo = sweep_repo(tmp_path, tiny_data, steps=1200)
    env = services.clean_env() | {"PATH": f"{Path(sys.executable).parent}:{services.clean_env()['PATH']}"}
    sweep = subprocess.Popen([sys.executable, "-m", "pipeline.sweep"], cwd=repo, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: len(steps := checkpoint_steps(repo / "ray_results")) == 2
                 and 20 <= min(steps.values()) and max(steps.values()) < 1200,
                 "a checkpoint of both trials while both still train", sweep)
        raylet = wait_for(lambda: descendants(sweep.pid, "raylet/raylet"), "the local raylet", sweep)[0]
        agent = next(p for p in raylet.children() if "RuntimeEnvAgent" in " ".join(p.cmdline()))
        agent.kill()
        killed = time.monotonic()
        out, _ = sweep.communicate(timeout=120)
        stopped = time.monotonic() - killed
    finally:
        if sweep.poll() is None:
            sweep.kill()
    print(f"\nthe sweep stopped {stopped:.1f} s after its raylet's agent was killed")
    assert sweep.returncode == 2, out[-3000:]
    error = next(line for line in out.splitlines() if line.startswith("error: "))
    assert "lost Ray node 127.0.0.1" in error and "lis3-standard-w16-d1-s0-lr0.003" in error, error
    assert "lis3-lstm-w16-d1-s0-lr0.003" in error and "missing CPU" in error, error
    assert stopped < 30  # a local Ray gets no node back: it stops at once (Tune's cleanup takes a few seconds)
    assert out.count("Cluster resources cannot be detected") <= 1  # Tune's loop no longer spins on a dead node
    _, parents, children = mlflow_runs(repo)
    assert [p.info.status for p in parents] == ["FAILED"] and "LostNode" in parents[0].data.tags["reason"]
    assert len(children) == 2 and {c.info.status for c in children} == {"KILLED"}
    assert all("lost Ray node 127.0.0.1" in c.data.tags["reason"] and "status" not in c.data.tags for c in children)
    left = checkpoint_steps(repo / "ray_results")
    assert len(left) == 2  # kept for the rerun

    rerun = run([sys.executable, "-m", "pipeline.sweep"], repo)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    trials = pd.read_csv(repo / "results" / "trials.csv")
    assert sorted(trials.resumed_step) == sorted(left.values())  # each continued from its newest checkpoint
    assert set(trials.status) <= {"solved", "undecided", "unsolved"}
    _, parents, children = mlflow_runs(repo)
    newest = max(parents, key=lambda r: r.info.start_time)
    mine = [c for c in children if c.data.tags["mlflow.parentRunId"] == newest.info.run_id]
    assert newest.info.status == "FINISHED" and len(mine) == 2 and {c.info.status for c in mine} == {"FINISHED"}
    killed_ids = {c.info.run_id for c in children if c.info.status == "KILLED"}
    assert {c.data.tags["resumed_from_run"] for c in mine} == killed_ids  # each curve takes over the stopped run's


def reported_from(storage: Path, ip: str) -> int:
    """The newest checkpoint's step of the trial whose last report came from the node at ``ip`` (0: none yet)."""
    for trial in storage.glob("*/*-lr*"):
        lines = (trial / "result.json").read_text().splitlines() if (trial / "result.json").exists() else []
        if lines and json.loads(lines[-1]).get("node_ip") == ip:
            steps = [json.loads(m.read_text())["step"] for m in trial.glob("checkpoint_*/meta.json")]
            return max(steps, default=0)
    return 0


@pytest.mark.cluster
@pytest.mark.skipif(bool(NO_NAMESPACES), reason=f"needs network namespaces: {NO_NAMESPACES}")
def test_a_cluster_sweep_retries_a_lost_worker_nodes_trial_on_the_head(tiny_data, tmp_path):
    # long enough that the worker's trial is seen in storage before it ends: its reports reach storage through the
    # driver, which shares two busy cores with both nodes (400 steps ended unseen under `pytest -n 2`)
    repo = sweep_repo(tmp_path / "checkout", tiny_data, steps=1200)
    shared = tmp_path / "shared"
    # the head's GCS declares a silent node dead after 1 s instead of Ray's 15 s (3 s a check, 5 missed)
    with services.ray_cluster(tmp_path / "ray", RAY_health_check_period_ms="500",
                              RAY_health_check_failure_threshold="2") as cluster:
        worker = cluster.node_ips[1]
        sweep = subprocess.Popen(cluster.command([sys.executable, "-m", "pipeline.sweep"]), cwd=repo, text=True,
                                 env=cluster.driver_env(CAPACITY_ATLAS_STORAGE=str(shared)),
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: reported_from(shared, worker) >= 20, f"a checkpoint of the trial on {worker}", sweep)
            for pid in services.tree(cluster.roots[1]):  # the worker node dies: its raylet, workers, everything
                psutil.Process(pid).kill()
            out, _ = sweep.communicate(timeout=300)
        finally:
            if sweep.poll() is None:
                sweep.kill()
    assert sweep.returncode == 0, out[-3000:]
    assert f"lost Ray node {worker}" in out, out[-3000:]
    trials = pd.read_csv(repo / "results" / "trials.csv")
    assert set(trials.status) <= {"solved", "undecided", "unsolved"} and len(trials) == 2  # every cell decided
    retried = trials[trials.restarts == 1]
    assert len(retried) == 1 and retried.resumed_step.iloc[0] >= 20 and retried.node.iloc[0] == cluster.node_ips[0]
    _, _, children = mlflow_runs(repo)
    assert len(children) == 2 and {c.info.status for c in children} == {"FINISHED"}
