"""Joining Ray and checking, before any trial trains, that the cluster can run the sweep.

- ``check_ray``: the Ray head at the address answers and accepts this driver's auth token (``check_ray_token``),
  said at once where ray.init would retry for 20 s to minutes.
- ``connect_ray``: a local Ray on loopback only, or the head at ``cluster.ray_address`` / ``$RAY_ADDRESS``
  (its auth token from ``$RAY_AUTH_TOKEN`` / ``$RAY_AUTH_TOKEN_PATH``, as Ray reads it). On a remote head the
  driver ships this checkout's code (``pipeline``, ``models``, ``tasks``) to the workers as Ray ``py_modules``:
  every trial runs the driver's code, whatever the nodes have installed.
- ``check_resources``: a trial asking for more CPUs or GPUs than any node has would wait forever in Ray's queue.
  When no alive node holds one, the autoscaler is asked for one (``request_resources``) and the check waits up to
  ``cluster.node_wait_s`` for a node that does to join (a group scaling up from zero, a node still starting); it
  fails at once when the autoscaler's node groups cannot hold a trial, and after the wait otherwise, with a
  ``ServiceError`` naming the missing resource.
- ``trial_slots``: how many trials run at once, by each node's scarcest resource; on a cluster
  ``sweep.resources.max_concurrent_trials`` where set, so that trials waiting in Ray's queue make an autoscaler start
  nodes.
- ``LostNode``: the error of a sweep that lost nodes until none could run a trial
  (``pipeline.scheduling.tuning.NodeWatch``).
- ``probe_nodes``: one zero-CPU task per node imports the package and opens a dataset through the storage path (and,
  for bf16 trials on CPUs, trains each architecture in bf16 there; for trials on GPUs, checks that its torch can use
  the GPUs its driver lists), so a node that cannot is named before the first trial, not found by a failed trial
  later.
"""

from __future__ import annotations

import importlib
import logging
import os
import socket
import time
from pathlib import Path

import ray
from ray._private import ray_constants
from ray._private.authentication.authentication_token_setup import ensure_token_if_auth_enabled
from ray._private.state import state
from ray._raylet import GcsClient  # type: ignore[attr-defined]  # missing from Ray's _raylet.pyi
from ray.autoscaler.sdk import request_resources
from ray.exceptions import AuthenticationError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from pipeline.tracking.services import ServiceError

PACKAGES = ("pipeline", "models", "tasks")


def check_ray(address: str | None) -> None:
    """Fail fast on a Ray head that does not answer or does not accept this driver: ray.init would retry for 20 s
    to minutes before giving up with a bare ConnectionError."""
    if not address or address == "auto":
        return
    hostport = address.removeprefix("ray://")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ServiceError(f"Ray address {address!r}: expected host:port or ray://host:port")
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except OSError as err:
        raise ServiceError(
            f"Ray head at {address} is unreachable ({err}); start one with `ray start --head` "
            "or unset RAY_ADDRESS / cluster.ray_address for a local Ray"
        ) from None
    if not address.startswith("ray://"):  # a GCS address; Ray Client's server speaks another protocol
        check_ray_token(hostport)


def check_ray_token(gcs_address: str) -> None:
    """A head started with token authentication (RAY_AUTH_MODE=token, Ray's default once a token exists) rejects
    every request without its token; Ray's GCS client says so at once, where ray.init retries."""
    try:
        ensure_token_if_auth_enabled(None, create_token_if_missing=False)  # RAY_AUTH_MODE=token but no token
        GcsClient(address=gcs_address)  # fetches the cluster id: the first authenticated request
    except AuthenticationError as err:
        raise ServiceError(
            f"Ray head at {gcs_address} requires its auth token: {token_problem()}. "
            f"{RAY_TOKEN_HELP} (Ray: {err.message})"
        ) from None


RAY_TOKEN_HELP = (
    "Give the driver the head's token: RAY_AUTH_MODE=token and either RAY_AUTH_TOKEN=<token> or "
    "RAY_AUTH_TOKEN_PATH=<file holding it>; `ray get-auth-token` on the head prints it"
)


