"""Joining Ray and checking, before any trial trains, that the cluster can run the sweep.

- ``connect_ray``: a local Ray on loopback only, or the head at ``cluster.ray_address`` / ``$RAY_ADDRESS``
  (its auth token from ``$RAY_AUTH_TOKEN`` / ``$RAY_AUTH_TOKEN_PATH``, as Ray reads it). On a remote head the
  driver ships this checkout's code (``pipeline``, ``models``, ``tasks``) to the workers as Ray ``py_modules``:
  every trial runs the driver's code, whatever the nodes have installed.
- ``check_resources``: a trial asking for more CPUs or GPUs than any node has would wait forever in Ray's queue;
  it is a named ``ServiceError`` instead.
- ``probe_nodes``: one zero-CPU task per node imports the package and opens a dataset through the storage path,
  so a node that cannot is named before the first trial, not found by a failed trial later.
"""

from __future__ import annotations

import importlib
import logging
import os

import ray
from ray._private import ray_constants
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from pipeline.tracking.services import ServiceError

PACKAGES = ("pipeline", "models", "tasks")


def connect_ray(address: str | None, cpus: int) -> str:
    try:
        if address:
            # the packages' directories, not the module objects: a submitted job's driver merges this runtime_env
            # with the job's (its working_dir) by deep-copying it, and a module cannot be copied
            modules = [importlib.import_module(name).__path__[0] for name in PACKAGES]
            ray.init(
                address=address, log_to_driver=False, logging_level=logging.WARNING, runtime_env={"py_modules": modules}
            )
        else:
            # A local Ray listens on loopback only. Ray turns 127.0.0.1 into the machine's network address unless
            # it is told the node is no cluster (its switch for laptops, read when ray is first imported).
            os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
            ray_constants.ENABLE_RAY_CLUSTER = False
            ray.init(
                num_cpus=cpus,
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.WARNING,
                _node_ip_address="127.0.0.1",
            )
    except (ConnectionError, RuntimeError, ValueError, ray.exceptions.AuthenticationError) as err:
        raise ServiceError(f"cannot start or join Ray at {address or 'a local ray.init'}: {err}") from None
    return address or "local"


def check_resources(cpu: float, gpu: float) -> None:
    """Some alive node must offer one trial's CPUs and GPUs (the workers of a data-parallel trial share a node)."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    have = [(n["NodeManagerAddress"], n["Resources"].get("CPU", 0), n["Resources"].get("GPU", 0)) for n in nodes]
    if not any(c >= cpu and g >= gpu for _, c, g in have):
        listing = ", ".join(f"{ip}: {c:g} CPU, {g:g} GPU" for ip, c, g in have) or "no alive node"
        raise ServiceError(
            f"a trial needs {cpu:g} CPUs and {gpu:g} GPUs on one node (sweep.cpus_per_trial, "
            f"sweep.gpus_per_trial, sweep.workers_per_trial), but no Ray node has them ({listing})"
        )


def slots_on(nodes: list[tuple[float, float]], cpu: float, gpu: float) -> int:
    """Trials at once on nodes of (CPUs, GPUs): per node, as many as its scarcest resource holds (a trial's workers
    share a node), summed. Counting CPUs alone would open 32 slots on an 8-GPU, 128-CPU node for trials of 4 CPUs
    and 1 GPU, and hand out cells long before results arrive."""
    return sum(min(int(c // cpu) if cpu else 1 << 30, int(g // gpu + 1e-9) if gpu else 1 << 30) for c, g in nodes)


def trial_slots(cpu: float, gpu: float) -> int:
    """Trials at once on the alive nodes of the joined Ray cluster (``slots_on``)."""
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    return slots_on([(n.get("CPU", 0), n.get("GPU", 0)) for n in nodes], cpu, gpu)


def probe(location: str, modules: tuple[str, ...]) -> str:
    """Runs on one node: '' if it can import ``modules`` and read the dataset at ``location``, else why not."""
    node = ray.util.get_node_ip_address()
    try:
        for name in modules:
            importlib.import_module(name)
    except Exception as err:  # noqa: BLE001 - any import failure is the answer
        return f"Ray node {node} cannot import the package ({type(err).__name__}: {err})"
    # only now: on a node that cannot import the package, these imports would raise instead of answering
    from pipeline.data.datasets import DatasetError
    from pipeline.data.storage import fetch

    try:
        fetch(location, node)
    except DatasetError as err:
        return str(err)
    return ""


def probe_nodes(
    location: str, modules: tuple[str, ...] = ("pipeline.training.train", "pipeline.training.checkpoints")
) -> None:
    task = ray.remote(num_cpus=0)(probe)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    answers = [
        task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
            location, modules
        )
        for n in nodes
    ]  # every node at once
    problems = []
    for node, answer in zip(nodes, answers):
        try:
            problems.append(ray.get(answer, timeout=300))
        except (ray.exceptions.RayError, TimeoutError) as err:  # not even the probe could be loaded there
            last = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
            problems.append(f"Ray node {node['NodeManagerAddress']} cannot run the package's code ({last})")
    problems = [p for p in problems if p]
    if problems:
        raise ServiceError("; ".join(problems))
