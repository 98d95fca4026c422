"""What the launchers (``ops/slurm/capacity-atlas.sbatch``, ``ops/kuberay/rayjob.yaml``) check and do around
``dvc repro``, before any compute:

    python -m pipeline.launch slurm --nodes 2 --cpus-per-node 32 --gpus-per-node 4 [--profile paper]
    python -m pipeline.launch rayjob ops/kuberay/rayjob.yaml
    python -m pipeline.launch wait --nodes 2 [--timeout 300]      # Ray nodes joined to $RAY_ADDRESS
    python -m pipeline.launch use-profile paper                    # params.yaml's profile, checked first
    python -m pipeline.launch keep NAME                            # the outputs to <storage>/outputs/NAME/

``slurm`` and ``rayjob`` ask whether some node of the allocation holds one trial of the profile (its CPUs and GPUs
times its data-parallel workers), else stop naming the profile, what a trial needs and what the nodes have;
``rayjob`` also checks the manifest against this checkout (the entrypoint, the profile, the Ray version, an MLflow
server, the storage mounted on every pod). Details: docs/cluster.md, "Launching it: Slurm and KubeRay".
Exit status 0; 2 for input that cannot run (a ``LaunchError``, a ``ConfigError`` or a ``ServiceError``, one line).
"""

from __future__ import annotations

import argparse
import difflib
import importlib.metadata
import json
import logging
import math
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pyarrow.fs as pafs
import yaml

from pipeline.common.config import ROOT, Config, ConfigError, load_config
from pipeline.data.storage import filesystem
from pipeline.nightly import experiments
from pipeline.scheduling.cluster import check_ray_token, slots_on
from pipeline.tracking.services import ServiceError

ENTRYPOINT = "ops/ray-job"  # the RayJob's entrypoint script, in the image's checkout
DRIVERS = (("dvc", "repro"), ("dvc", "exp", "run"))  # the pipeline's commands an entrypoint may run
PLACEHOLDER = "REPLACE-ME"  # in ops/kuberay/rayjob.yaml's image: the image a user builds goes there
OUTPUTS = ("params.yaml", "dvc.lock", "results", "report")  # what `keep` copies
CRDS = ROOT / "ops" / "kuberay" / "crd"  # KubeRay's RayJob schema, one file per release (ops/kuberay/vendor-crd)
KUBERAY_VERSION = "capacity-atlas/kuberay-version"  # the manifest's annotation: the KubeRay release it is for
SECRETS = ("MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")  # never a literal value in a manifest


class LaunchError(RuntimeError):
    """A launcher's input cannot run the pipeline; the message names the file, field or variable."""


class AllocationError(LaunchError):
    """No node of an allocation (Slurm nodes, a RayJob's pods) holds one trial of the profile."""


class SchemaError(LaunchError):
    """A RayJob manifest that KubeRay's CRD schema (of the release it names) rejects: an unknown field, a wrong type."""


@dataclass(frozen=True)
class Nodes:
    """``count`` nodes alike, each offering Ray ``cpus`` CPUs and ``gpus`` GPUs; ``name`` says which, in errors."""

    name: str
    count: int
    cpus: float
    gpus: float

    def describe(self) -> str:
        each = f"{amount(self.cpus, 'CPU')} and {amount(self.gpus, 'GPU')}"
        return f"{self.name}: {amount(self.count, 'node')} of {each}{' each' * (self.count > 1)}"


def amount(x: float, unit: str) -> str:
    """``4 CPUs``, ``1 GPU``, ``0.5 GPU``."""
    return f"{x:g} {unit}{'s' * (x > 1 or x == 0)}"


def check_nodes(cfg: Config, groups: list[Nodes], where: str, hint: str = "") -> int:
    """The trials ``groups`` run at once on the profile of ``cfg`` (as the sweep counts them, each node by its
    scarcest resource); an ``AllocationError`` if that is none."""
    need = cfg.sweep.resources.trial_resources()
    slots = sum(g.count * slots_on([(g.cpus, g.gpus)], need["cpu"], need["gpu"]) for g in groups)
    if slots < 1:
        have = "; ".join(g.describe() for g in groups) or "no nodes"
        raise AllocationError(
            f"{where} cannot hold one trial of profile {cfg.profile!r}: a trial needs {trial_need(cfg)} on one node "
            "(sweep.resources.cpus_per_trial, gpus_per_trial, workers_per_trial), "
            f"and there are {have}"
            f"{'; ' + hint if hint else ''}"
        )
    return slots


