"""A KubeRay RayJob manifest checked against this checkout before it is applied (``check_rayjob``): KubeRay's CRD schema
of the release it names, its entrypoint and deadlines, its Ray version and image, MLflow and storage, and that its pods
hold one trial of the profile its head names.
"""

from __future__ import annotations

import difflib
import functools
import importlib.metadata
import json
import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from pipeline.common import signals
from pipeline.common.config import ROOT, Config, load_config
from pipeline.launch.allocation import LaunchError, Nodes, amount, check_nodes

ENTRYPOINT = "ops/ray-job"  # the RayJob's entrypoint script, in the image's checkout
DRIVERS = (("dvc", "repro"), ("dvc", "exp", "run"))  # the pipeline's commands an entrypoint may run
PLACEHOLDER = "REPLACE-ME"  # in ops/kuberay/rayjob.yaml's image: the image a user builds goes there
CRDS = ROOT / "ops" / "kuberay" / "crd"  # KubeRay's RayJob schema, one file per release (ops/kuberay/vendor-crd)
KUBERAY_VERSION = "capacity-atlas/kuberay-version"  # the manifest's annotation: the KubeRay release it is for
MIN_KUBERAY = "1.5"  # the first whose RayCluster takes authOptions (the token authentication the head is started with)
SECRETS = ("MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")  # never a literal value in a manifest
STOP_AFTER = "CAPACITY_ATLAS_STOP_AFTER_S"  # the head's env: seconds ops/ray-job's driver runs before it stops itself
GRACE = ("CAPACITY_ATLAS_STOP_SECONDS", 90.0)  # ops/ray-job's: from its stop's SIGINT to SIGTERM (the env, its default)
KEEP_S = 300.0  # after the stop: the outputs copied to storage, the job's end reported, with room to spare