def token_problem() -> str:
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
        return "this driver sends none (RAY_AUTH_MODE is not token)"
    if not (
        os.environ.get("RAY_AUTH_TOKEN")
        or os.environ.get("RAY_AUTH_TOKEN_PATH")
        or (Path.home() / ".ray" / "auth_token").exists()
    ):
        return "RAY_AUTH_MODE=token but no token was found (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token)"
    return "the head rejects the token this driver sends"


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
            # it is told the node is no cluster (its switch for laptops, read when ray is first imported). No idle
            # workers started ahead: a trial's actor starts its own, so Ray's two went unused (0.7 CPU-s a sweep).
            os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
            ray_constants.ENABLE_RAY_CLUSTER = False
            ray.init(
                num_cpus=cpus,
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.WARNING,
                _node_ip_address="127.0.0.1",
                _system_config={"enable_worker_prestart": False, "prestart_worker_first_driver": False},
            )
    except (ConnectionError, RuntimeError, ValueError, ray.exceptions.AuthenticationError) as err:
        raise ServiceError(f"cannot start or join Ray at {address or 'a local ray.init'}: {err}") from None
    return address or "local"


class LostNode(ServiceError):
    """Ray nodes were lost mid-sweep and, for ``cluster.node_wait_s``, no alive node could run a trial."""


def alive_nodes() -> list[dict]:
    return [n for n in ray.nodes() if n.get("Alive")]


# Ray's NodeDeathInfo reasons for a node let go on purpose: EXPECTED_TERMINATION (`ray stop`, an autoscaler's
# termination) and AUTOSCALER_DRAIN_IDLE; AUTOSCALER_DRAIN_PREEMPTED (a spot node taken back) is a loss
LET_GO = {1, 4}


def let_go(node_id: str) -> str | None:
    """Ray's message for a node that left the cluster on purpose (an autoscaler removing it idle), else None."""
    for n in ray.nodes():
        if n["NodeID"] == node_id and not n.get("Alive") and n.get("DeathReason") in LET_GO:
            return n.get("DeathReasonMessage") or "let go"
    return None


def trial_bundle(cpu: float, gpu: float) -> dict[str, float]:
    """One trial's resources on one node, as Ray names them (a trial's workers share a node)."""
    return {k: v for k, v in (("CPU", cpu), ("GPU", gpu)) if v}


def fits(resources: dict, bundle: dict[str, float]) -> bool:
    return all(resources.get(k, 0) >= v for k, v in bundle.items())


def shortfall(nodes: list[dict], bundle: dict[str, float]) -> str:
    """What no alive node has for one trial: each resource short everywhere, with the most one node has; or, when
    each is somewhere, that no node has them together; and the nodes."""
    most = {k: max((n["Resources"].get(k, 0) for n in nodes), default=0) for k in bundle}
    short = [
        f"{k} (a trial needs {v:g}, the most one node has is {most[k]:g})" for k, v in bundle.items() if most[k] < v
    ]
    listing = ", ".join(
        f"{n['NodeManagerAddress']}: {n['Resources'].get('CPU', 0):g} CPU, {n['Resources'].get('GPU', 0):g} GPU"
        for n in nodes
    )
    missing = "; ".join(short) or "no node has all of " + ", ".join(f"{v:g} {k}" for k, v in bundle.items())
    return f"missing {missing} (alive nodes: {listing or 'none'})"


def unscalable(bundle: dict[str, float]) -> str | None:
    """Why the autoscaler can bring no node that holds ``bundle``, from the node groups it reported to the GCS
    (each group's resources and most nodes); None when a group can, or when no autoscaler reported any."""
    config = state.get_cluster_config()
    if config is None or not config.node_group_configs:
        return None
    groups = {g.name: dict(g.resources) for g in config.node_group_configs if g.max_count != 0}
    if any(fits(resources, bundle) for resources in groups.values()):
        return None
    listing = "; ".join(
        f"{name}: " + ", ".join(f"{v:g} {k}" for k, v in sorted(resources.items()))
        for name, resources in groups.items()
    )
    return f"no node group of the autoscaler holds one trial (groups: {listing or 'none may start a node'})"