def trial_need(cfg: Config) -> str:
    r = cfg.sweep.resources.trial_resources()
    return f"{amount(r['cpu'], 'CPU')} and {amount(r['gpu'], 'GPU')}"


# ---- Slurm


def check_slurm(cfg: Config, nodes: int, cpus: float, gpus: float) -> int:
    """An allocation of ``nodes`` nodes, each with ``cpus`` CPUs and ``gpus`` GPUs for Ray."""
    if nodes < 1:
        raise AllocationError(f"the Slurm allocation has {nodes} nodes (SLURM_JOB_NODELIST)")
    r = cfg.sweep.resources.trial_resources()
    hints = []
    if r["gpu"] and gpus < r["gpu"]:
        hints.append(
            "request GPUs with `#SBATCH --gpus-per-node=N` (or --gres=gpu:N): the job sees "
            + ("none (SLURM_GPUS_ON_NODE and SLURM_GPUS_PER_NODE unset)" if not gpus else f"{gpus:g} per node")
        )
    if cpus < r["cpu"]:
        hints.append(f"request at least {r['cpu']:g} CPUs per node (`#SBATCH --cpus-per-task=N`, one task per node)")
    group = Nodes("Slurm nodes", nodes, cpus, gpus)
    return check_nodes(cfg, [group], "the Slurm allocation", "; ".join(hints))


# ---- KubeRay