class SchemaError(LaunchError):
    """A RayJob manifest that KubeRay's CRD schema (of the release it names) rejects: an unknown field, a wrong type."""


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
        at its start unless ``sweep.resources.max_concurrent_trials`` asks for more
        (``pipeline.scheduling.cluster.trial_slots``)."""
        if not self.autoscaled or cfg.sweep.resources.max_concurrent_trials == self.slots:
            return None
        return (
            f"note: with KubeRay's autoscaler, the sweep runs {amount(self.slots, 'trial')} at once only with "
            f"sweep.resources.max_concurrent_trials: {self.slots} in the image's params.yaml (now "
            f"{cfg.sweep.resources.max_concurrent_trials}); otherwise it stays on the pods up at its start"
        )


def kuberay_versions() -> list[str]:
    """The KubeRay releases whose RayJob schema is vendored (``CRDS``), oldest first."""
    return sorted((p.stem.removeprefix("rayjob-") for p in CRDS.glob("rayjob-*.json")), key=release_key)


@functools.cache
def vendored_schema(release: str) -> dict:
    """The RayJob schema vendored for ``release`` (one of ``kuberay_versions``), as the CRD gives it."""
    return json.loads((CRDS / f"rayjob-{release}.json").read_text())["schema"]


def release_key(release: str) -> tuple[int, ...]:
    return tuple(int(part) for part in release.split(".") if part.isdigit())


def vendored_for(release: str) -> str | None:
    """The vendored schema that checks a manifest for ``release``: its own, else the newest patch release of its
    minor (a RayJob's schema changes between minor releases), else None."""
    known = kuberay_versions()
    if release in known:
        return release
    same_minor = [v for v in known if release_key(v)[:2] == release_key(release)[:2]]
    return same_minor[-1] if same_minor else None


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


# fields of ops/kuberay/rayjob.yaml that older releases lack, and what to do there
LATER_FIELDS = {
    "preRunningDeadlineSeconds": " (KubeRay 1.6 and later: leave it out; before 1.6 activeDeadlineSeconds, counted "
    "from the job's start, also ends pods that never schedule)",
}
JSON_TYPES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", list: "a list", dict: "a map"}


def describe(error: jsonschema.ValidationError, release: str) -> str:
    """One schema error in a reader's words: the field, what is wrong, and for a misspelled field the right name."""
    where = field_path(error)
    if error.validator == "additionalProperties":
        known = list((error.schema.get("properties") or {}).keys())
        unknown = [k for k in error.instance if k not in known]
        return "; ".join(
            f"{where + '.' if error.absolute_path else ''}{k}: no such field in KubeRay {release}'s RayJob"
            + (LATER_FIELDS.get(k) or "".join(f" (did you mean {c}?)" for c in difflib.get_close_matches(k, known, 1)))
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
    vendored = vendored_for(str(release))
    if vendored is None:
        older = release_key(str(release)) < release_key(known[0])
        raise LaunchError(
            f"metadata.annotations.{KUBERAY_VERSION}: KubeRay {release!r} is not a release this checkout knows the "
            f"RayJob schema of (ops/kuberay/crd/: {', '.join(known)}): "
            + (f"the manifest needs KubeRay {MIN_KUBERAY} or later (spec.rayClusterSpec.authOptions, Ray's token "
               "authentication)" if older else "vendor its CRD with ops/kuberay/vendor-crd, or name a known release")
        )  # fmt: skip
    schema = strict(vendored_schema(vendored))
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(manifest), key=lambda e: list(map(str, e.path)))
    if errors:
        more = f"; and {len(errors) - 5} more" if len(errors) > 5 else ""
        raise SchemaError("; ".join(describe(e, vendored) for e in errors[:5]) + more)
    return vendored


def check_deadlines(spec: dict, release: str) -> None:
    """A RayJob that holds its GPUs only as long as it works: its deadlines (the start deadline where ``release``
    has one: KubeRay 1.6 and later), and the cluster deleted at its end."""
    if spec.get("shutdownAfterJobFinishes") is not True:
        raise LaunchError(
            "spec.shutdownAfterJobFinishes is not true: KubeRay would keep the Ray cluster, and its GPUs, after the "
            "job ends"
        )
    deadlines = [("activeDeadlineSeconds", "a hung sweep holds its GPUs with no end")]
    if "preRunningDeadlineSeconds" in vendored_schema(release)["properties"]["spec"]["properties"]:
        deadlines.insert(
            0, ("preRunningDeadlineSeconds", "pods that never schedule or a job that never starts hold their nodes")
        )
    for field, why in deadlines:
        if field not in spec:
            raise LaunchError(f"spec.{field} is not set: without it {why} (ops/kuberay/rayjob.yaml sets both)")


def check_stop(spec: dict, env: dict[str, Any]) -> None:
    """The sweep stops itself before KubeRay's deadline: at ``activeDeadlineSeconds`` KubeRay marks the RayJob Failed
    without stopping its Ray job, and the sweep keeps its GPUs until the cluster goes ``ttlSecondsAfterFinished``
    later. The deadline counts from the RayJob's start, again at each retry (KubeRay 1.5-1.7 reset its StartTime), and
    the driver starts at most ``preRunningDeadlineSeconds`` after it; the driver's own time (``STOP_AFTER``) and its
    clean stop must fit in what is left."""
    active, pre = spec["activeDeadlineSeconds"], spec.get("preRunningDeadlineSeconds", 0)
    grace = float(env.get(GRACE[0]) or GRACE[1])
    most = math.floor(active - pre - grace - signals.KILL_AFTER_S - KEEP_S)
    budget = (
        f"activeDeadlineSeconds {active} less preRunningDeadlineSeconds {pre}, the stop's {grace:g} s grace "
        f"({GRACE[0]}), {signals.KILL_AFTER_S:g} s to SIGKILL and {KEEP_S:g} s to keep the outputs"
    )
    if most <= 0:
        raise LaunchError(f"spec.activeDeadlineSeconds {active} leaves the sweep no time: {budget} is {most} s")
    value = env.get(STOP_AFTER)
    if value is None:
        raise LaunchError(
            f"the head's env sets no {STOP_AFTER}: at activeDeadlineSeconds KubeRay marks the job Failed without "
            "stopping it, and the sweep holds its GPUs until the cluster is deleted; set it to at most "
            f"{most} ({budget}), so that the sweep stops itself cleanly and a retry continues it"
        )
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not seconds > 0:
        raise LaunchError(f"the head's env: {STOP_AFTER} {value!r} is not a positive number of seconds")
    if seconds > most:
        raise LaunchError(
            f"the head's env: {STOP_AFTER} {value} is past what the deadline leaves: at most {most} ({budget})"
        )


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
    check_deadlines(spec, release)
    command = driver_command(spec)
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
    check_stop(spec, env)
    profile = env.get("CAPACITY_ATLAS_PROFILE")
    if not profile:
        raise LaunchError(f"{where}: the Ray container's env sets no CAPACITY_ATLAS_PROFILE (the profile to run)")
    cfg = load_config(params, profile=str(profile))
    groups, containers = node_groups(cluster)
    check_environment(env, containers)
    check_image(containers)
    hint = "raise a worker group's resources.limits (cpu, nvidia.com/gpu) or its replicas"
    slots = check_nodes(cfg, groups, "the RayJob's pods", hint)
    autoscaled = bool(cluster.get("enableInTreeAutoscaling"))
    return RayJob(str(profile), command, groups, slots, autoscaled, release)


def driver_command(spec: dict) -> list[str]:
    """The pipeline's command the entrypoint runs (``ops/ray-job dvc repro``: ``["dvc", "repro"]``)."""
    words = shlex.split(str(spec.get("entrypoint") or ""))
    if not words or not words[0].endswith(ENTRYPOINT) or not any(tuple(words[1 : 1 + len(d)]) == d for d in DRIVERS):
        raise LaunchError(
            f"spec.entrypoint: {spec.get('entrypoint')!r} does not run the pipeline: use "
            f"'<the image's checkout>/{ENTRYPOINT} dvc repro' (or dvc exp run ...)"
        )
    return words[1:]


def node_groups(cluster: dict) -> tuple[list[Nodes], dict[str, dict]]:
    """The head and each worker group as Ray counts them (an autoscaled group at its ``maxReplicas``), and the Ray
    container of each that has pods, by where it is in the manifest."""
    head, where = cluster.get("headGroupSpec") or {}, "spec.rayClusterSpec.headGroupSpec"
    containers = {where: container(head, where)}
    groups = [Nodes("the head", 1, *ray_resources(head, where))]
    for i, group in enumerate(cluster.get("workerGroupSpecs") or []):
        at = f"spec.rayClusterSpec.workerGroupSpecs[{i}]"
        count = int(group.get("maxReplicas", pods(group))) if cluster.get("enableInTreeAutoscaling") else pods(group)
        groups.append(Nodes(f"worker group {group.get('groupName', i)!r}", count, *ray_resources(group, at)))
        if count:
            containers[at] = container(group, at)
    return groups, containers


def check_image(containers: dict[str, dict]) -> None:
    """One image in every Ray container (the same code), and not the shipped placeholder."""
    images = {c.get("image") for c in containers.values()}
    if len(images) != 1 or not all(isinstance(i, str) and i for i in images):
        raise LaunchError(f"the head's and the workers' Ray containers must run one image (the same code): {images}")
    image = str(images.pop())
    if PLACEHOLDER in image:
        raise LaunchError(
            f"image: {image!r} is the placeholder: build the image (docs/cluster.md) and put its name in every "
            "Ray container"
        )


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
