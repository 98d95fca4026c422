"""A sweep on a real cluster: two Ray nodes with token authentication and an MLflow server, on loopback inside a
network namespace (tests/helpers/services.py). The driver runs from a checkout the nodes never look at: the code reaches
them as Ray py_modules, the datasets through the storage path. The results must equal a local run's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from tests.helpers import KILLABLE_SWEEP, services
from tests.helpers.repo import copy_repo, run

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.integration]
if problem := services.namespace_problem():
    pytestmark.append(pytest.mark.skip(reason=f"needs network namespaces: {problem}"))

SAME = ["status", "reason", "final_accuracy", "val_accuracy", "train_steps", "train_pflops"]


def trials(results: Path) -> pd.DataFrame:
    return pd.read_csv(results / "trials.csv").set_index(["arch", "lr"]).sort_index()


def test_a_sweep_on_two_token_authenticated_nodes_records_everything_on_the_server(uninterrupted, tmp_path):
    local, _ = uninterrupted
    repo = copy_repo(tmp_path / "checkout", KILLABLE_SWEEP)
    assert run(["dvc", "repro", "generate"], repo).returncode == 0
    shared = tmp_path / "shared"  # what a cluster mounts on every node (or an s3:// URI)
    with services.ray_cluster(tmp_path / "ray") as cluster, \
            services.mlflow_server(tmp_path / "mlflow", cluster.netns) as server:
        env = cluster.driver_env(MLFLOW_TRACKING_URI=server.uri, CAPACITY_ATLAS_STORAGE=str(shared))
        result = subprocess.run(cluster.command([sys.executable, "-m", "pipeline.sweep"]), cwd=repo, env=env,
                                capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

        def recorded():
            client = MlflowClient(server.uri)
            exp = client.get_experiment_by_name("capacity-atlas")
            runs = client.search_runs([exp.experiment_id])

            def files(run_id: str, path: str | None = None) -> list[str]:  # the artifact files, in folders too
                return [f for a in client.list_artifacts(run_id, path)
                        for f in (files(run_id, a.path) if a.is_dir else [a.path])]

            return runs, {r.info.run_id: files(r.info.run_id) for r in runs}

        runs, artifacts = server.netns.call(recorded)
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(children) == 2 and all(c.info.status == "FINISHED" for c in children)
    assert {c.data.tags["node"] for c in children} == set(cluster.node_ips), result.stdout[-4000:]  # both trained
    stored = {p.name for p in server.artifact_root.rglob("*") if p.is_file()}
    assert {"config.yaml", "sweep.json"} <= stored  # the parent's config and its per-cell table (an MLflow table)
    assert all(Path(a).name in stored for paths in artifacts.values() for a in paths)
    assert (shared / "datasets").is_dir()  # the trials read the data from there
    trial_dirs = [d for d in shared.glob("*/*-lr*") if d.is_dir()]
    assert len(trial_dirs) == 2 and not [c for d in trial_dirs for c in d.glob("checkpoint_*")]  # deleted once done
    pd.testing.assert_frame_equal(trials(repo / "results")[SAME], trials(local / "results")[SAME])
