"""The services a sweep needs, checked before any compute: the MLflow store (a server, or an SQLite file) and, for a
sweep submitted as a Ray job, stores that outlive the job's temporary working directory (the Ray head is checked by
``pipeline.scheduling.cluster.check_ray``). Every problem is a ``ServiceError`` that names the address and what to
do. ``ui_link``: where MLflow's UI shows a run.

A server with authentication (``mlflow server --app-name basic-auth``) gets the credentials MLflow's client sends
(``MLFLOW_TRACKING_USERNAME`` and ``MLFLOW_TRACKING_PASSWORD``, or ``MLFLOW_TRACKING_TOKEN``): a server that refuses
them, or that lets this user read but not write the sweep's experiment, is named here rather than at the sweep's
first run.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import tempfile
import urllib.parse
from collections.abc import Callable
from pathlib import Path, PurePosixPath


class ServiceError(RuntimeError):
    """MLflow or Ray cannot be reached or used; the message names the address."""


EXPERIMENT_KIND = "mlflow.experimentKind"  # the tag MLflow's UI reads (model training, or GenAI)
MODEL_TRAINING = "custom_model_development"  # its value for an experiment of training runs


def check_mlflow(uri: str, experiment: str | None = None) -> None:
    """Fail fast, before any compute, on a store that cannot work: a server that does not answer, serves no
    tracking API, refuses this client's credentials or will not let it write to ``experiment``; an SQLite store
    that cannot be read and written."""
    if uri.startswith(("http://", "https://")):
        check_server(uri, experiment)
    elif uri.startswith("sqlite:///"):
        check_sqlite(uri, Path(uri.removeprefix("sqlite:///")))
    else:
        raise ServiceError(
            f"MLflow tracking URI {uri!r}: use sqlite:///path/to/mlflow.db or http(s)://server "
            "(the file store is deprecated)"
        )


def check_server(uri: str, experiment: str | None) -> None:
    # MLflow's client here, not at the top: importing it takes a second, and the stages' command lines import
    # ServiceError to name a bad setting before anything heavy loads
    from mlflow.exceptions import MlflowException
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request

    creds = get_default_host_creds(uri)  # the client's own credentials and TLS settings

    def call(method: str, endpoint: str, **kwargs):
        try:  # no retries: MLflow's client retries an unavailable server with backoff for minutes
            return http_request(creds, endpoint, method, max_retries=0, timeout=10, raise_on_status=False, **kwargs)
        except MlflowException as err:
            raise ServiceError(
                f"MLflow server at {uri} is unreachable ({err.message}); start it with `mlflow "
                "server` or unset MLFLOW_TRACKING_URI / cluster.mlflow_tracking_uri"
            ) from None

    check_tracking_api(call, uri, creds)
    if experiment is not None:
        check_experiment_writable(call, uri, creds, experiment)


def check_tracking_api(call: Callable, uri: str, creds) -> None:
    """The server answers, serves MLflow's tracking API, takes these credentials and this Host header, and lets them
    read experiments."""
    health = call("GET", "/health")
    if health.status_code != 200:
        raise ServiceError(f"MLflow server at {uri} answered /health with HTTP {health.status_code}")
    # /health also answers on a server started with --artifacts-only, and without credentials on one with
    # authentication: ask the tracking API itself
    search = call("GET", "/api/2.0/mlflow/experiments/search", params={"max_results": 1})
    if search.status_code == 401:
        raise ServiceError(
            f"MLflow server at {uri} refuses the credentials: it was sent {sender(creds)} (HTTP 401). "
            f"{CREDENTIALS_HELP}"
        )
    if search.status_code == 403 and "Invalid Host header" in search.text:
        host = urllib.parse.urlsplit(uri).netloc
        raise ServiceError(
            f"MLflow server at {uri} refuses the Host header {host!r} (HTTP 403: MLflow's check against DNS "
            f"rebinding, which allows only localhost and private IPs by default): start it with --allowed-hosts "
            f"naming the host and port its clients use, e.g. `mlflow server ... --allowed-hosts {host}`"
        )
    if search.status_code == 403:
        raise ServiceError(f"MLflow server at {uri}: {sender(creds)} may not read its experiments (HTTP 403)")
    if search.status_code != 200:
        raise ServiceError(
            f"MLflow server at {uri} serves no tracking API: searching experiments answered HTTP "
            f"{search.status_code} ({search.text.strip()[:300]})"
        )


def check_experiment_writable(call: Callable, uri: str, creds, experiment: str) -> None:
    """These credentials may write to ``experiment``, where it exists (whoever may log in may create one)."""
    found = call("GET", "/api/2.0/mlflow/experiments/get-by-name", params={"experiment_name": experiment})
    if found.status_code == 404:
        return  # no experiment yet: whoever may log in may create one, and owns it
    if found.status_code != 200:
        raise ServiceError(
            f"MLflow server at {uri}: looking up experiment {experiment!r} with {sender(creds)} answered HTTP "
            f"{found.status_code} ({found.text.strip()[:300]})"
        )
    exp = found.json()["experiment"]
    kind = {t["key"]: t["value"] for t in exp.get("tags", [])}.get(EXPERIMENT_KIND, MODEL_TRAINING)
    # the experiment tag the sweep sets anyway (``runs.start_parent``), written as it is: a write that changes
    # nothing, refused exactly where the sweep's runs would be
    tag = {"experiment_id": exp["experiment_id"], "key": EXPERIMENT_KIND, "value": kind}
    written = call("POST", "/api/2.0/mlflow/experiments/set-experiment-tag", json=tag)
    if written.status_code == 403:
        raise ServiceError(
            f"MLflow server at {uri}: {sender(creds)} may read experiment {experiment!r} (id "
            f"{exp['experiment_id']}) but not write to it (HTTP 403): its owner or an admin must grant this user "
            "EDIT on it, or set sweep.runs.experiment to a new experiment"
        )


CREDENTIALS_HELP = (
    "Give the driver an account of the server: MLFLOW_TRACKING_USERNAME=<user> and MLFLOW_TRACKING_PASSWORD=<password> "
    "(or MLFLOW_TRACKING_TOKEN=<token>); on `mlflow server --app-name basic-auth` its admin creates users"
)


def sender(creds) -> str:
    """Which credentials a request carried, never their secret."""
    if creds.username:
        return f"user {creds.username!r} (MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD)"
    if creds.token:
        return "a token (MLFLOW_TRACKING_TOKEN)"
    return "no credentials (MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD are unset)"


SQLITE_PROBLEMS = {
    "file is not a database": "is not an SQLite database",
    "attempt to write a readonly database": "is read-only",
    "unable to open database file": "cannot be opened (unreadable?)",
    "database is locked": "stayed locked by another process for 10 s",
}


def check_sqlite(uri: str, path: Path) -> None:
    where = f"MLflow SQLite store {uri}"
    if not path.parent.is_dir():
        raise ServiceError(f"{where}: directory {path.parent} does not exist")
    try:  # SQLite creates the store, and its journal at every write, beside it
        tempfile.TemporaryFile(dir=path.parent).close()
    except OSError as err:
        raise ServiceError(
            f"{where}: directory {path.parent} is read-only ({err.strerror}); SQLite must create files there"
        ) from None
    if not path.exists():
        return  # MLflow creates it
    if not path.is_file():
        raise ServiceError(f"{where}: {path} is not a file")
    try:
        with contextlib.closing(sqlite3.connect(path, timeout=10)) as db:
            db.execute("BEGIN IMMEDIATE")  # the write lock
            db.execute("CREATE TABLE capacity_atlas_probe (x)")  # a real write, never committed
            db.rollback()
    except sqlite3.Error as err:
        raise ServiceError(f"{where}: {path} {SQLITE_PROBLEMS.get(str(err), 'cannot be written')} ({err})") from None


JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # what Ray's job supervisor gives a job's driver: its runtime_env


def submitted_job(root: Path) -> str | None:
    """The submission id of the Ray job whose temporary copy of its ``--working-dir`` ``root`` is, else None. Ray
    unpacks a job's working directory (``gcs://_ray_pkg_<hash>.zip``) into ``.../_ray_pkg_<hash>/`` on the head and
    starts the job's driver there."""
    try:
        job = json.loads(os.environ.get(JOB_CONFIG_ENV) or "{}")
    except json.JSONDecodeError:
        return None
    uri = str((job.get("runtime_env") or {}).get("working_dir") or "")
    package = PurePosixPath(uri.partition("://")[2]).stem
    if not package or package not in root.resolve().parts:
        return None
    return str((job.get("metadata") or {}).get("job_submission_id") or "?")