SUFFIXES = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity(value: Any, where: str) -> float:
    """A Kubernetes quantity (``4``, ``"500m"``, ``"1.5"``) as a number."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z]*)\s*", str(value))
    if not match or (match[2] and match[2] not in SUFFIXES):
        raise LaunchError(f"{where}: {value!r} is not a Kubernetes quantity (such as 4, '500m', '1.5')")
    return float(match[1]) * SUFFIXES.get(match[2], 1)


def ray_resources(group: dict, where: str) -> tuple[float, float]:
    """(CPUs, GPUs) that KubeRay's ``ray start`` gives a pod of ``group``: ``rayStartParams`` num-cpus / num-gpus,
    else the Ray container's (the first one's) CPU limit rounded up (else its request) and the sum of its limits
    named ``*gpu`` (``nvidia.com/gpu``)."""
    params = group.get("rayStartParams") or {}
    resources = container(group, where).get("resources") or {}
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    if "num-cpus" in params:
        cpus = quantity(params["num-cpus"], f"{where}.rayStartParams.num-cpus")
    elif "cpu" in limits or "cpu" in requests:
        key = "limits" if "cpu" in limits else "requests"
        cpus = math.ceil(quantity((limits if key == "limits" else requests)["cpu"], f"{where} resources.{key}.cpu"))
    else:
        raise LaunchError(
            f"{where}: no CPUs given (rayStartParams num-cpus, or the Ray container's resources.limits.cpu): Ray "
            "would count the Kubernetes node's CPUs, which the pod may not have"
        )
    if "num-gpus" in params:
        gpus = quantity(params["num-gpus"], f"{where}.rayStartParams.num-gpus")
    else:
        gpus = sum(quantity(v, f"{where} resources.limits.{k}") for k, v in limits.items() if str(k).endswith("gpu"))
    return cpus, gpus


def container(group: dict, where: str) -> dict:
    """The Ray container of a head or worker group: the first of its pod template (KubeRay's rule)."""
    containers = (((group.get("template") or {}).get("spec") or {}).get("containers")) or []
    if not containers or not isinstance(containers[0], dict):
        raise LaunchError(f"{where}.template.spec.containers: no container")
    return containers[0]


def pods(group: dict) -> int:
    """The pods of a worker group at the start: ``replicas`` (else ``minReplicas``); with KubeRay's autoscaler,
    up to ``maxReplicas``."""
    return int(group.get("replicas", group.get("minReplicas", 0)) or 0)


def env_of(c: dict) -> dict[str, Any]:
    """A container's environment: literal values, or None for a ``valueFrom`` (a Secret, say)."""
    return {e["name"]: e.get("value") for e in c.get("env") or [] if isinstance(e, dict) and "name" in e}


def mounted(c: dict, path: str) -> bool:
    return any(
        path == m.get("mountPath") or path.startswith(str(m.get("mountPath", "")).rstrip("/") + "/")
        for m in c.get("volumeMounts") or []
    )


@dataclass(frozen=True)
class RayJob:
    """What ``check_rayjob`` found: the profile, the entrypoint's command, the node groups and their trials."""

    profile: str
    command: list[str]
    groups: list[Nodes]
    slots: int
    autoscaled: bool  # KubeRay's autoscaler starts the worker pods (enableInTreeAutoscaling); slots: at maxReplicas
    kuberay: str  # the KubeRay release whose schema it was checked against

    def slots_note(self, cfg: Config) -> str | None:
        """What the profile must say for the sweep to fill an autoscaled cluster: it opens slots for the pods up
        at its start unless ``sweep.resources.max_concurrent_trials`` asks for more (``cluster.trial_slots``)."""
        if not self.autoscaled or cfg.sweep.resources.max_concurrent_trials == self.slots:
            return None
        return (
            f"note: with KubeRay's autoscaler, the sweep runs {amount(self.slots, 'trial')} at once only with "
            f"sweep.resources.max_concurrent_trials: {self.slots} in the image's params.yaml (now "
            f"{cfg.sweep.resources.max_concurrent_trials}); otherwise it stays on the pods up at its start"
        )


def kuberay_versions() -> list[str]:
    """The KubeRay releases whose RayJob schema is vendored (``CRDS``)."""
    return sorted(p.stem.removeprefix("rayjob-") for p in CRDS.glob("rayjob-*.json"))


def strict(node: Any) -> Any:
    """The schema as the API server applies it with strict field validation (kubectl's default): an object whose
    fields it lists takes no other field, unless it says ``x-kubernetes-preserve-unknown-fields``."""
    if isinstance(node, list):
        return [strict(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: strict(v) for k, v in node.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def field_path(error: jsonschema.ValidationError) -> str:
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    return path.lstrip(".") or "(the manifest)"


JSON_TYPES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", list: "a list", dict: "a map"}


def describe(error: jsonschema.ValidationError, release: str) -> str:
    """One schema error in a reader's words: the field, what is wrong, and for a misspelled field the right name."""
    where = field_path(error)
    if error.validator == "additionalProperties":
        known = list((error.schema.get("properties") or {}).keys())
        unknown = [k for k in error.instance if k not in known]
        return "; ".join(
            f"{where + '.' if error.absolute_path else ''}{k}: no such field in KubeRay {release}'s RayJob"
            + (f" (did you mean {close[0]}?)" if (close := difflib.get_close_matches(k, known, n=1)) else "")
            for k in unknown
        )
    if error.validator == "type":
        return (
            f"{where}: {error.instance!r} is {JSON_TYPES.get(type(error.instance), type(error.instance).__name__)}; "
            f"KubeRay {release}'s RayJob wants {error.validator_value}"
        )
    return f"{where}: {error.message}"


def check_schema(manifest: dict) -> str:
    """The manifest against the RayJob CRD schema of the KubeRay release its annotation ``KUBERAY_VERSION`` names;
    returns that release. ``SchemaError`` naming each field the schema rejects, ``LaunchError`` for an unknown
    release."""
    annotations = (manifest.get("metadata") or {}).get("annotations") or {}
    release = annotations.get(KUBERAY_VERSION)
    known = kuberay_versions()
    if release is None:
        raise LaunchError(
            f"metadata.annotations: no {KUBERAY_VERSION!r}: name the KubeRay release the cluster runs (`kubectl get "
            f"deployment kuberay-operator -o jsonpath='{{..image}}'`), one of {', '.join(known)}, for the manifest "
            "to be checked against its RayJob schema"
        )
    if str(release) not in known:
        raise LaunchError(
            f"metadata.annotations.{KUBERAY_VERSION}: KubeRay {release!r} is not a release this checkout knows the "
            f"RayJob schema of (ops/kuberay/crd/: {', '.join(known)}): vendor its CRD with ops/kuberay/vendor-crd, or "
            "name a known release"
        )
    schema = strict(json.loads((CRDS / f"rayjob-{release}.json").read_text())["schema"])
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(manifest), key=lambda e: list(map(str, e.path)))
    if errors:
        more = f"; and {len(errors) - 5} more" if len(errors) > 5 else ""
        raise SchemaError("; ".join(describe(e, str(release)) for e in errors[:5]) + more)
    return str(release)


def check_deadlines(spec: dict) -> None:
    """A RayJob that holds its GPUs only as long as it works: both deadlines, and the cluster deleted at its end."""
    if spec.get("shutdownAfterJobFinishes") is not True:
        raise LaunchError(
            "spec.shutdownAfterJobFinishes is not true: KubeRay would keep the Ray cluster, and its GPUs, after the "
            "job ends"
        )
    for field, why in (
        ("preRunningDeadlineSeconds", "pods that never schedule or a job that never starts hold their nodes"),
        ("activeDeadlineSeconds", "a hung sweep holds its GPUs with no end"),
    ):
        if field not in spec:
            raise LaunchError(f"spec.{field} is not set: without it {why} (ops/kuberay/rayjob.yaml sets both)")


def check_rayjob(manifest: dict, params: Path | str = ROOT / "params.yaml") -> RayJob:
    """A KubeRay ``RayJob`` that runs this pipeline: its entrypoint, the profile its head names (with the overrides
    of ``params``), its Ray version and image, MLflow and storage; and its pods hold at least one trial
    (``AllocationError`` otherwise)."""
    if manifest.get("kind") != "RayJob" or manifest.get("apiVersion") != "ray.io/v1":
        raise LaunchError(
            f"not a KubeRay RayJob (apiVersion ray.io/v1, kind RayJob): {manifest.get('apiVersion')!r}, "
            f"{manifest.get('kind')!r}"
        )
    release = check_schema(manifest)
    spec = manifest.get("spec") or {}
    check_deadlines(spec)
    words = shlex.split(str(spec.get("entrypoint") or ""))
    if not words or not words[0].endswith(ENTRYPOINT) or not any(tuple(words[1 : 1 + len(d)]) == d for d in DRIVERS):
        raise LaunchError(
            f"spec.entrypoint: {spec.get('entrypoint')!r} does not run the pipeline: use "
            f"'<the image's checkout>/{ENTRYPOINT} dvc repro' (or dvc exp run ...)"
        )
    cluster = spec.get("rayClusterSpec") or {}
    if spec.get("clusterSelector"):
        raise LaunchError("spec.clusterSelector: an existing RayCluster is not checked; give spec.rayClusterSpec")
    version = importlib.metadata.version("ray")
    if str(cluster.get("rayVersion")) != version:
        raise LaunchError(
            f"spec.rayClusterSpec.rayVersion: {cluster.get('rayVersion')!r}, but this environment (requirements.lock, "
            f"the image's) has Ray {version}: a driver and nodes of different Ray versions cannot work together"
        )
    head = cluster.get("headGroupSpec") or {}
    where = "spec.rayClusterSpec.headGroupSpec"
    env = env_of(container(head, where))
    profile = env.get("CAPACITY_ATLAS_PROFILE")
    if not profile:
        raise LaunchError(f"{where}: the Ray container's env sets no CAPACITY_ATLAS_PROFILE (the profile to run)")
    cfg = load_config(params, profile=str(profile))
    containers = {where: container(head, where)}
    groups = [Nodes("the head", 1, *ray_resources(head, where))]
    for i, group in enumerate(cluster.get("workerGroupSpecs") or []):
        at = f"spec.rayClusterSpec.workerGroupSpecs[{i}]"
        count = int(group.get("maxReplicas", pods(group))) if cluster.get("enableInTreeAutoscaling") else pods(group)
        groups.append(Nodes(f"worker group {group.get('groupName', i)!r}", count, *ray_resources(group, at)))
        if count:
            containers[at] = container(group, at)
    check_environment(env, containers)
    images = {c.get("image") for c in containers.values()}
    if len(images) != 1 or not all(isinstance(i, str) and i for i in images):
        raise LaunchError(f"the head's and the workers' Ray containers must run one image (the same code): {images}")
    image = str(images.pop())
    if PLACEHOLDER in image:
        raise LaunchError(
            f"image: {image!r} is the placeholder: build the image (docs/cluster.md) and put its name in every "
            "Ray container"
        )
    hint = "raise a worker group's resources.limits (cpu, nvidia.com/gpu) or its replicas"
    slots = check_nodes(cfg, groups, "the RayJob's pods", hint)
    autoscaled = bool(cluster.get("enableInTreeAutoscaling"))
    return RayJob(str(profile), words[1:], groups, slots, autoscaled, release)


def check_environment(env: dict[str, Any], containers: dict[str, dict]) -> None:
    """MLflow is a server (a SQLite file in the head pod goes with it), its secrets come from a Secret, and the
    storage path is on every pod."""
    for key in SECRETS:
        if env.get(key) is not None:
            raise LaunchError(
                f"the head's env: {key} is a literal value in the manifest: take it from a Kubernetes Secret "
                "(valueFrom.secretKeyRef), as ops/kuberay/rayjob.yaml does"
            )
    uri = env.get("MLFLOW_TRACKING_URI", "")
    if "MLFLOW_TRACKING_URI" not in env or (uri is not None and not str(uri).startswith(("http://", "https://"))):
        raise LaunchError(
            f"the head's env: MLFLOW_TRACKING_URI {uri!r} is no MLflow server (http://...): a SQLite store in the "
            "head pod is deleted with it"
        )
    storage = env.get("CAPACITY_ATLAS_STORAGE")
    if not storage:
        raise LaunchError(
            "the head's env sets no CAPACITY_ATLAS_STORAGE: trials keep checkpoints and read datasets there, so it "
            "must be a volume every pod mounts (or an s3:// or gs:// URI)"
        )
    if "://" not in str(storage):
        missing = [at for at, c in containers.items() if not mounted(c, str(storage))]
        if missing:
            raise LaunchError(
                f"CAPACITY_ATLAS_STORAGE {storage!r} is not under a volumeMount of the Ray container of "
                f"{', '.join(missing)}: every pod must see it"
            )


def read_manifest(path: Path) -> dict:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise LaunchError(f"{path}: cannot be read as YAML ({err})") from None
    if not isinstance(data, dict):
        raise LaunchError(f"{path}: not a mapping (one Kubernetes object)")
    return data


# ---- around the driver


def set_profile(params: Path, profile: str) -> None:
    """Writes ``profile`` into ``params`` (its ``profile:`` line, comments kept) once it loads with its overrides,
    as `dvc exp run -S profile=...` would: DVC tracks the choice there."""
    load_config(params, profile=profile)
    text = params.read_text()
    new, found = re.subn(r"(?m)^profile:.*$", f"profile: {profile}", text, count=1)
    if not found:
        raise LaunchError(f"{params}: no top-level `profile:` line to set")
    if new != text:
        params.write_text(new)


def wait_for_nodes(address: str, nodes: int, timeout: float) -> list[dict]:
    """The alive nodes of the Ray cluster at ``address`` once there are ``nodes`` of them; a ``LaunchError`` if
    they are not all there within ``timeout`` seconds (``ServiceError`` at once for a token the head rejects)."""
    import ray  # only here: the other commands never start a driver

    deadline = time.monotonic() + timeout
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise LaunchError(f"RAY_ADDRESS {address!r}: expected host:port (the head's GCS)")
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
            break
        except OSError as err:
            if time.monotonic() > deadline:
                raise LaunchError(
                    f"the Ray head at {address} did not open its port within {timeout:.0f} s ({err})"
                ) from None
            time.sleep(1)
    check_ray_token(address)
    alive: list[dict] = []
    while True:
        try:
            if not ray.is_initialized():
                ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
            alive = [n for n in ray.nodes() if n.get("Alive")]
        except (ConnectionError, RuntimeError, TimeoutError):  # the head's raylet not registered yet
            ray.shutdown()
        if len(alive) >= nodes:
            ray.shutdown()
            return alive
        if time.monotonic() > deadline:
            ray.shutdown()
            joined = ", ".join(n["NodeManagerAddress"] for n in alive) or "none"
            raise LaunchError(
                f"{len(alive)} of {nodes} Ray nodes joined the head at {address} within {timeout:.0f} s "
                f"(joined: {joined}); the others' `ray start` output is in the job's log"
            )
        time.sleep(1)


def keep(storage: str, name: str, root: Path = ROOT) -> str:
    """Copies this checkout's outputs (``OUTPUTS``) to ``<storage>/outputs/<name>/`` (a path or a URI), for a
    checkout that is deleted with its pod; returns where."""
    fs, base = filesystem(storage)
    dest = f"{base.rstrip('/')}/outputs/{name}"
    try:
        fs.create_dir(dest)
        for item in OUTPUTS:
            if (root / item).is_dir():
                fs.create_dir(f"{dest}/{item}")  # pyarrow makes the folders below it, not this one
            if (root / item).exists():
                pafs.copy_files(str(root / item), f"{dest}/{item}", destination_filesystem=fs)
    except OSError as err:  # pyarrow's errors are OSErrors
        raise LaunchError(f"cannot copy the outputs to {storage}: {err}") from None
    return dest if "://" not in storage else f"{storage.split('://')[0]}://{dest}"


# ---- DVC's state, for a checkout that lives as long as its job (a Ray job's copy, a pod's image)

DVC_CACHE, DVC_REMOTE, GIT_REMOTE = "CAPACITY_ATLAS_DVC_CACHE", "CAPACITY_ATLAS_DVC_REMOTE", "CAPACITY_ATLAS_GIT_REMOTE"


def dvc(args: list[str], root: Path) -> subprocess.CompletedProcess:
    return experiments.run(experiments.dvc(*args), root)


def dvc_state(env: dict[str, str], root: Path = ROOT) -> str:
    """Points this checkout's DVC at the cluster's shared state (``.dvc/config.local``): ``$CAPACITY_ATLAS_DVC_CACHE``
    a cache directory every job shares, ``$CAPACITY_ATLAS_DVC_REMOTE`` the default remote; checks the remotes the
    results will be pushed to (``$CAPACITY_ATLAS_GIT_REMOTE`` and DVC's default remote) before anything runs; then
    restores what ``dvc.lock`` records from them (``dvc pull``, else ``dvc checkout``), so that `dvc repro` reruns
    only what changed instead of generating the datasets again. Returns what it did, in a line."""
    done = []
    for key, args in ((DVC_CACHE, ["cache", "dir", "--local"]), (DVC_REMOTE, ["remote", "add", "--local", "-f", "-d"])):
        if value := env.get(key):
            cmd = [*args, value] if key == DVC_CACHE else [*args, "cluster", value]
            if (run := dvc(cmd, root)).returncode != 0:
                raise LaunchError(f"${key} {value!r}: `dvc {' '.join(cmd)}` failed:\n{experiments.last_lines(run)}")
            done.append(f"{'cache' if key == DVC_CACHE else 'remote'} {value}")
    if env.get(GIT_REMOTE):
        try:
            done.append(f"results pushed to {experiments.check(root, env[GIT_REMOTE])}")
        except experiments.RemoteError as err:
            raise LaunchError(f"${GIT_REMOTE}: {err}") from None
    remote = dvc(["remote", "default"], root).stdout.strip()
    restore = ["pull", "--run-cache", "--allow-missing"] if remote else ["checkout", "--allow-missing"]
    run = dvc(restore, root)
    if run.returncode != 0:  # nothing is lost: the stages that lack their outputs run
        print(
            f"warning: `dvc {' '.join(restore)}` failed; `dvc repro` runs what it lacks:\n"
            f"{experiments.last_lines(run)}",
            file=sys.stderr,
        )
    done.append(f"outputs restored with `dvc {' '.join(restore)}`")
    return "DVC: " + "; ".join(done)


def save_experiment(name: str, targets: list[str], env: dict[str, str], root: Path = ROOT) -> str:
    """The workspace a `dvc repro [TARGETS]` left (its params, dvc.lock, the outputs of ``targets``, else of every
    stage) as the DVC experiment ``name`` (`dvc exp save`, committed as the job where the account has no git
    identity), pushed to ``$CAPACITY_ATLAS_GIT_REMOTE`` (its ref) and DVC's default remote (its outputs) when set, as
    the nightly's nights are (``pipeline.nightly.experiments``): where `dvc exp show` finds it once a clone pulls it
    (`dvc exp pull <remote> <name>`)."""
    identity = experiments.run(["git", "config", "user.email"], root).stdout.strip() or env.get("GIT_AUTHOR_EMAIL")
    if not identity:  # a pod's or a job's account often has none: the experiment's commit is the job's
        name_, email = "Capacity Atlas job", f"job@{socket.gethostname()}"
        for role in ("AUTHOR", "COMMITTER"):
            os.environ.update({f"GIT_{role}_NAME": name_, f"GIT_{role}_EMAIL": email})
    run = dvc(["exp", "save", "-n", name, *targets], root)
    if run.returncode != 0:
        raise LaunchError(f"`dvc exp save -n {name} {' '.join(targets)}` failed:\n{experiments.last_lines(run)}")
    if not (remote := env.get(GIT_REMOTE)):
        return f"experiment {name} saved in this checkout (${GIT_REMOTE} not set: not pushed)"
    try:
        experiments.push_named(root, remote, [name])
    except experiments.RemoteError as err:
        raise LaunchError(str(err)) from None
    return f"experiment {name} pushed to git remote {remote!r} and DVC's default remote"


# ---- the command line


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m pipeline.launch", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--params", default=str(ROOT / "params.yaml"), help="params file (default: %(default)s)")
    sub = ap.add_subparsers(dest="command", required=True)
    slurm = sub.add_parser("slurm", help="can a Slurm allocation hold one trial of the profile?")
    slurm.add_argument("--profile", help="default: params.yaml's")
    slurm.add_argument("--nodes", type=int, required=True)
    slurm.add_argument("--cpus-per-node", type=float, required=True)
    slurm.add_argument("--gpus-per-node", type=float, default=0)
    rayjob = sub.add_parser("rayjob", help="check a KubeRay RayJob manifest against the profile it names")
    rayjob.add_argument("manifest", type=Path)
    wait = sub.add_parser("wait", help="wait for Ray nodes to join the head at $RAY_ADDRESS")
    wait.add_argument("--address", help="default: $RAY_ADDRESS")
    wait.add_argument("--nodes", type=int, required=True)
    wait.add_argument("--timeout", type=float, default=300, help="seconds (default: %(default)s)")
    use = sub.add_parser("use-profile", help="set params.yaml's profile, after checking it loads")
    use.add_argument("profile")
    kept = sub.add_parser("keep", help="copy params.yaml, dvc.lock, results/ and report/ to <storage>/outputs/NAME")
    kept.add_argument("name")
    sub.add_parser("dvc-state", help="point DVC at the cluster's shared cache and remote, check them, restore outputs")
    saved = sub.add_parser("save-experiment", help="`dvc exp save -n NAME`, pushed to $CAPACITY_ATLAS_GIT_REMOTE")
    saved.add_argument("name")
    saved.add_argument("targets", nargs="*", help="the stages `dvc repro` was given (default: all)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "slurm":
            cfg = load_config(args.params, profile=args.profile)
            slots = check_slurm(cfg, args.nodes, args.cpus_per_node, args.gpus_per_node)
            print(
                f"profile {cfg.profile}: {amount(args.nodes, 'Slurm node')} of {amount(args.cpus_per_node, 'CPU')} "
                f"and {amount(args.gpus_per_node, 'GPU')} run {amount(slots, 'trial')} at once "
                f"(each {trial_need(cfg)})"
            )
        elif args.command == "rayjob":
            job = check_rayjob(read_manifest(args.manifest), args.params)
            cfg = load_config(args.params, profile=job.profile)
            groups = "; ".join(g.describe() for g in job.groups)
            print(
                f"{args.manifest}: a RayJob of KubeRay {job.kuberay}, profile {job.profile}, "
                f"`{shlex.join(job.command)}`; {groups}: {amount(job.slots, 'trial')} at once (each {trial_need(cfg)})"
            )
            if note := job.slots_note(cfg):
                print(note)
        elif args.command == "wait":
            address = args.address or os.environ.get("RAY_ADDRESS")
            if not address:
                raise LaunchError("no Ray address: give --address or set RAY_ADDRESS")
            alive = wait_for_nodes(address, args.nodes, args.timeout)
            listing = ", ".join(
                f"{n['NodeManagerAddress']} ({n['Resources'].get('CPU', 0):g} CPUs, "
                f"{n['Resources'].get('GPU', 0):g} GPUs)"
                for n in alive
            )
            print(f"Ray at {address}: {len(alive)} nodes: {listing}")
        elif args.command == "use-profile":
            set_profile(Path(args.params), args.profile)
        elif args.command == "keep":
            storage = load_config(args.params).cluster.storage()
            print(f"outputs kept in {keep(storage, args.name)}")
        elif args.command == "dvc-state":
            print(dvc_state(dict(os.environ)))
        elif args.command == "save-experiment":
            print(save_experiment(args.name, args.targets, dict(os.environ)))
    except (LaunchError, ConfigError, ServiceError) as err:
        print(f"error: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
