"""The launchers as a cluster user runs them, as far as a CPU machine can: ``ops/slurm/capacity-atlas.sbatch`` under a
simulated Slurm (``scontrol`` and ``srun`` stand-ins on the PATH that run each node's step here) and
``ops/kuberay/rayjob.yaml`` parsed and checked against its profile, with its entrypoint run against a stand-in
``dvc``. Bad input stops with a named error before anything starts. The sbatch script's cluster comes up for real:
two Ray nodes on 127.0.0.1 and 127.0.0.2 of a network namespace of their own (tests/helpers/services.py), a driver
joined with the job's token, and nothing of Ray left once the job ends."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pyarrow.fs as pafs
import pytest
import yaml

from pipeline.common.config import ConfigError, load_config
from pipeline.common.signals import Stopped
from pipeline.launch.allocation import AllocationError, LaunchError, check_slurm
from pipeline.launch.job import keep
from pipeline.launch.rayjob import (
    KUBERAY_VERSION,
    STOP_AFTER,
    SchemaError,
    check_rayjob,
    kuberay_versions,
    release_key,
)
from tests.helpers import ROOT, default_stop_signals, services
from tests.helpers.repo import NARROW, copy_repo, mlflow_runs, run
from tests.helpers.upstream import copy_kernels, upstream_and_clone

SBATCH = Path("ops/slurm/capacity-atlas.sbatch")
MANIFEST = ROOT / "ops" / "kuberay" / "rayjob.yaml"
BIN = Path(sys.executable).parent
IMAGE = "registry.example/capacity-atlas:1"  # what a user puts in place of the placeholder
NO_NAMESPACES = services.namespace_problem()  # the Ray cluster's test needs them (root)
NODES = ("127.0.0.1", "127.0.0.2")  # the simulated allocation's

SCONTROL = """#!/usr/bin/env bash
# scontrol's stand-in: `scontrol show hostnames a,b` prints a and b, one a line; `scontrol requeue ID` is logged
case "$1 ${2:-}" in
    "show hostnames") tr ',' '\\n' <<<"$3" ;;
    "requeue $SLURM_JOB_ID") echo "$*" >>"$FAKE_SLURM/scontrol.log" ;;
    *) exit 1 ;;
esac
"""
SRUN = """#!/usr/bin/env bash
# srun's stand-in: logs its call, then runs the step's command here, its Ray temp dir one of the node's own (each
# node has its own /tmp)
echo "$*" >>"$FAKE_SLURM/srun.log"
node=""
while [ $# -gt 0 ]; do
    case $1 in
        --nodelist=*) node=${1#*=}; shift ;;
        -*) shift ;;
        *) break ;;
    esac
done
mkdir -p "$FAKE_SLURM/$node"
args=()
for arg in "$@"; do
    case $arg in
        --temp-dir=*) args+=("--temp-dir=$FAKE_SLURM/$node") ;;
        /tmp/ray-*) args+=("$FAKE_SLURM/$node") ;;  # the job's temp dir, removed at its end
        *) args+=("$arg") ;;
    esac
done
export RAY_TMPDIR="$FAKE_SLURM/$node"
exec "${args[@]}"
"""
DVC = """#!/usr/bin/env bash
# dvc's stand-in: records how it was called, writes outputs, exits as FAKE_DVC_EXIT says
python - "$@" <<'EOF'
import json, os, pathlib, sys
pathlib.Path("results").mkdir(exist_ok=True)
pathlib.Path("results/sweep.csv").write_text("cell,status\\n")
pathlib.Path("report").mkdir(exist_ok=True)
pathlib.Path("report/index.html").write_text("<html></html>")
keys = ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "CAPACITY_ATLAS_STORAGE")
call = {"argv": sys.argv[1:], "cwd": os.getcwd(), "env": {k: os.environ.get(k) for k in keys}}
pathlib.Path(os.environ["FAKE_DVC_LOG"]).write_text(json.dumps(call))
EOF
exit "${FAKE_DVC_EXIT:-0}"
"""
DRIVER = """
import json, os, pathlib, sys
import ray
from pipeline.scheduling.cluster import check_ray
address = os.environ["RAY_ADDRESS"]
check_ray(address)  # the driver's own pre-flight: the head answers and takes this job's token
ray.init(address=address, log_to_driver=False, logging_level="ERROR")
nodes = [{"ip": n["NodeManagerAddress"], "cpu": n["Resources"].get("CPU", 0), "gpu": n["Resources"].get("GPU", 0)}
         for n in ray.nodes() if n["Alive"]]
keys = ("RAY_ADDRESS", "RAY_AUTH_MODE", "MLFLOW_TRACKING_URI", "CAPACITY_ATLAS_STORAGE")
seen = {"nodes": nodes, "env": {k: os.environ.get(k) for k in keys}, "cwd": os.getcwd(),
        "token": bool(os.environ.get("RAY_AUTH_TOKEN"))}
ray.shutdown()
pathlib.Path(sys.argv[1]).write_text(json.dumps(seen))
sys.exit(3)
"""


def checkout(dst: Path) -> Path:
    """A copy of what the launchers run in this checkout (tracked and new files of the code, profiles and ops)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z", "pipeline", "tasks", "models",
                             "conf", "ops", "params.yaml", "dvc.yaml", "dvc.lock", ".dvc", ".dvcignore"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dst / name)
    return dst