def check_job_paths(mlflow_uri: str, storage: str, root: Path) -> None:
    """A sweep submitted with ``ray job submit --working-dir`` runs in Ray's copy of that directory, which Ray deletes
    (with its session, or sooner once its cache of working directories is full): an MLflow SQLite store or a storage
    path inside it would lose the sweep's runs and checkpoints, and a worker node would not see the storage at all."""
    job = submitted_job(root)
    if job is None:
        return
    inside = []
    if mlflow_uri.startswith("sqlite:///"):
        path = Path(mlflow_uri.removeprefix("sqlite:///")).resolve()
        if path.is_relative_to(root.resolve()):
            inside.append(f"the MLflow store {mlflow_uri} (set MLFLOW_TRACKING_URI to an MLflow server)")
    if "://" not in storage and Path(storage).resolve().is_relative_to(root.resolve()):
        inside.append(f"the storage {storage} (set CAPACITY_ATLAS_STORAGE to a path every node sees, or s3://...)")
    if inside:
        raise ServiceError(
            f"this sweep runs as Ray job {job} in Ray's temporary copy of its --working-dir ({root}), which Ray "
            f"deletes, and {' and '.join(inside)} would go with it: give them to the job with `ray job submit "
            "--runtime-env-json '{\"env_vars\": {...}}'` (docs/cluster.md#submitting-a-job)"
        )


def ui_link(uri: str, experiment_id: str, run_id: str | None = None) -> str:
    """Where MLflow's UI shows an experiment's runs (or one run), for a server URI; for a local store, the path to
    open in ``mlflow ui --backend-store-uri <store>``. MLflow 3's UI opens every experiment in its GenAI view unless
    the address asks for model training (its toggle remembers a reader's choice, not the experiment's kind)."""
    base = uri.rstrip("/") if uri.startswith(("http://", "https://")) else ""
    run = f"/runs/{run_id}" if run_id else ""
    return f"{base}/#/experiments/{experiment_id}{run}?workflowType=machine_learning"
