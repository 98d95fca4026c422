"""The test services for real: a two-node Ray cluster with token authentication and an MLflow server, all on
loopback addresses (tests/helpers/services.py), and the pipeline's checks against them."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import time

import pytest

from tests.helpers import services

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
if problem := services.namespace_problem():
    pytestmark.append(pytest.mark.skip(reason=f"needs network namespaces: {problem}"))

# A driver as the pipeline's: the pipeline's pre-flight check, then ray.init from RAY_ADDRESS and the token env.
DRIVER = """
import json, os, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from pipeline.scheduling.cluster import check_ray

check_ray(os.environ["RAY_ADDRESS"])
ray.init(log_to_driver=False, logging_level="ERROR")

@ray.remote(num_cpus=1)
def node_ip():
    return ray.util.get_node_ip_address()

# A task pinned to each live node (hard affinity: SPREAD is best effort, and put short tasks on one node here)
nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
print(json.dumps(ray.get([node_ip.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
                          .remote() for node in nodes])))
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with services.ray_cluster(tmp_path_factory.mktemp("ray")) as running:
        yield running


@pytest.fixture(scope="module")
def spread(cluster) -> list[str]:
    """The node IP of a task pinned to each node, by a driver that has the token."""
    done = subprocess.run(cluster.command([sys.executable, "-c", DRIVER]), env=cluster.driver_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def mlflow(cluster, tmp_path_factory):
    """In the cluster's namespace, where the integration test's drivers reach both."""
    with services.mlflow_server(tmp_path_factory.mktemp("mlflow"), cluster.netns) as server:
        yield server


def test_driver_with_token_runs_on_both_nodes(cluster, spread):
    assert cluster.node_ips == ["127.0.0.1", "127.0.0.2"]
    assert sorted(spread) == cluster.node_ips


@pytest.mark.parametrize("token", [None, "0" * 64], ids=["no token", "wrong token"])
def test_driver_without_the_token_fails_fast_with_a_named_error(cluster, token):
    """ray.init itself retries for 20 s, then raises a bare ConnectionError; check_ray says why at once."""
    env = services.clean_env() | {"RAY_ADDRESS": cluster.address}
    if token:
        env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    start = time.monotonic()
    done = subprocess.run(cluster.command([sys.executable, "-c", DRIVER]), env=env, capture_output=True, text=True,
                          timeout=60)
    elapsed = time.monotonic() - start
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("pipeline.tracking.services.ServiceError: Ray head at 127.0.0.1:"), done.stderr[-2000:]
    assert "requires its auth token" in last and "RAY_AUTH_TOKEN_PATH" in last and "ray get-auth-token" in last
    assert ("sends none" if token is None else "rejects the token") in last
    assert elapsed < 15, f"{elapsed:.1f} s: the check should not wait for ray.init's retries"


def on_loopback(sockets: list[tuple[int, str, int]], only_lo: bool) -> list[tuple[int, str, int]]:
    """The sockets reachable from anything but loopback: neither on 127.0.0.0/8 (or its IPv4-mapped IPv6 form)
    nor on the all-interfaces address of a namespace whose only interface is lo."""
    def loopback(host: str) -> bool:
        ip = ipaddress.ip_address(host)
        ip = getattr(ip, "ipv4_mapped", None) or ip
        return ip.is_loopback or (only_lo and ip.is_unspecified)
    return [s for s in sockets if not loopback(s[1])]


def test_cluster_and_mlflow_listen_on_loopback_only(cluster, spread, mlflow):
    """Every listening TCP socket of the cluster's processes (head, second node, their workers) and of the MLflow
    server. The second node's raylet listens on all interfaces (Ray does so for any node IP but 127.0.0.1), which in
    the cluster's namespace is its loopback alone."""
    assert services.interfaces(cluster.netns) == ["lo"]
    cluster_sockets = services.listening(cluster.pids())
    ports = {port for _, _, port in cluster_sockets}
    assert int(cluster.address.rsplit(":", 1)[1]) in ports  # the head's GCS: the scan sees Ray's sockets
    assert len(cluster.pids()) > 8  # two nodes' GCS, raylets, agents, and the workers of `spread`
    assert on_loopback(cluster_sockets, only_lo=True) == []
    mlflow_sockets = services.listening(mlflow.pids())
    assert [port for _, _, port in mlflow_sockets] == [int(mlflow.uri.rsplit(":", 1)[1])]
    assert on_loopback(mlflow_sockets, only_lo=False) == []


def test_local_ray_of_the_pipeline_listens_on_loopback_only(monkeypatch):
    import ray
    from ray._private import ray_constants

    from pipeline.scheduling.cluster import connect_ray

    # connect_ray and ray.init set these for this process; the rest of the session gets them back as they were
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", ray_constants.ENABLE_RAY_CLUSTER)
    for var in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_AUTH_MODE"):
        monkeypatch.delenv(var, raising=False)
    connect_ray(None, 1)
    try:
        ray.get(ray.remote(lambda: 1).remote())  # a worker too
        # this process's tree in its namespace: the module's cluster and MLflow server descend from it too
        here = os.readlink("/proc/self/ns/net")
        sockets = services.listening({pid for pid in services.tree(os.getpid())
                                      if os.readlink(f"/proc/{pid}/ns/net") == here})
    finally:
        ray.shutdown()
    assert len({pid for pid, _, _ in sockets}) >= 3  # this driver, GCS, raylet at least
    assert on_loopback(sockets, only_lo=False) == []


def test_mlflow_server_takes_artifacts_through_its_api(mlflow, tmp_path):
    from mlflow.tracking import MlflowClient

    note = tmp_path / "note.txt"
    note.write_text("through the server")

    def log_run() -> tuple[str, str, list[str]]:
        client = MlflowClient(mlflow.uri)
        exp = client.create_experiment("services")
        run = client.create_run(exp)
        client.log_metric(run.info.run_id, "loss", 0.5, step=1)
        client.log_artifact(run.info.run_id, str(note), artifact_path="notes")
        client.set_terminated(run.info.run_id)
        listed = [f.path for f in client.list_artifacts(run.info.run_id, "notes")]
        return run.info.run_id, client.get_experiment(exp).artifact_location, listed

    run_id, location, listed = mlflow.netns.call(log_run)
    assert location.startswith("mlflow-artifacts:")  # proxied: the client never writes the root itself
    assert listed == ["notes/note.txt"]
    stored = [p for p in mlflow.artifact_root.rglob("note.txt") if run_id in p.parts]
    assert [p.read_text() for p in stored] == ["through the server"]


def test_a_trials_slots_follow_its_scarcest_resource_node_by_node():
    """GPUs count: an 8-GPU, 128-CPU node holds 8 trials of 4 CPUs and 1 GPU, not 32; a node holds what its own
    CPUs and GPUs hold (two 5-CPU nodes: 4 trials of 2 CPUs, not 5); half a GPU a trial doubles them."""
    from pipeline.scheduling.cluster import slots_on

    assert slots_on([(128, 8)], cpu=4, gpu=1) == 8
    assert slots_on([(5, 0), (5, 0)], cpu=2, gpu=0) == 4
    assert slots_on([(128, 8), (16, 0)], cpu=4, gpu=0.5) == 16
    assert slots_on([(16, 0)], cpu=4, gpu=1) == 0
