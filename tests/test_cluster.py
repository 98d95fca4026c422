"""A sweep on a real cluster: two Ray nodes with token authentication and an MLflow server, on loopback inside a
network namespace (tests/helpers/services.py). The driver runs from a checkout the nodes never look at: the code reaches
them as Ray py_modules, the datasets through the storage path. The results must equal a local run's, there and on a
cluster whose worker nodes Ray's autoscaler starts as the sweep asks for them. And the resource check before any
trial, on a cluster whose node with a trial's GPU joins late."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from tests.helpers import KILLABLE_SWEEP, ROOT, services
from tests.helpers.repo import copy_generated

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.integration]
if problem := services.namespace_problem():
    pytestmark.append(pytest.mark.skip(reason=f"needs network namespaces: {problem}"))

SAME = ["status", "reason", "final_accuracy", "val_accuracy", "train_steps", "train_pflops"]


def trials(results: Path) -> pd.DataFrame:
    return pd.read_csv(results / "trials.csv").set_index(["arch", "lr"]).sort_index()


def test_a_sweep_on_two_token_authenticated_nodes_records_everything_on_the_server(uninterrupted, generated,
                                                                                   tmp_path):
    local, _ = uninterrupted
    repo = copy_generated(generated, tmp_path / "checkout", KILLABLE_SWEEP)
    shared = tmp_path / "shared"  # what a cluster mounts on every node (or an s3:// URI)
    # the head takes no trial: with one on each node, Tune (reuse_actors) hands the second to the first's actor
    # when that one ends before the worker's has started, and both train on the head
    with services.ray_cluster(tmp_path / "ray", head_cpus=0) as cluster, \
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
    assert {c.data.tags["node"] for c in children} == {cluster.node_ips[1]}, result.stdout[-4000:]  # the driver's not
    stored = {p.name for p in server.artifact_root.rglob("*") if p.is_file()}
    assert {"config.yaml", "sweep.json"} <= stored  # the parent's config and its per-cell table (an MLflow table)
    assert all(Path(a).name in stored for paths in artifacts.values() for a in paths)
    assert (shared / "datasets").is_dir()  # the trials read the data from there
    trial_dirs = [d for d in shared.glob("*/*-lr*") if d.is_dir()]
    assert len(trial_dirs) == 2 and not [c for d in trial_dirs for c in d.glob("checkpoint_*")]  # deleted once done
    pd.testing.assert_frame_equal(trials(repo / "results")[SAME], trials(local / "results")[SAME])


def test_an_autoscaler_starts_the_nodes_the_sweep_asks_for(uninterrupted, generated, tmp_path):
    """KubeRay's shape under Ray's own autoscaler: a head that takes no trial and a worker group at zero nodes. The
    resource check's request starts one node, the trial waiting for the second slot (``max_concurrent_trials``) a
    second; the verdicts are a local run's."""
    local, _ = uninterrupted
    repo = copy_generated(generated, tmp_path / "checkout", KILLABLE_SWEEP)  # asks for 2 trials at once
    group = {"cpu": {"resources": {"CPU": 1}, "max_workers": 2}}
    with services.ray_cluster(tmp_path / "ray", nodes=1, head_cpus=0, autoscaler=group) as cluster:
        env = cluster.driver_env(CAPACITY_ATLAS_STORAGE=str(tmp_path / "shared"))
        result = subprocess.run(cluster.command([sys.executable, "-m", "pipeline.sweep"]), cwd=repo, env=env,
                                capture_output=True, text=True, timeout=900)
        monitor = (cluster.head_temp / "session_latest" / "logs" / "monitor.log").read_text()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "no Ray node holds a trial yet; waiting up to 300 s" in result.stdout
    started = sum(int(n) for n in re.findall(r"Adding (\d+) node\(s\) of type cpu", monitor))
    assert started == 2, monitor[-3000:]
    pd.testing.assert_frame_equal(trials(repo / "results")[SAME], trials(local / "results")[SAME])


# A driver that watches the nodes as a sweep does while the autoscaler starts a node and, once it is idle, stops it
WATCH = """
import time
import ray
from ray.autoscaler.sdk import request_resources
from pipeline.scheduling.cluster import alive_nodes
from pipeline.scheduling.tuning import NodeWatch
ray.init(log_to_driver=False, logging_level="ERROR")
watch = NodeWatch(cpu=1, gpu=0, wait=600, every=0)
request_resources(bundles=[{"CPU": 1}])
deadline = time.monotonic() + 120
while len(alive_nodes()) < 2 and time.monotonic() < deadline:
    time.sleep(0.5)
watch.on_step_begin(0, [])
request_resources(bundles=[])
while len(alive_nodes()) > 1 and time.monotonic() < deadline:
    time.sleep(0.5)
watch.on_step_begin(0, [])
print(f"seen {len(watch.seen)}, gone {len(watch.gone)}, lost {len(watch.lost)}")
"""


