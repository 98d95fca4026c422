"""Ray job submission as docs/cluster.md gives it: a real head with its job server on 127.0.0.1 of a network
namespace, token authentication on (tests/helpers/services.py), an MLflow server beside it, and `ray job submit
--working-dir <a git copy of this checkout> -- ops/ray-job dvc repro` running the tiny pipeline as the
job's driver; `ray job logs`, `ray job status` and `ray job stop` on real jobs; and the mistakes a submitter makes,
each stopped with a named error."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from pipeline.tracking.services import JOB_CONFIG_ENV, ServiceError, check_job_paths, submitted_job
from tests.helpers import services
from tests.helpers.repo import copy_repo

NO_NAMESPACES = services.namespace_problem()
RAY = str(Path(sys.executable).parent / "ray")
# where `ray job submit` runs: ship the working directory's .git, which Ray 2.60 leaves out by default
WITH_GIT = {"RAY_OVERRIDE_RUNTIME_ENV_DEFAULT_EXCLUDES": ".venv,venv,__pycache__"}
ENDED = {"succeeded": "SUCCEEDED", "failed": "FAILED", "was stopped": "STOPPED"}  # how `ray job status` says it
# one trial of 8 steps: the job runs every stage of the pipeline, and little else
SWEEP = """sweep:
  grid:
    architectures: [standard]
    widths: [8]
    datasets: {lis: [3]}"""


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    """A one-node cluster whose head runs the job server (2 CPUs: a trial and a job's driver), an MLflow server in
    its namespace, and a git copy of this checkout to submit, with an ignored .venv that must not travel."""
    tmp = tmp_path_factory.mktemp("jobs")
    repo = copy_repo(tmp / "checkout", SWEEP, tasks=["lis"])  # one generate stage, not one per task
    (repo / ".venv").mkdir()
    (repo / ".venv" / "big").write_bytes(bytes(1 << 20))
    with services.ray_cluster(tmp / "ray", nodes=1, cpus_per_node=2, job_server=True) as cluster, \
            services.mlflow_server(tmp / "mlflow", cluster.netns) as server:
        yield cluster, server, repo, tmp


def on_a_head(test):
    """The marks of a test that submits to ``head``: it needs root for the network namespace."""
    for mark in (pytest.mark.cluster, pytest.mark.integration,
                 pytest.mark.skipif(bool(NO_NAMESPACES), reason=f"needs network namespaces: {NO_NAMESPACES}")):
        test = mark(test)
    return test


def ray_job(cluster: services.RayCluster, *args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    """`ray job ARGS...` as a submitter with the cluster's address and token runs it (``env`` on top)."""
    return subprocess.run(cluster.command([RAY, "job", *args]), env=cluster.driver_env(**env), capture_output=True,
                          text=True, timeout=timeout)


def status(cluster: services.RayCluster, job: str) -> str:
    """The job's status (RUNNING, SUCCEEDED, ...) as `ray job status` words it."""
    out = ray_job(cluster, "status", job)
    assert out.returncode == 0, out.stderr[-2000:]
    if running := re.search(rf"Status for job '{job}': (\w+)", out.stdout):
        return running[1]
    ended = [name for words, name in ENDED.items() if f"Job '{job}' {words}" in out.stdout]
    assert len(ended) == 1, out.stdout
    return ended[0]


def env_vars(**values: str) -> str:
    """`--runtime-env-json`'s value: the job's environment."""
    return json.dumps({"env_vars": values})


@on_a_head
@pytest.mark.slow
def test_a_submitted_dvc_repro_runs_the_pipeline_on_the_cluster_and_keeps_its_outputs(head):
    cluster, server, repo, tmp = head
    shared = tmp / "shared"
    started = time.monotonic()
    submit = ray_job(cluster, "submit", "--submission-id", "atlas-tiny", "--working-dir", str(repo),
                     "--runtime-env-json", env_vars(CAPACITY_ATLAS_PROFILE="tiny", MLFLOW_TRACKING_URI=server.uri,
                                                    CAPACITY_ATLAS_STORAGE=str(shared)),
                     "--", "ops/ray-job", "dvc", "repro", timeout=600, **WITH_GIT)
    took = time.monotonic() - started
    assert submit.returncode == 0, submit.stdout[-4000:] + submit.stderr[-3000:]
    assert "Job 'atlas-tiny' succeeded" in submit.stdout + submit.stderr
    assert status(cluster, "atlas-tiny") == "SUCCEEDED"
    logs = ray_job(cluster, "logs", "atlas-tiny")
    assert logs.returncode == 0
    # the driver's output: the entrypoint, DVC's stages, the sweep joined to this cluster, the outputs kept
    assert f"running `dvc repro` on profile tiny with RAY_ADDRESS={cluster.address}" in logs.stdout, logs.stdout[-3000:]
    for stage in ("generate@lis", "sweep", "report"):  # the only generate stage
        assert f"Running stage '{stage}'" in logs.stdout
    assert f"outputs kept in {shared}/outputs/tiny-" in logs.stdout
    # what the job made outlives its working directory: the outputs on the storage, the runs on the server
    kept = [d for d in (shared / "outputs").iterdir() if d.name.startswith("tiny-")]
    assert len(kept) == 1
    assert {"params.yaml", "dvc.lock", "results", "report"} <= {p.name for p in kept[0].iterdir()}
    assert (kept[0] / "report" / "index.html").is_file() and (kept[0] / "results" / "sweep.csv").is_file()

    def runs():
        client = MlflowClient(server.uri)
        return client.search_runs([client.get_experiment_by_name("capacity-atlas").experiment_id])

    recorded = server.netns.call(runs)
    parents = [r for r in recorded if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in recorded if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 1 and children[0].info.status == "FINISHED"
    assert parents[0].data.params["ray"] == cluster.address  # the job's driver joined this cluster, no local Ray
    # the working directory traveled with its .git (DVC and the runs' commit need it), not with the ignored .venv
    head_sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    assert parents[0].data.tags["mlflow.source.git.commit"] == head_sha
    package = re.search(r"Uploading package gcs://(_ray_pkg_\w+)\.zip", submit.stderr)[1]
    where = f"session_*/runtime_resources/working_dir_files/{package}"
    (unpacked,) = {p.resolve() for p in cluster.head_temp.glob(where)}  # session_latest links to the session
    assert (unpacked / ".git").is_dir() and not (unpacked / ".venv").exists()
    print(f"`ray job submit ... dvc repro` on tiny: {took:.1f} s")


@on_a_head
def test_ray_job_stop_stops_a_running_driver_and_its_processes_and_keeps_its_outputs(head):
    """A driver that would wait 10 minutes for a second node (`python -m pipeline.launch wait`, joined to the cluster
    with the job's token), run by the entrypoint, is stopped by `ray job stop` with the stop settings docs/cluster.md
    gives a job (SIGINT, time to stop): status STOPPED, its processes gone, its outputs kept whole."""
    cluster, _, repo, tmp = head
    shared = tmp / "shared-stopped"
    submit = ray_job(cluster, "submit", "--no-wait", "--submission-id", "atlas-wait", "--working-dir", str(repo),
                     "--runtime-env-json", env_vars(CAPACITY_ATLAS_PROFILE="tiny", CAPACITY_ATLAS_STORAGE=str(shared),
                                                    RAY_JOB_STOP_SIGNAL="SIGINT", RAY_JOB_STOP_WAIT_TIME_S="60"),
                     "--", "ops/ray-job", "python", "-m", "pipeline.launch", "wait", "--nodes", "2",
                     "--timeout", "600", **WITH_GIT)
    assert submit.returncode == 0, submit.stderr[-3000:]

    def driver() -> list[psutil.Process]:
        found = []
        for pid in cluster.pids():
            with contextlib.suppress(psutil.NoSuchProcess):
                # the driver itself: not ops/ray-job or the runner, whose command lines name it too
                if psutil.Process(pid).cmdline()[1:4] == ["-m", "pipeline.launch", "wait"]:
                    found.append(psutil.Process(pid))
        return found

    deadline = time.monotonic() + 60
    while not (status(cluster, "atlas-wait") == "RUNNING" and driver()):
        assert time.monotonic() < deadline, ray_job(cluster, "logs", "atlas-wait").stdout
        time.sleep(0.5)
    stop = ray_job(cluster, "stop", "atlas-wait")
    assert stop.returncode == 0, stop.stderr[-3000:]
    assert status(cluster, "atlas-wait") == "STOPPED"
    assert driver() == []
    assert (shared / "outputs").is_dir(), ray_job(cluster, "logs", "atlas-wait").stdout[-3000:]
    (kept,) = (shared / "outputs").iterdir()  # whole: renamed into place once copied (`keep`)
    assert kept.name.startswith("tiny-") and {"params.yaml", "dvc.lock"} <= {p.name for p in kept.iterdir()}


@on_a_head
def test_a_working_dir_without_its_git_is_named_before_anything_runs(head):
    """Ray leaves .git out of a working directory by default: the entrypoint says so and how to ship it."""
    cluster, _, repo, _ = head
    submit = ray_job(cluster, "submit", "--submission-id", "atlas-no-git", "--working-dir", str(repo),
                     "--", "ops/ray-job", "dvc", "repro", timeout=180)
    assert submit.returncode != 0 and status(cluster, "atlas-no-git") == "FAILED"
    logs = ray_job(cluster, "logs", "atlas-no-git").stdout
    assert "has no .git" in logs and "RAY_OVERRIDE_RUNTIME_ENV_DEFAULT_EXCLUDES=.venv,venv,__pycache__" in logs, logs
    assert "Running stage" not in logs


@on_a_head
@pytest.mark.slow
def test_a_sweep_whose_stores_are_in_the_jobs_working_dir_fails_with_a_named_error(head):
    """Without MLFLOW_TRACKING_URI and CAPACITY_ATLAS_STORAGE, the sweep's SQLite store and checkpoints would be in
    Ray's temporary copy of the working directory: the job fails before reading a dataset, saying so."""
    cluster, _, repo, _ = head
    submit = ray_job(cluster, "submit", "--submission-id", "atlas-local-stores", "--working-dir", str(repo),
                     "--", "python", "-m", "pipeline.sweep", timeout=180)
    assert submit.returncode != 0
    assert status(cluster, "atlas-local-stores") == "FAILED"
    logs = ray_job(cluster, "logs", "atlas-local-stores").stdout
    assert "this sweep runs as Ray job atlas-local-stores in Ray's temporary copy of its --working-dir" in logs, logs
    assert "MLFLOW_TRACKING_URI" in logs and "CAPACITY_ATLAS_STORAGE" in logs and "DatasetError" not in logs


@on_a_head
@pytest.mark.parametrize(("env", "error"), [
    ({"RAY_AUTH_TOKEN": "0" * 64}, "AuthenticationError: Authentication failed: Forbidden: Invalid authentication "
                                   "token"),
    ({"RAY_AUTH_MODE": "disabled"}, "AuthenticationError: Authentication required: Unauthorized: Missing "
                                    "authentication token"),
    # a head without the job server (`--include-dashboard=false`): nothing listens on its port
    ({"RAY_API_SERVER_ADDRESS": "http://127.0.0.1:8266"}, "ConnectionError: Failed to connect to Ray at address: "
                                                          "http://127.0.0.1:8266"),
], ids=["wrong token", "no token", "no job server"])
def test_a_submission_the_head_cannot_take_is_refused_with_a_named_error(head, env, error):
    cluster, _, repo, _ = head
    submit = ray_job(cluster, "submit", "--working-dir", str(repo), "--", "true", **env)
    assert submit.returncode != 0 and error in submit.stderr, submit.stderr[-3000:]


def job_env(root: Path, job: str = "raysubmit_1") -> dict[str, str]:
    """A job driver's environment as Ray's job supervisor sets it, for a working directory unpacked at ``root``."""
    config = {"runtime_env": {"working_dir": f"gcs://{root.name}.zip"}, "metadata": {"job_submission_id": job}}
    return {JOB_CONFIG_ENV: json.dumps(config)}


def test_a_jobs_temporary_working_dir_is_recognised_and_only_it(tmp_path, monkeypatch):
    root = tmp_path / "working_dir_files" / "_ray_pkg_0123456789abcdef"
    root.mkdir(parents=True)
    assert submitted_job(root) is None  # not a job
    monkeypatch.setenv(JOB_CONFIG_ENV, job_env(root, "atlas-7")[JOB_CONFIG_ENV])
    assert submitted_job(root) == "atlas-7"
    assert submitted_job(tmp_path / "a-checkout") is None  # a job that runs a checkout of the head's: kept
    with pytest.raises(ServiceError, match=r"Ray job atlas-7 .*MLflow store sqlite:///.*and the storage .*ray_results"):
        check_job_paths(f"sqlite:///{root / 'mlflow.db'}", str(root / "ray_results"), root)
    with pytest.raises(ServiceError, match="storage") as err:
        check_job_paths("http://mlflow:5000", str(root / "results" / ".." / "ray_results"), root)
    assert "MLflow" not in str(err.value)
    check_job_paths("http://mlflow:5000", str(tmp_path / "shared"), root)
    check_job_paths("http://mlflow:5000", "s3://bucket/atlas", root)
    check_job_paths(f"sqlite:///{tmp_path / 'mlflow.db'}", str(tmp_path / "shared"), root)