def check_resources(cpu: float, gpu: float, wait: float) -> None:
    """Some alive node must offer one trial's CPUs and GPUs. If none does, the autoscaler is asked for a node that
    does and the check waits ``wait`` seconds for one to join; a ``ServiceError`` names the missing resource at once
    when ``wait`` is 0 (a local Ray) or the autoscaler's node groups cannot hold a trial, else after the wait."""
    bundle = trial_bundle(cpu, gpu)
    if any(fits(n["Resources"], bundle) for n in alive_nodes()):
        return
    needs = (
        f"a trial needs {cpu:g} CPUs and {gpu:g} GPUs on one node (sweep.resources.cpus_per_trial, "
        "gpus_per_trial, workers_per_trial)"
    )
    if wait <= 0:  # a local Ray: no node can join
        raise ServiceError(f"{needs}, but no Ray node has them: {shortfall(alive_nodes(), bundle)}")
    if why := unscalable(bundle):
        raise ServiceError(f"{needs}, but {why}; {shortfall(alive_nodes(), bundle)}")
    print(f"sweep: no Ray node holds a trial yet; waiting up to {wait:g} s for one (cluster.node_wait_s)", flush=True)
    request_resources(bundles=[bundle])  # a hint an autoscaler acts on; without one, nodes may still be joining
    try:
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            time.sleep(1)
            if any(fits(n["Resources"], bundle) for n in alive_nodes()):
                return
        raise ServiceError(
            f"{needs}, but none joined in {wait:g} s (cluster.node_wait_s): {shortfall(alive_nodes(), bundle)}"
        )
    finally:
        request_resources(bundles=[])  # the sweep's trials ask for themselves; a request left would hold nodes up


def slots_on(nodes: list[tuple[float, float]], cpu: float, gpu: float) -> int:
    """Trials at once on nodes of (CPUs, GPUs): per node, as many as its scarcest resource holds (a trial's workers
    share a node), summed. Counting CPUs alone would open 32 slots on an 8-GPU, 128-CPU node for trials of 4 CPUs
    and 1 GPU, and hand out cells long before results arrive."""
    return sum(min(int(c // cpu) if cpu else 1 << 30, int(g // gpu + 1e-9) if gpu else 1 << 30) for c, g in nodes)


def trial_slots(cpu: float, gpu: float, wanted: int | None, local: bool) -> int:
    """Trials at once: ``wanted`` (``sweep.resources.max_concurrent_trials``) where set, else as many as the alive nodes
    hold (``slots_on``). On a local Ray no node joins, so ``wanted`` is only a cap. On a cluster nodes may join
    mid-sweep (an autoscaler's, one started by hand), so ``wanted`` is taken as given: the trials beyond what the nodes
    up hold wait in Ray's queue, and that demand is what makes an autoscaler start nodes."""
    now = slots_on([(n["Resources"].get("CPU", 0), n["Resources"].get("GPU", 0)) for n in alive_nodes()], cpu, gpu)
    if local:
        return max(1, min(now, wanted or now))
    if wanted:
        return wanted
    print(
        f"sweep: {now} trial slots, for the nodes up now (sweep.resources.max_concurrent_trials sets more, for the "
        "nodes an autoscaler would start)",
        flush=True,
    )
    return max(1, now)


def probe(location: str, modules: tuple[str, ...], bf16: tuple[str, ...], gpus: bool) -> str:
    """Runs on one node: '' if it can import ``modules``, read the dataset at ``location``, train the
    architectures ``bf16`` in bf16 on its CPU and, if ``gpus``, use the GPUs nvidia-smi lists there with its torch
    (``pipeline.common.cuda``), else why not. A node whose nvidia-smi lists none runs no trial that asks for one:
    Ray sees no GPU there either."""
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
    import models
    from pipeline.common.cuda import unusable_gpus

    problems = [problem for arch in bf16 if (problem := models.bf16_on_cpu(arch))]
    if gpus and (problem := unusable_gpus()):
        problems.append(problem)
    return f"Ray node {node}: {'; '.join(problems)}" if problems else ""


def probe_nodes(
    location: str,
    modules: tuple[str, ...] = ("pipeline.training.train", "pipeline.training.checkpoints"),
    bf16: tuple[str, ...] = (),
    gpus: bool = False,
) -> None:
    task = ray.remote(num_cpus=0)(probe)
    nodes = alive_nodes()
    answers = [
        task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
            location, modules, bf16, gpus
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