def test_a_node_the_autoscaler_lets_go_idle_is_not_a_lost_node(tmp_path):
    group = {"cpu": {"resources": {"CPU": 1}, "max_workers": 1}}
    with services.ray_cluster(tmp_path / "ray", nodes=1, head_cpus=0, autoscaler=group, idle_timeout_s=3) \
            as cluster:
        done = subprocess.run(cluster.command([sys.executable, "-c", WATCH]), cwd=ROOT, env=cluster.driver_env(),
                              capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "seen 2, gone 1, lost 0" in done.stdout, done.stdout[-2000:]
    # Ray's message: the autoscaler's "Terminated by autoscaler." or the raylet's "received SIGTERM"
    assert re.search(r"sweep: Ray node 127\.0\.0\.1 \(node \w+\) left the cluster idle: \S", done.stdout), done.stdout


# A driver that checks the cluster for a trial of 1 CPU and 1 GPU, waiting argv[1] seconds; with argv[2:], first
# reports to the GCS, as an autoscaler does, a node group of that name with that many GPUs that it may start
CHECK = """
import sys, time
import ray
from pipeline.scheduling.cluster import check_resources
from pipeline.tracking.services import ServiceError
from ray._raylet import GcsClient
from ray.core.generated.autoscaler_pb2 import ClusterConfig
ray.init(log_to_driver=False, logging_level="ERROR")
if sys.argv[2:]:
    config = ClusterConfig()
    group = config.node_group_configs.add(name=sys.argv[2], min_count=0, max_count=2)
    group.resources.update({"CPU": 1, "GPU": int(sys.argv[3])})
    GcsClient(address=ray.get_runtime_context().gcs_address).report_cluster_config(config.SerializeToString())
began = time.monotonic()
try:
    check_resources(cpu=1, gpu=1, wait=float(sys.argv[1]))
    print(f"passed after {time.monotonic() - began:.1f} s")
except ServiceError as err:
    print(f"failed after {time.monotonic() - began:.1f} s: {err}")
"""


def seconds(line: str) -> float:
    return float(re.search(r"after ([0-9.]+) s", line).group(1))


def test_the_resource_check_waits_for_a_node_that_holds_a_trial_and_names_what_is_missing(tmp_path):
    """A head without GPUs: the check for a 1-GPU trial waits for a node that has one, and names the GPU when none
    comes in time, or at once when the autoscaler's node groups (as it reports them to the GCS) have no GPU."""
    with services.ray_cluster(tmp_path / "ray", nodes=1) as cluster:
        def driver(*args: str) -> subprocess.Popen:
            return subprocess.Popen(cluster.command([sys.executable, "-c", CHECK, *args]), cwd=ROOT, text=True,
                                    env=cluster.driver_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

        def check(*args: str) -> str:
            out, _ = driver(*args).communicate(timeout=120)
            return out.strip().splitlines()[-1]

        none_came = check("3")
        assert none_came.startswith("failed") and seconds(none_came) >= 3, none_came
        assert "none joined in 3 s (cluster.node_wait_s): missing GPU (a trial needs 1, the most one node has is 0)" \
            in none_came and "127.0.0.1: 1 CPU, 0 GPU" in none_came

        cannot_come = check("60", "cpu-group", "0")
        assert cannot_come.startswith("failed") and seconds(cannot_come) < 10, cannot_come
        assert "no node group of the autoscaler holds one trial (groups: cpu-group: 1 CPU, 0 GPU)" \
            in cannot_come and "missing GPU" in cannot_come

        waiting = driver("60", "gpu-group", "1")
        said = ""  # the check is waiting before the node starts
        while "waiting up to 60 s" not in said and (line := waiting.stdout.readline()):
            said += line
        assert "for one (cluster.node_wait_s)" in said, said[-3000:]
        time.sleep(2)
        with services.joined_node(cluster, "127.0.0.2", "--num-cpus=1", "--num-gpus=1"):  # the group scales up
            out, _ = waiting.communicate(timeout=120)
    assert out.strip().splitlines()[-1].startswith("passed"), out[-3000:]