def stand_ins(folder: Path, **scripts: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in scripts.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder


def slurm_env(fake: Path, repo: Path, **extra: str) -> dict[str, str]:
    """A batch job's environment on two nodes, 127.0.0.1 and 127.0.0.2, with the stand-ins first on the PATH."""
    bin_dir = stand_ins(fake / "bin", scontrol=SCONTROL, srun=SRUN)
    return services.clean_env() | {
        "PATH": f"{bin_dir}:{BIN}:{os.environ['PATH']}",
        "FAKE_SLURM": str(fake),
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": ",".join(NODES),
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_CPUS_PER_TASK": "4",
        "SLURM_SUBMIT_DIR": str(repo),
    } | extra


def profile_of(params: Path) -> str:
    return re.search(r"(?m)^profile: (\S+)", params.read_text())[1]


# ---- the check both launchers share


def test_a_slurm_allocation_without_gpus_cannot_hold_a_gpu_profiles_trial():
    paper = load_config(profile="paper")  # 4 CPUs and 1 GPU a trial
    with pytest.raises(AllocationError, match=r"profile 'paper'.*4 CPUs and 1 GPU.*--gpus-per-node"):
        check_slurm(paper, nodes=2, cpus=64, gpus=0)
    with pytest.raises(AllocationError, match=r"at least 4 CPUs per node.*--cpus-per-task"):
        check_slurm(paper, nodes=2, cpus=2, gpus=8)
    with pytest.raises(AllocationError, match="0 nodes"):
        check_slurm(paper, nodes=0, cpus=64, gpus=8)
    assert check_slurm(paper, nodes=2, cpus=32, gpus=4) == 8  # each node: min(32 / 4, 4 / 1)
    assert check_slurm(paper, nodes=3, cpus=8, gpus=4) == 6  # the CPUs are the scarcer: 2 a node
    laptop = load_config(profile="laptop")  # a CPU profile runs anywhere with a CPU
    assert check_slurm(laptop, nodes=1, cpus=2, gpus=0) == 2


def test_shares_of_a_gpu_are_counted_as_the_sweep_counts_them(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text((ROOT / "params.yaml").read_text().replace("sweep: {}",
                                                                 "sweep: {resources: {gpus_per_trial: 0.25}}"))
    cfg = load_config(params, profile="paper")
    assert check_slurm(cfg, nodes=1, cpus=16, gpus=1) == 4
    assert check_slurm(cfg, nodes=1, cpus=64, gpus=1) == 4  # four quarters of one GPU
    with pytest.raises(AllocationError, match="0.25 GPU"):
        check_slurm(cfg, nodes=1, cpus=64, gpus=0)


# ---- the RayJob manifest


def manifest() -> dict:
    """The shipped manifest with an image in place of the placeholder."""
    data = yaml.safe_load(MANIFEST.read_text())
    for group in [data["spec"]["rayClusterSpec"]["headGroupSpec"], *data["spec"]["rayClusterSpec"]["workerGroupSpecs"]]:
        group["template"]["spec"]["containers"][0]["image"] = IMAGE
    return data


def workers(data: dict) -> dict:
    return data["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]


def head_env(data: dict) -> dict:
    env = data["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
    return {e["name"]: e for e in env}


def test_the_shipped_rayjob_runs_dvc_repro_on_a_profile_its_workers_hold():
    shipped = yaml.safe_load(MANIFEST.read_text())
    with pytest.raises(LaunchError, match="placeholder"):  # the user builds the image and names it
        check_rayjob(shipped)
    data = manifest()
    job = check_rayjob(data)
    spec = data["spec"]
    # the entrypoint: the image's copy of ops/ray-job, running the pipeline's command
    script, *command = spec["entrypoint"].split()
    assert script.endswith("/ops/ray-job") and os.access(ROOT / "ops/ray-job", os.X_OK)
    assert command == ["dvc", "repro"] == job.command
    assert spec["shutdownAfterJobFinishes"] is True and spec["rayClusterSpec"]["authOptions"] == {"mode": "token"}
    lock = re.search(r"(?m)^ray==(\S+)", (ROOT / "requirements.lock").read_text())[1]
    assert spec["rayClusterSpec"]["rayVersion"] == lock
    # the profile it names, and its trials on the worker pods, counted here from the pod's limits
    assert job.profile == head_env(data)["CAPACITY_ATLAS_PROFILE"]["value"] == "paper"
    need = load_config(profile="paper").sweep.resources.trial_resources()
    group = workers(data)
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    per_pod = min(int(limits["cpu"]) // need["cpu"], limits["nvidia.com/gpu"] // need["gpu"])
    assert per_pod >= 1 and job.slots == group["replicas"] * per_pod
    # no trial on the head, whose CPUs are the driver's
    assert spec["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    assert job.groups[0].cpus == 0


def too_small(change: str) -> dict:
    data = manifest()
    group = workers(data)
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    if change == "cpus":
        limits["cpu"] = "3500m"  # ray start is given 4 (KubeRay rounds a limit up): still holds; then 3
        assert check_rayjob(data).slots == group["replicas"]
        limits["cpu"] = "3"
    elif change == "gpus":
        del limits["nvidia.com/gpu"]
    elif change == "ray-start-params":
        group["rayStartParams"] = {"num-gpus": "0"}  # overrides the container's limits, as in KubeRay
    elif change == "no-pods":
        group["replicas"] = group["minReplicas"] = 0
    return data


@pytest.mark.parametrize("change", ["cpus", "gpus", "ray-start-params", "no-pods"])
def test_a_rayjob_whose_pods_cannot_hold_one_trial_is_named(change):
    with pytest.raises(AllocationError, match=r"RayJob's pods cannot hold one trial of profile 'paper'.*worker "
                                              r"group 'gpu'"):
        check_rayjob(too_small(change))


OTHER_MISTAKES = {
    "entrypoint": (lambda d: d["spec"].update(entrypoint="python train.py"), "does not run the pipeline"),
    "ray-version": (lambda d: d["spec"]["rayClusterSpec"].update(rayVersion="2.9.0"), "has Ray 2"),
    "profile": (lambda d: head_env(d)["CAPACITY_ATLAS_PROFILE"].update(value="huge"), "profile: 'huge'"),
    "mlflow": (lambda d: head_env(d)["MLFLOW_TRACKING_URI"].update(value="sqlite:///mlflow.db"), "no MLflow server"),
    "storage": (lambda d: workers(d)["template"]["spec"]["containers"][0].pop("volumeMounts"),
                r"not under a volumeMount of the Ray container of spec.rayClusterSpec.workerGroupSpecs\[0\]"),
    "image": (lambda d: workers(d)["template"]["spec"]["containers"][0].update(image="other:1"), "one image"),
}


@pytest.mark.parametrize("mistake", OTHER_MISTAKES)
def test_what_else_a_rayjob_must_get_right_is_named(mistake):
    change, message = OTHER_MISTAKES[mistake]
    data = manifest()
    change(data)
    with pytest.raises((LaunchError, ConfigError), match=message):
        check_rayjob(data)


SCHEMA_MISTAKES = {
    # the two: KubeRay would ignore the misspelled field and never delete the cluster; the API server would
    # refuse the string
    "misspelled": (lambda d: d["spec"].update(shutdownAfterJobFinishs=d["spec"].pop("shutdownAfterJobFinishes")),
                   "spec.shutdownAfterJobFinishs: no such field in KubeRay 1.7.0's RayJob (did you mean "
                   "shutdownAfterJobFinishes?)"),
    "string": (lambda d: d["spec"].update(ttlSecondsAfterFinished="600"),
               "spec.ttlSecondsAfterFinished: '600' is a string; KubeRay 1.7.0's RayJob wants integer"),
    "deep": (lambda d: workers(d)["template"]["spec"]["containers"][0].update(
        volumeMount=workers(d)["template"]["spec"]["containers"][0].pop("volumeMounts")),
        "spec.rayClusterSpec.workerGroupSpecs[0].template.spec.containers[0].volumeMount: no such field in KubeRay "
        "1.7.0's RayJob (did you mean volumeMounts?)"),
    "deadline": (lambda d: d["spec"].update(preRunningDeadlineSeconds=0),
                 "spec.preRunningDeadlineSeconds: 0 is less than the minimum of 1"),
}


KUBERAY_MISTAKES = {
    "unknown": (lambda d: d["metadata"]["annotations"].update({KUBERAY_VERSION: "0.9.9"}),
                "KubeRay '0.9.9' is not a release this checkout knows the RayJob schema of (ops/kuberay/crd/: 1.5.2, "
                "1.6.2, 1.7.0): the manifest needs KubeRay 1.5 or later"),
    "newer": (lambda d: d["metadata"]["annotations"].update({KUBERAY_VERSION: "1.8.0"}),
              "KubeRay '1.8.0' is not a release this checkout knows the RayJob schema of (ops/kuberay/crd/: 1.5.2, "
              "1.6.2, 1.7.0): vendor its CRD with ops/kuberay/vendor-crd"),
    "unsaid": (lambda d: d["metadata"].pop("annotations"), "no 'capacity-atlas/kuberay-version': name the KubeRay"),
    "no-deadline": (lambda d: d["spec"].pop("activeDeadlineSeconds"),
                    "spec.activeDeadlineSeconds is not set: without it a hung sweep holds its GPUs"),
    "no-start-deadline": (lambda d: d["spec"].pop("preRunningDeadlineSeconds"), "spec.preRunningDeadlineSeconds"),
    "no-stop": (lambda d: d["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
                .remove(head_env(d)[STOP_AFTER]),
                "the head's env sets no CAPACITY_ATLAS_STOP_AFTER_S: at activeDeadlineSeconds KubeRay marks the job "
                "Failed without stopping it"),
    "late-stop": (lambda d: head_env(d)[STOP_AFTER].update(value="604000"),
                  "CAPACITY_ATLAS_STOP_AFTER_S 604000 is past what the deadline leaves: at most 602600 "
                  "(activeDeadlineSeconds 604800 less preRunningDeadlineSeconds 1800, the stop's 90 s grace"),
    "no-stop-time": (lambda d: head_env(d)[STOP_AFTER].update(value="a week"),
                     "CAPACITY_ATLAS_STOP_AFTER_S 'a week' is not a positive number of seconds"),
    "short-deadline": (lambda d: d["spec"].update(activeDeadlineSeconds=2000),
                       "spec.activeDeadlineSeconds 2000 leaves the sweep no time"),
    "kept-cluster": (lambda d: d["spec"].update(shutdownAfterJobFinishes=False), "would keep the Ray cluster"),
    "password": (lambda d: head_env(d)["MLFLOW_TRACKING_PASSWORD"].update(value="hunter2", valueFrom=None) or
                 head_env(d)["MLFLOW_TRACKING_PASSWORD"].pop("valueFrom"),
                 "MLFLOW_TRACKING_PASSWORD is a literal value in the manifest: take it from a Kubernetes Secret"),
}


@pytest.mark.parametrize("mistake", [*SCHEMA_MISTAKES, *KUBERAY_MISTAKES])
def test_a_rayjob_that_kuberays_schema_rejects_or_that_would_hang_or_leak_is_named(mistake):
    """Field by field against KubeRay's schema (a SchemaError); an unknown KubeRay, a missing deadline, a kept
    cluster or a literal secret by this project's own rules (a LaunchError of another kind)."""
    schema = mistake in SCHEMA_MISTAKES
    change, message = (SCHEMA_MISTAKES if schema else KUBERAY_MISTAKES)[mistake]
    data = manifest()
    change(data)
    with pytest.raises(LaunchError) as err:
        check_rayjob(data)
    assert message in str(err.value) and isinstance(err.value, SchemaError) == schema


def test_the_vendored_rayjob_schema_says_where_it_came_from_and_resolves_whole():
    vendored = json.loads((ROOT / "ops/kuberay/crd/rayjob-1.7.0.json").read_text())
    assert vendored["kuberay_version"] == "1.7.0" and re.fullmatch(r"[0-9a-f]{40}", vendored["commit"])
    assert vendored["source"].startswith("https://github.com/ray-project/kuberay/blob/v1.7.0/")
    schema = vendored["schema"]
    refs = set(re.findall(r'"\$ref": "#/\$defs/(\w+)"', json.dumps(schema)))
    assert refs == set(schema["$defs"])  # every shared subtree used, every reference there
    spec = schema["properties"]["spec"]["properties"]
    assert {"activeDeadlineSeconds", "preRunningDeadlineSeconds", "shutdownAfterJobFinishes"} <= set(spec)
    assert "status" not in schema["properties"]  # the operator's, never a manifest's
    assert kuberay_versions() == ["1.5.2", "1.6.2", "1.7.0"]
    assert yaml.safe_load(MANIFEST.read_text())["metadata"]["annotations"][KUBERAY_VERSION] == "1.7.0"


@pytest.mark.parametrize("release", ["1.5.0", "1.5.2", "1.6.1"])
def test_a_rayjob_for_an_older_kuberay_is_checked_against_its_minors_schema_and_deadlines(release):
    """KubeRay 1.5's schema has no preRunningDeadlineSeconds (1.6 added it): the shipped manifest less that field
    passes for 1.5 and is refused for 1.6 (its start deadline unset); with it, 1.5's schema names the field and what
    to do. A patch release not vendored is checked against the vendored one of its minor."""
    old = release_key(release) < (1, 6)
    data = manifest()
    data["metadata"]["annotations"][KUBERAY_VERSION] = release
    if old:
        with pytest.raises(SchemaError, match=r"spec\.preRunningDeadlineSeconds: no such field in KubeRay 1\.5\.2's "
                           r"RayJob \(KubeRay 1\.6 and later: leave it out"):  # fmt: skip
            check_rayjob(data)
    else:
        assert check_rayjob(data).kuberay == "1.6.2"
    data["spec"].pop("preRunningDeadlineSeconds")
    if old:
        assert check_rayjob(data).kuberay == "1.5.2"
    else:
        with pytest.raises(LaunchError, match="spec.preRunningDeadlineSeconds is not set"):
            check_rayjob(data)


def test_the_image_recipe_builds_this_checkout_from_the_locks_on_rays_cuda_image():
    dockerfile = (ROOT / "ops/kuberay/Dockerfile").read_text()
    ray = re.search(r"(?m)^ray==(\S+)", (ROOT / "requirements.lock").read_text())[1]
    assert re.search(rf"(?m)^ARG RAY_IMAGE=rayproject/ray:{re.escape(ray)}-py311-gpu$", dockerfile)
    assert re.search(r"(?m)^FROM \$\{RAY_IMAGE\}$", dockerfile)
    # the checkout where the manifest's entrypoint runs, installed with the CUDA lock and Ray's job server
    entrypoint = yaml.safe_load(MANIFEST.read_text())["spec"]["entrypoint"].split()[0]
    assert entrypoint == "/srv/capacity-atlas/ops/ray-job"
    assert "COPY --chown=ray:users . /srv/capacity-atlas" in dockerfile
    assert not re.search(r"(?m)^RUN .*chown -R", dockerfile)  # a layer that would store the tree a second time
    assert "ARG TORCH=cuda\nRUN ops/install --torch ${TORCH} --cluster" in dockerfile  # cu128, cu126 by --build-arg
    assert "ENV PATH=/srv/capacity-atlas/.venv/bin:$PATH" in dockerfile  # KubeRay's `ray start` is the venv's
    lines = (ROOT / "ops/kuberay/Dockerfile.dockerignore").read_text().splitlines()
    ignored = [line for line in lines if line and not line.startswith("#")]
    assert {".venv", "data", "mlflow.db", ".dvc/cache"} <= set(ignored) and ".git" not in ignored
    dry = subprocess.run([str(ROOT / "ops/install"), "--dry-run", "--torch", "cuda", "--cluster"],
                         capture_output=True, text=True, timeout=60)
    assert "-c requirements-cuda.lock -e .[cluster] torch==2.13.0" in dry.stdout, dry.stdout + dry.stderr


def test_the_rayjob_check_on_the_command_line_exits_2_with_the_named_error(tmp_path):
    small = tmp_path / "rayjob.yaml"
    small.write_text(yaml.safe_dump(too_small("gpus")))
    done = subprocess.run([sys.executable, "-m", "pipeline.launch", "rayjob", str(small)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("error: AllocationError: "), done.stderr
    fine = tmp_path / "fine.yaml"
    fine.write_text(yaml.safe_dump(manifest()))
    done = subprocess.run([sys.executable, "-m", "pipeline.launch", "rayjob", str(fine)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "a RayJob of KubeRay 1.7.0, profile paper, `dvc repro`" in done.stdout
    assert "8 trials at once" in done.stdout
    typo = tmp_path / "typo.yaml"
    typo.write_text(fine.read_text().replace("shutdownAfterJobFinishes", "shutdownAfterJobFinishs"))
    done = subprocess.run([sys.executable, "-m", "pipeline.launch", "rayjob", str(typo)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("error: SchemaError: spec.shutdownAfterJobFinishs"), \
        done.stderr


def test_an_autoscaled_rayjob_counts_its_pods_at_most_and_says_what_the_sweep_needs_to_use_them(tmp_path):
    data = manifest()
    data["spec"]["rayClusterSpec"]["enableInTreeAutoscaling"] = True
    group = workers(data)
    group.update(replicas=0, minReplicas=0, maxReplicas=8)
    job = check_rayjob(data)
    assert job.autoscaled and job.slots == 16  # 8 pods of 2 paper trials
    path = tmp_path / "rayjob.yaml"
    path.write_text(yaml.safe_dump(data))
    done = subprocess.run([sys.executable, "-m", "pipeline.launch", "rayjob", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "16 trials at once" in done.stdout, done.stderr
    assert "only with sweep.resources.max_concurrent_trials: 16 in the image's params.yaml (now None)" in done.stdout
    assert check_rayjob(manifest()).slots_note(load_config(profile="paper")) is None  # fixed pods: nothing to say


@pytest.mark.slow  # over 10 s on 2 cores: the fast tier stays a developer's loop
def test_the_rayjob_entrypoint_runs_dvc_on_its_profile_and_keeps_the_outputs(tmp_path):
    repo = checkout(tmp_path / "checkout")
    shared = tmp_path / "shared"
    fake_bin = stand_ins(tmp_path / "bin", dvc=DVC)
    env = services.clean_env() | {
        "PATH": f"{fake_bin}:{BIN}:{os.environ['PATH']}", "FAKE_DVC_LOG": str(tmp_path / "dvc.json"),
        "FAKE_DVC_EXIT": "3", "RAY_ADDRESS": "10.0.0.5:6379", "CAPACITY_ATLAS_PROFILE": "separations",
        "MLFLOW_TRACKING_URI": "http://mlflow:5000", "CAPACITY_ATLAS_STORAGE": str(shared),
    }
    data = manifest()
    entrypoint = [str(repo / "ops/ray-job"), *data["spec"]["entrypoint"].split()[1:]]
    # a checkout without its .git (as `ray job submit --working-dir` ships one by default): named, dvc never runs
    done = subprocess.run(entrypoint, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and f"{repo} has no .git" in done.stderr and not (tmp_path / "dvc.json").exists()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)  # the image's checkout keeps its .git
    done = subprocess.run(entrypoint, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr  # the driver's status
    call = json.loads((tmp_path / "dvc.json").read_text())
    assert call["argv"] == ["repro"] and Path(call["cwd"]) == repo
    assert call["env"] == {"RAY_ADDRESS": "10.0.0.5:6379", "MLFLOW_TRACKING_URI": "http://mlflow:5000",
                           "CAPACITY_ATLAS_STORAGE": str(shared)}
    assert profile_of(repo / "params.yaml") == "separations"
    (kept,) = (shared / "outputs").iterdir()
    assert kept.name.startswith("separations-")
    assert (kept / "results/sweep.csv").exists() and (kept / "report/index.html").exists()
    assert profile_of(kept / "params.yaml") == "separations"
    # an unknown profile: named, and dvc never runs
    (tmp_path / "dvc.json").unlink()
    done = subprocess.run(entrypoint, cwd=tmp_path, env=env | {"CAPACITY_ATLAS_PROFILE": "huge"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "profile: 'huge' is not allowed" in done.stderr
    assert not (tmp_path / "dvc.json").exists() and profile_of(repo / "params.yaml") == "separations"


def test_kept_outputs_appear_whole_or_not_at_all(tmp_path, monkeypatch):
    """`keep` copies beside the storage's outputs and renames into place: a copy that fails or is stopped leaves
    nothing, and a job killed while copying (`ray job stop` kills it a while after its signal) leaves no outputs/NAME
    to take for a whole one; a second job's outputs under the same name go beside the first's, never over them."""
    root, storage = tmp_path / "checkout", tmp_path / "shared"
    (root / "results").mkdir(parents=True)
    for name in ("params.yaml", "dvc.lock", "results/sweep.csv"):
        (root / name).write_text(name)
    copy = pafs.copy_files

    def full_disk(source: str, destination: str, **kwargs) -> None:
        if source.endswith("results"):  # after params.yaml and dvc.lock
            raise OSError("No space left on device")
        copy(source, destination, **kwargs)

    def stopped(source: str, destination: str, **kwargs) -> None:
        if source.endswith("results"):
            raise Stopped(signal.SIGINT)  # as exit_on_signals raises it in `python -m pipeline.launch keep`
        copy(source, destination, **kwargs)

    monkeypatch.setattr(pafs, "copy_files", full_disk)
    with pytest.raises(LaunchError, match="cannot copy the outputs to .*No space left on device"):
        keep(str(storage), "tiny-1", root)
    assert list((storage / "outputs").iterdir()) == []
    monkeypatch.setattr(pafs, "copy_files", stopped)
    with pytest.raises(Stopped):
        keep(str(storage), "tiny-1", root)
    assert list((storage / "outputs").iterdir()) == []  # not even the hidden folder
    monkeypatch.setattr(pafs, "copy_files", copy)
    assert keep(str(storage), "tiny-1", root) == str(storage / "outputs" / "tiny-1")
    assert [p.name for p in (storage / "outputs").iterdir()] == ["tiny-1"]
    assert (storage / "outputs" / "tiny-1" / "results" / "sweep.csv").read_text() == "results/sweep.csv"
    (root / "params.yaml").write_text("the second job's")  # a job of the same profile that ended in the same second
    second = Path(keep(str(storage), "tiny-1", root))
    assert second.name.startswith("tiny-1-") and (second / "params.yaml").read_text() == "the second job's"
    assert (storage / "outputs" / "tiny-1" / "params.yaml").read_text() == "params.yaml"


@pytest.mark.slow  # over 10 s on 2 cores: the fast tier stays a developer's loop
@pytest.mark.parametrize("stopper", ["prestop", "its-time"])
def test_a_stopped_ray_job_stops_its_commands_whole_process_group_and_keeps_the_outputs(tmp_path, stopper):
    """A head pod's deletion as the entrypoint sees it: the manifest's preStop hook, run for real, signals the pid
    ops/ray-job wrote and waits; or the driver's own time up (``CAPACITY_ATLAS_STOP_AFTER_S``, before KubeRay's
    deadline). The command's whole process group gets SIGINT (DVC passes no SIGTERM to its stage), and the outputs are
    kept. (`ray job stop` signals ops/ray-job the same way, with the rest of its tree.)"""
    repo = checkout(tmp_path / "checkout")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    shared, state, pidfile = tmp_path / "shared", tmp_path / "state", tmp_path / "driver.pid"
    state.mkdir()
    (tmp_path / "stoppable.py").write_text(STOPPABLE)
    head = yaml.safe_load(MANIFEST.read_text())["spec"]["rayClusterSpec"]["headGroupSpec"]
    container = head["template"]["spec"]["containers"][0]
    shipped = {e["name"]: e.get("value") for e in container["env"]}["CAPACITY_ATLAS_DRIVER_PIDFILE"]
    hook = container["lifecycle"]["preStop"]["exec"]["command"]
    env = services.clean_env() | {"PATH": f"{BIN}:{os.environ['PATH']}", "CAPACITY_ATLAS_PROFILE": "separations",
                                  "MLFLOW_TRACKING_URI": "http://mlflow:5000", "CAPACITY_ATLAS_STORAGE": str(shared),
                                  "CAPACITY_ATLAS_DRIVER_PIDFILE": str(pidfile)}
    if stopper == "its-time":
        env["CAPACITY_ATLAS_STOP_AFTER_S"] = "4"
    job = subprocess.Popen([str(repo / "ops/ray-job"), sys.executable, str(tmp_path / "stoppable.py"), str(state)],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (state / "driver-running").exists() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pidfile.read_text().strip() == str(job.pid)
    if stopper == "prestop":
        stop = subprocess.Popen([*hook[:-1], hook[-1].replace(shipped, str(pidfile))])  # waits until the driver ends
    out, err = job.communicate(timeout=120)  # (and reaped: its parent, Ray's job supervisor in a pod, reaps it)
    assert job.returncode == 130, out + err  # the command's status: SIGINT
    assert stopper == "its-time" or stop.wait(timeout=30) == 0
    assert (stopper == "its-time") == ("its 4 s (--stop-after) are up: stopping" in err), err
    assert (state / "driver").read_text() == (state / "stage").read_text() == "SIGINT"
    (kept,) = (shared / "outputs").iterdir()
    assert kept.name.startswith("separations-") and profile_of(kept / "params.yaml") == "separations"
    assert not pidfile.exists()


def has_loaded(pid: int, library: str) -> bool:
    """Whether process ``pid`` has mapped a file whose path holds ``library`` (its /proc maps)."""
    with open(f"/proc/{pid}/maps") as f:
        return library in f.read()


@pytest.mark.parametrize("who, signum", [("tree", signal.SIGINT), ("driver", signal.SIGTERM)])
def test_a_ray_job_stopped_before_its_command_exits_with_the_signals_status_and_one_line(tmp_path, who, signum):
    """A stop while ops/ray-job still sets up (here: while `pipeline.launch use-profile` imports): `ray job stop`,
    SIGINT to the driver and every process below it, as Ray's job supervisor sends it; a head pod's preStop hook,
    SIGTERM to the driver alone. The step stops, the job ends as a stopped one (128 + the signal) saying so, not
    with a traceback and "cannot start" (2), and neither the next step nor COMMAND starts: nothing is kept."""
    repo = checkout(tmp_path / "checkout")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    shared = tmp_path / "shared"
    env = services.clean_env() | {"PATH": f"{BIN}:{os.environ['PATH']}", "CAPACITY_ATLAS_PROFILE": "separations",
                                  "CAPACITY_ATLAS_STORAGE": str(shared)}
    job = subprocess.Popen([str(repo / "ops/ray-job"), "true"], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, preexec_fn=default_stop_signals)
    deadline, setup = time.monotonic() + 60, None
    while setup is None and job.poll() is None and time.monotonic() < deadline:
        for child in psutil.Process(job.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error, OSError):
                # numpy mapped: pipeline.launch is importing its settings (a second of imports still to come)
                if "use-profile" in child.cmdline() and has_loaded(child.pid, "numpy"):
                    setup = child
        time.sleep(0.005)
    assert setup is not None, "ops/ray-job ended or hung before its setup could be stopped"
    driver = psutil.Process(job.pid)
    for process in [driver, *(driver.children(recursive=True) if who == "tree" else [])]:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(signum)
    out, err = job.communicate(timeout=60)
    assert job.returncode == 128 + signum, out + err
    assert f"ops/ray-job: stopped by {signum.name} before `true` started" in err and "Traceback" not in err, err
    assert "DVC:" not in out and "running `true`" not in err and not (shared / "outputs").exists(), out + err


@pytest.mark.slow
@pytest.mark.integration
def test_jobs_share_dvcs_state_reuse_the_datasets_and_push_their_results_as_an_experiment(tmp_path):
    """Two jobs in fresh checkouts of one upstream (pods of the image, Ray jobs' copies), with the storage they share:
    the first generates the datasets, saves its workspace as a DVC experiment and pushes it; the second restores the
    datasets from the shared DVC cache instead of generating them again; a teammate's clone pulls the experiment into
    `dvc exp show`. (`dvc repro generate`: the sweep's part of DVC's state is the same files.)"""
    src = copy_repo(tmp_path / "src", tasks=["lis"])  # one generate stage, not one per task
    upstream, first = upstream_and_clone(src, tmp_path)
    shared, remote = tmp_path / "shared", tmp_path / "dvc-remote"
    remote.mkdir()
    env = {"CAPACITY_ATLAS_PROFILE": "tiny", "CAPACITY_ATLAS_STORAGE": str(shared),
           "CAPACITY_ATLAS_DVC_REMOTE": str(remote), "CAPACITY_ATLAS_GIT_REMOTE": "origin",
           "GIT_AUTHOR_NAME": "job", "GIT_AUTHOR_EMAIL": "job@t", "GIT_COMMITTER_NAME": "job",
           "GIT_COMMITTER_EMAIL": "job@t"}

    def job(checkout: Path) -> subprocess.CompletedProcess:
        copy_kernels(src, checkout)
        done = run([str(checkout / "ops/ray-job"), "dvc", "repro", "generate"], checkout, **env)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done

    made = job(first)
    output = made.stdout + made.stderr
    assert "Running stage 'generate@lis'" in output
    name = re.search(r"experiment (tiny-\S+) pushed to git remote 'origin'", output)[1]
    second = tmp_path / "second"
    subprocess.run(["git", "clone", "-q", str(upstream), str(second)], check=True)
    (second / ".venv").symlink_to(Path(sys.executable).parent.parent)
    again = job(second)
    output = again.stdout + again.stderr
    assert "Running stage 'generate@" not in output and "is cached - skipping run" in output, output[-3000:]
    for data in (first / "data").rglob("*.parquet"):
        assert (second / data.relative_to(first)).read_bytes() == data.read_bytes()
    teammate = tmp_path / "teammate"
    subprocess.run(["git", "clone", "-q", str(upstream), str(teammate)], check=True)
    assert run(["dvc", "exp", "pull", "origin", name], teammate).returncode == 0
    shown = run(["dvc", "exp", "show", "--json"], teammate)  # the table the same, whole, whatever the width
    assert name in shown.stdout, shown.stdout + shown.stderr


# ---- the Slurm batch script


def test_the_sbatch_script_stops_before_starting_anything_on_bad_input(tmp_path):
    repo = checkout(tmp_path / "checkout")
    fake = tmp_path / "slurm"
    script = str(repo / SBATCH)

    def sbatch(**extra: str) -> subprocess.CompletedProcess:
        identity = {f"GIT_{who}_{key}": "t" for who in ("AUTHOR", "COMMITTER") for key in ("NAME", "EMAIL")}
        return subprocess.run(["bash", script], cwd=repo, env=slurm_env(fake, repo, **identity | extra),
                              capture_output=True, text=True, timeout=120)

    # a GPU profile on an allocation without GPUs (no SLURM_GPUS_ON_NODE, no SLURM_GPUS_PER_NODE)
    done = sbatch(CAPACITY_ATLAS_PROFILE="paper")
    assert done.returncode == 2, done.stderr
    assert "error: AllocationError: the Slurm allocation cannot hold one trial of profile 'paper'" in done.stderr
    assert "#SBATCH --gpus-per-node=N" in done.stderr
    # too few CPUs a node for its trial
    done = sbatch(CAPACITY_ATLAS_PROFILE="paper", SLURM_GPUS_PER_NODE="h100:4", SLURM_CPUS_PER_TASK="2")
    assert done.returncode == 2 and "at least 4 CPUs per node" in done.stderr, done.stderr
    # an unknown profile, no allocation, no checkout
    done = sbatch(CAPACITY_ATLAS_PROFILE="huge", SLURM_GPUS_ON_NODE="4")
    assert done.returncode == 2 and "profile: 'huge' is not allowed" in done.stderr, done.stderr
    done = sbatch(SLURM_JOB_NODELIST="")
    assert done.returncode == 2 and "SLURM_JOB_NODELIST is not set" in done.stderr
    done = sbatch(SLURM_SUBMIT_DIR=str(tmp_path))
    assert done.returncode == 2 and "is not a checkout of the pipeline" in done.stderr
    # the default command's experiment is a commit: no git identity is named before anything starts
    home = tmp_path / "home"
    home.mkdir()
    done = sbatch(HOME=str(home), GIT_CONFIG_NOSYSTEM="1", GIT_AUTHOR_NAME="", GIT_AUTHOR_EMAIL="")
    assert done.returncode == 2, done.stderr
    assert "git has no user.name here, and a job's experiment is a commit (dvc exp run)" in done.stderr
    assert not (fake / "srun.log").exists()  # no step ever started
    assert profile_of(repo / "params.yaml") == profile_of(ROOT / "params.yaml")  # nor was the profile set


def ray_processes(fake: Path) -> list[psutil.Process]:
    """The processes the stand-in srun started (they, and Ray's processes under them, carry its RAY_TMPDIR)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("RAY_TMPDIR", "").startswith(str(fake)):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


STOPPABLE = """
import os, pathlib, signal, subprocess, sys, time
out = pathlib.Path(sys.argv[1])
who = sys.argv[2] if len(sys.argv) > 2 else "driver"
def stop(signum, frame):
    (out / who).write_text(signal.Signals(signum).name)
    sys.exit(128 + signum)
signal.signal(signal.SIGINT, stop)
signal.signal(signal.SIGTERM, stop)
if who == "driver":  # as dvc runs its stage: a child in its process group, which a stop must reach too
    subprocess.Popen([sys.executable, __file__, str(out), "stage"])
    while not (out / "stage-running").exists():
        time.sleep(0.1)
(out / f"{who}-running").write_text(str(os.getpgid(0)))
time.sleep(600)
"""


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.skipif(NO_NAMESPACES is not None, reason=f"needs network namespaces: {NO_NAMESPACES}")
def test_the_sbatch_script_starts_a_token_authenticated_ray_cluster_runs_the_driver_and_stops_it(tmp_path):
    """The job as Slurm runs it, three times: the driver ends (its status is the job's); Slurm's notice before the time
    limit (SIGUSR1 to the batch shell, --signal=B:USR1@300) stops the driver's whole process group, SIGINT first, and
    then the job requeues itself; a SIGTERM (scancel) stops it without a requeue. Ray is gone each time, and its ports
    and temp dir are the job's own; the temp dir is removed from each node, but where the driver failed."""
    repo = checkout(tmp_path / "checkout")
    fake = Path(tempfile.mkdtemp(prefix="sb-", dir="/tmp"))  # short: Ray's socket paths live under it
    shared = tmp_path / "shared"
    env = slurm_env(fake, repo, SLURM_GPUS_ON_NODE="2", CAPACITY_ATLAS_PROFILE="paper",
                    MLFLOW_TRACKING_URI="http://127.0.0.1:5000", CAPACITY_ATLAS_STORAGE=str(shared),
                    CAPACITY_ATLAS_RAY_ARGS="--object-store-memory=100000000", CAPACITY_ATLAS_WAIT_SECONDS="90")
    seen = tmp_path / "driver.json"
    stoppable = tmp_path / "stoppable.py"
    stoppable.write_text(STOPPABLE)
    stopped: dict[str, tuple] = {}
    try:
        with services.network_namespace(tmp_path / "netns.log") as netns:
            done = subprocess.run(netns.command(["bash", str(repo / SBATCH), sys.executable, "-c", DRIVER,
                                                 str(seen)]),
                                  cwd=repo, env=env, capture_output=True, text=True, timeout=300)
            left = ray_processes(fake)
            kept = [(fake / node).is_dir() for node in NODES]
            (fake / "srun.log").rename(fake / "first-srun.log")
            for notice in (signal.SIGUSR1, signal.SIGTERM):
                state = tmp_path / notice.name
                state.mkdir()
                job = subprocess.Popen(netns.command(["bash", str(repo / SBATCH), sys.executable, str(stoppable),
                                                      str(state)]),
                                       cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                deadline = time.monotonic() + 240
                while not (state / "driver-running").exists() and job.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.5)
                job.send_signal(notice)
                out, err = job.communicate(timeout=240)
                requeued = (fake / "scontrol.log").read_text() if (fake / "scontrol.log").exists() else ""
                stopped[notice.name] = (job.returncode, out, err, state, requeued, ray_processes(fake))
                assert not any((fake / node).exists() for node in NODES), (notice.name, err)  # temp dirs removed
        assert done.returncode == 3, done.stdout[-3000:] + done.stderr[-5000:]  # the driver's status
        driver = json.loads(seen.read_text())
        assert {n["ip"] for n in driver["nodes"]} == {"127.0.0.1", "127.0.0.2"}
        assert all(n["cpu"] == 4 and n["gpu"] == 2 for n in driver["nodes"]), driver["nodes"]
        port = 20000 + 2 * (42 % 5000)  # the job's own (SLURM_JOB_ID 42), not Ray's 6379 another job may hold
        assert driver["env"] == {"RAY_ADDRESS": f"127.0.0.1:{port}", "RAY_AUTH_MODE": "token",
                                 "MLFLOW_TRACKING_URI": "http://127.0.0.1:5000", "CAPACITY_ATLAS_STORAGE": str(shared)}
        assert driver["token"] and Path(driver["cwd"]) == repo
        # the profile sized the allocation's check; a COMMAND of one's own runs as given, the checkout untouched
        assert profile_of(repo / "params.yaml") == profile_of(ROOT / "params.yaml")
        assert "CAPACITY_ATLAS_PROFILE=paper sized the allocation's check; `" in done.stderr
        assert "capacity-atlas.sbatch: job 42, start 1," in done.stderr  # each start says so in the appended log
        steps = (fake / "first-srun.log").read_text().splitlines()
        assert [re.search(r"--nodelist=(\S+)", s)[1] for s in steps] == ["127.0.0.1", "127.0.0.2"]
        assert all("--cpus-per-task=4" in s and "ray start --block" in s for s in steps)
        assert all(f"--temp-dir=/tmp/ray-42 --dashboard-agent-listen-port={port + 1}" in s for s in steps)
        assert all("--min-worker-port=0 --max-worker-port=0" in s for s in steps)
        assert f"--head --port={port}" in steps[0] and f"--address=127.0.0.1:{port}" in steps[1]
        assert not left, [p.cmdline() for p in left]  # Ray stopped on both nodes
        # the driver failed: Ray's logs stay on each node, and the log says where
        assert kept == [True, True] and "Ray's logs are kept in /tmp/ray-42 on each node" in done.stderr
        code, out, err, state, requeued, left = stopped["SIGUSR1"]
        assert code == 143 and "the time limit is near (SIGUSR1): stopping, then requeueing" in err, out + err
        # the driver and its stage, one process group, had SIGINT while Ray was still up; then the job requeued
        assert (state / "driver").read_text() == (state / "stage").read_text() == "SIGINT"
        assert requeued == "requeue 42\n" and "requeued job 42" in err and not left
        code, out, err, state, requeued, left = stopped["SIGTERM"]
        assert code == 143 and "stopping (SIGTERM)" in err, out + err
        assert (state / "driver").read_text() == (state / "stage").read_text() == "SIGINT"
        assert requeued == "requeue 42\n" and not left  # no second requeue
    finally:
        for proc in ray_processes(fake):  # only if the script failed to stop them
            proc.kill()
        shutil.rmtree(fake, ignore_errors=True)


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.skipif(NO_NAMESPACES is not None, reason=f"needs network namespaces: {NO_NAMESPACES}")
def test_two_jobs_of_two_profiles_from_one_checkout_each_end_with_their_own_table(tmp_path):
    """Two Slurm jobs submitted at once from one checkout, each with its profile (tiny; a tiny with two seeds) on a
    two-node Ray of its own: each runs its default command, its own DVC experiment in a temporary copy, and ends
    with its own table (1 cell, 2 cells) in its experiment and its own MLflow run, the sweeps one after the other
    (the project's stores); neither writes a file of the checkout."""
    repo = copy_repo(tmp_path / "repo", NARROW, tasks=["lis"])
    conf = repo / "conf"
    (conf / "tiny-seeds.yaml").write_text((conf / "tiny.yaml").read_text().replace("seeds: [0]", "seeds: [0, 1]"))
    for cmd in (["git", "config", "user.name", "t"], ["git", "config", "user.email", "t@t"], ["git", "add", "-A"],
                ["git", "commit", "-qm", "a second profile"]):  # experiments are commits
        subprocess.run(cmd, cwd=repo, check=True)
    made = run(["dvc", "repro", "generate"], repo)  # the datasets once: both experiments take them from DVC's cache
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    before = {name: (repo / name).read_bytes() for name in ("params.yaml", "dvc.lock")}
    jobs, fakes = {}, []
    try:
        with services.network_namespace(tmp_path / "netns.log") as netns:
            for job, profile in (("41", "tiny"), ("42", "tiny-seeds")):
                fake = Path(tempfile.mkdtemp(prefix=f"sb{job}-", dir="/tmp"))  # short: Ray's socket paths
                fakes.append(fake)
                env = slurm_env(fake, repo, SLURM_JOB_ID=job, CAPACITY_ATLAS_PROFILE=profile,
                                CAPACITY_ATLAS_WAIT_SECONDS="120",
                                CAPACITY_ATLAS_RAY_ARGS="--object-store-memory=100000000")  # fmt: skip
                jobs[profile] = subprocess.Popen(netns.command(["bash", str(repo / SBATCH)]), cwd=repo, env=env,
                                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            ended = {profile: (job.communicate(timeout=600), job.returncode) for profile, job in jobs.items()}
    finally:
        for job in jobs.values():
            if job.poll() is None:
                job.kill()
        for fake in fakes:
            for proc in ray_processes(fake):
                proc.kill()
            shutil.rmtree(fake, ignore_errors=True)
    for profile, ((out, err), code) in ended.items():
        assert code == 0, f"{profile}:\n{out[-3000:]}\n{err[-5000:]}"
    names = {"tiny": "tiny-41-1", "tiny-seeds": "tiny-seeds-42-1"}
    for profile, name in names.items():
        assert f"running `dvc exp run --temp --name {name} -S profile={profile}`" in ended[profile][0][1]
    assert {name: (repo / name).read_bytes() for name in before} == before  # the checkout's files untouched
    shown = json.loads(run(["dvc", "exp", "show", "--json"], repo).stdout)
    tables = {rev["name"]: rev["data"]["metrics"]["results/sweep.json"]["data"]["cells"]
              for commit in shown for exp in commit.get("experiments") or [] for rev in exp["revs"]}
    assert tables == {"tiny-41-1": 1, "tiny-seeds-42-1": 2}
    _, parents, _ = mlflow_runs(repo)
    assert sorted(p.data.tags["dvc_experiment"] for p in parents) == sorted(names.values())
    assert all(p.info.status == "FINISHED" for p in parents)


def test_the_sbatch_script_requeues_itself_at_its_time_limit_and_says_how_to_keep_its_nodes_to_itself():
    text = (ROOT / SBATCH).read_text()
    assert {"--requeue", "--open-mode=append", "--signal=B:USR1@300"} <= set(re.findall(r"(?m)^#SBATCH (\S+)", text))
    assert "--exclusive" in text  # said when jobs may share nodes


def test_an_allocation_without_scontrol_is_named_before_anything_starts(tmp_path):
    repo = checkout(tmp_path / "checkout")
    fake = tmp_path / "slurm"
    env = slurm_env(fake, repo, CAPACITY_ATLAS_PROFILE="laptop")
    (fake / "bin" / "scontrol").unlink()
    plain = ":".join(p for p in env["PATH"].split(":") if not (Path(p) / "scontrol").exists())
    done = subprocess.run(["bash", str(repo / SBATCH)], cwd=repo, env=env | {"PATH": plain}, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "scontrol is not on the PATH" in done.stderr, done.stderr
    assert not (fake / "srun.log").exists()


def test_the_sbatch_defaults_are_a_gpu_job_of_one_ray_node_per_slurm_node():
    directives = dict(re.findall(r"(?m)^#SBATCH --([\w-]+)=(\S+)", (ROOT / SBATCH).read_text()))
    assert directives["ntasks-per-node"] == "1"  # one `ray start` a node, given the node's CPUs and GPUs
    nodes, cpus, gpus = (int(directives[k]) for k in ("nodes", "cpus-per-task", "gpus-per-node"))
    assert check_slurm(load_config(profile="paper"), nodes, cpus, gpus) == nodes * min(cpus // 4, gpus)


@pytest.mark.slow  # over 10 s on 2 cores: the fast tier stays a developer's loop
def test_dvc_state_shares_the_cluster_cache_between_users_and_nodes(tmp_path, monkeypatch):
    """``python -m pipeline.launch dvc-state`` with a shared cache: DVC's own config of the checkout points at it,
    group-writable, linked instead of copied, its site cache on this node's disk; and, where the cache lies on a
    network filesystem (NFS stood in for: /proc/mounts is the machine's), a lock that needs no flock."""
    from pipeline.launch import job

    repo = copy_repo(tmp_path / "repo")
    cache = tmp_path / "shared-cache"
    said = job.dvc_state({job.DVC_CACHE: str(cache)}, repo)
    assert said.startswith(f"DVC: cache {cache}; shared (cache.shared group, cache.type reflink,hardlink,symlink,copy")
    config = (repo / ".dvc" / "config.local").read_text()
    assert f"dir = {cache}" in config and "shared = group" in config and "reflink,hardlink,symlink,copy" in config
    assert f"site_cache_dir = {tempfile.gettempdir()}/dvc-site-{os.getuid()}" in config
    assert "hardlink_lock" not in config  # this disk is local
    monkeypatch.setattr(job, "mount_type", lambda path: "nfs4" if path == cache else "ext4")
    assert "core.hardlink_lock true" in job.dvc_state({job.DVC_CACHE: str(cache)}, repo)
    assert "hardlink_lock = true" in (repo / ".dvc" / "config.local").read_text()


def test_every_launch_subcommand_has_its_entry_in_the_table_and_no_other():
    from pipeline.launch.commands import COMMANDS, parser

    choices = next(a.choices for a in parser()._actions if a.dest == "command")
    assert set(choices) == set(COMMANDS)
