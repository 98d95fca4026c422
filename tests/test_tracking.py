"""check_mlflow: every store that cannot work is a named ServiceError before any compute. ChildRuns: every trial
gets its run, whatever order Tune's events come in."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import types
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from pipeline.common.provenance import git_commit
from pipeline.tracking.runs import ChildRuns
from pipeline.tracking.services import ServiceError, check_mlflow
from tests.helpers import make_cell

# what `mlflow server --artifacts-only` (MLflow 3.17) answers on /api/2.0/mlflow/experiments/search, with HTTP 503
ARTIFACTS_ONLY = ("Endpoint: /api/2.0/mlflow/experiments/search disabled due to the mlflow server running in "
                  "`--artifacts-only` mode. To enable tracking server functionality, run `mlflow server` without "
                  "`--artifacts-only`")


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[None]:
    """``path`` (a file or a directory) read-only even for root, who ignores permission bits: the immutable flag
    where the filesystem has one, else the permission bits; skips the test when neither holds."""
    mode = path.stat().st_mode
    immutable = subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0
    if not immutable:
        path.chmod(mode & ~0o222)
        if os.access(path, os.W_OK):
            path.chmod(mode)
            pytest.skip("cannot make a path read-only here (root without chattr)")
    try:
        yield
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        else:
            path.chmod(mode)


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("store") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()  # creates MLflow's tables: seconds
    return path


@pytest.fixture
def store(empty_store, tmp_path) -> Path:
    """A real MLflow SQLite store, its tables created, alone in its directory."""
    return Path(shutil.copy(empty_store, tmp_path / "mlflow.db"))


def test_a_working_sqlite_store_passes_and_keeps_no_trace_of_the_probe(store, tmp_path):
    check_mlflow(f"sqlite:///{store}")
    check_mlflow(f"sqlite:///{tmp_path / 'new.db'}")  # MLflow creates it
    with contextlib.closing(sqlite3.connect(store)) as db:
        assert not db.execute("select name from sqlite_master where name like 'capacity%'").fetchall()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlflow.db"]


def test_an_unusable_sqlite_store_is_named(store, tmp_path):
    def fails(path: Path, match: str) -> None:
        with pytest.raises(ServiceError, match=f"MLflow SQLite store sqlite:///{path}: {match}"):
            check_mlflow(f"sqlite:///{path}")

    fails(tmp_path / "nowhere" / "mlflow.db", f"directory {tmp_path / 'nowhere'} does not exist")
    (tmp_path / "notes.db").write_text("not a database\n" * 100)
    fails(tmp_path / "notes.db", f"{tmp_path / 'notes.db'} is not an SQLite database")
    (tmp_path / "folder.db").mkdir()
    fails(tmp_path / "folder.db", f"{tmp_path / 'folder.db'} is not a file")
    with read_only(store):
        fails(store, f"{store} is read-only")
    with read_only(tmp_path):  # the store itself writable, but not its journal beside it; nor a new store
        fails(store, f"directory {tmp_path} is read-only")
        fails(tmp_path / "new.db", f"directory {tmp_path} is read-only")


@contextlib.contextmanager
def server(api_status: int) -> Iterator[str]:
    """A stand-in MLflow server on loopback: /health answers 200, the tracking API ``api_status`` (503 with the
    real message is what `mlflow server --artifacts-only` answers)."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            status, body = (200, "OK") if self.path == "/health" else \
                (api_status, '{"experiments": []}' if api_status == 200 else ARTIFACTS_ONLY)
            self.send_response(status)
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_server_that_answers_health_but_serves_no_tracking_api_is_named():
    with server(200) as uri:
        check_mlflow(uri)
    with server(503) as uri:
        with pytest.raises(ServiceError, match=f"MLflow server at {uri} serves no tracking API: searching experiments "
                                               "answered HTTP 503 \\(Endpoint: .* `--artifacts-only` mode"):
            check_mlflow(uri)
        with pytest.raises(ServiceError, match=f"MLflow server at {uri}/prefix answered /health with HTTP 503"):
            check_mlflow(uri + "/prefix")
    with pytest.raises(ServiceError, match="MLflow server at http://127.0.0.1:9 is unreachable"):
        check_mlflow("http://127.0.0.1:9")


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory):
    """A real `mlflow server --app-name basic-auth` on 127.0.0.1, as docs/cluster.md starts a shared one: users
    created by its admin, and the Host headers it answers listed (its name and port as clients reach it)."""
    from tests.helpers.services import mlflow_server

    hosts = "mlflow.example.org:*,127.0.0.1:*"
    with mlflow_server(tmp_path_factory.mktemp("shared"), auth=True, options=("--allowed-hosts", hosts)) as server:
        yield server


@pytest.fixture
def no_credentials(monkeypatch):
    for env in [e for e in os.environ if e.startswith("MLFLOW_TRACKING_")]:
        monkeypatch.delenv(env)
    return monkeypatch


@pytest.mark.slow
@pytest.mark.integration
def test_a_basic_auth_server_takes_the_credentials_from_the_environment_and_a_refusal_is_named(shared_server,
                                                                                               no_credentials):
    """No credentials, or a wrong password, is named before anything else; a user's runs carry its name; another
    user, who may read the first one's experiment (basic-auth's default) but not write to it, is named too, until
    granted EDIT."""
    import requests

    from pipeline.tracking.runs import start_parent

    server, env = shared_server, no_credentials
    for user in ("alice", "bob"):
        created = requests.post(f"{server.uri}/api/2.0/mlflow/users/create", auth=server.admin, timeout=30,
                                json={"username": user, "password": f"{user}-secret-1"})
        assert created.status_code == 200, created.text
    with pytest.raises(ServiceError, match=f"MLflow server at {server.uri} refuses the credentials: it was sent "
                                           "no credentials .* \\(HTTP 401\\)"):
        check_mlflow(server.uri, "shared")
    env.setenv("MLFLOW_TRACKING_USERNAME", "alice")
    env.setenv("MLFLOW_TRACKING_PASSWORD", "not-her-password")
    with pytest.raises(ServiceError, match="refuses the credentials: it was sent user 'alice'") as refused:
        check_mlflow(server.uri, "shared")
    assert "not-her-password" not in str(refused.value)
    env.setenv("MLFLOW_TRACKING_PASSWORD", "alice-secret-1")
    check_mlflow(server.uri, "shared")  # no such experiment yet: alice may create it
    client, parent = start_parent(server.uri, "shared", "sweep", params={"p": 1}, tags={})
    assert client.get_run(parent).data.tags["mlflow.user"] == "alice"  # the UI's User: the account, not the login
    env.setenv("MLFLOW_TRACKING_USERNAME", "bob")
    env.setenv("MLFLOW_TRACKING_PASSWORD", "bob-secret-1")
    experiment = client.get_experiment_by_name("shared")
    with pytest.raises(ServiceError, match=f"user 'bob' .* may read experiment 'shared' \\(id "
                                           f"{experiment.experiment_id}\\) but not write to it \\(HTTP 403\\)"):
        check_mlflow(server.uri, "shared")
    assert MlflowClient(server.uri).get_experiment(experiment.experiment_id).tags == experiment.tags
    granted = requests.post(f"{server.uri}/api/3.0/mlflow/users/permissions/grant", auth=server.admin, timeout=30,
                            json={"username": "bob", "resource_type": "experiment",
                                  "resource_id": experiment.experiment_id, "permission": "EDIT"})
    assert granted.status_code == 200, granted.text
    check_mlflow(server.uri, "shared")
    _, theirs = start_parent(server.uri, "shared", "sweep", params={}, tags={})
    assert MlflowClient(server.uri).get_run(theirs).data.tags["mlflow.user"] == "bob"


@pytest.mark.slow
@pytest.mark.integration
def test_a_server_reached_by_a_host_it_does_not_allow_is_named_with_the_option_to_allow_it(shared_server,
                                                                                          no_credentials):
    """MLflow 3's server answers /health to any Host header but its API only to the hosts --allowed-hosts lists:
    reached as localhost, which the list leaves out, the check names the host and the option; a listed name gets
    through to the API (which then asks for credentials)."""
    import requests

    port = shared_server.uri.rsplit(":", 1)[1]
    with pytest.raises(ServiceError, match=f"refuses the Host header 'localhost:{port}' .* "
                                           f"--allowed-hosts localhost:{port}"):
        check_mlflow(f"http://localhost:{port}")
    listed = requests.get(f"{shared_server.uri}/api/2.0/mlflow/experiments/search", params={"max_results": 1},
                          headers={"Host": "mlflow.example.org:5000"}, timeout=30)
    assert listed.status_code == 401  # past the host check


def test_a_trial_that_dies_while_starting_gets_its_run_at_its_first_event(store, tmp_path):
    """Tune calls on_trial_recover (or on_trial_error) without on_trial_start for a trial whose actor dies while
    starting (a killed Ray worker): its restart and its failure are recorded on a run of its own."""
    client = MlflowClient(f"sqlite:///{store}")
    experiment = client.create_experiment("e")
    parent = client.create_run(experiment).info.run_id
    cell = make_cell("lis", 250, "standard", 64, 2, 0, name="lis-250-standard-w64", cell_id="c1", run_key="k",
                     max_len=600)
    config = {"cell": asdict(cell), "train": {"lr": 1e-3}, "trial_key": "c1/lr"}
    trial = types.SimpleNamespace(trial_id="t1", config=config, error_file=None)
    callback = ChildRuns(client, experiment, parent, "tiny")
    callback.on_trial_recover(0, [], trial)
    callback.on_trial_start(0, [], trial)  # the retry starts: the same run goes on
    callback.on_trial_recover(0, [], trial)
    callback.on_trial_error(0, [], trial)
    callback.on_experiment_end([])
    runs = client.search_runs([experiment], "tags.cell_id = 'c1'")
    assert len(runs) == 1 and runs[0].info.run_id == callback.by_key["c1/lr"]
    assert runs[0].data.tags["restarts"] == "2" and runs[0].data.tags["status"] == "failed"
    assert runs[0].info.status == "FAILED"


def test_the_sweeps_experiment_is_declared_model_training_so_the_ui_opens_on_its_runs(tmp_path):
    from pipeline.tracking.runs import EXPERIMENT_KIND, start_parent

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    older = client.create_experiment("made-before", artifact_location=(tmp_path / "a").as_uri())  # no kind yet
    for name in ("new", "made-before"):
        _, parent = start_parent(uri, name, "sweep", params={}, tags={})
        assert client.get_experiment_by_name(name).tags[EXPERIMENT_KIND] == "custom_model_development"
    assert client.get_experiment(older).tags[EXPERIMENT_KIND] == "custom_model_development"
    tags = client.get_run(parent).data.tags  # MLflow's standard tags on the parent too
    assert tags["mlflow.user"] and tags["mlflow.source.git.commit"] == git_commit().sha


def test_the_progress_line_counts_a_sweep_and_the_parent_run_follows_it(store):
    """SweepProgress over a real searcher (no Ray) and a real SQLite store: the line says finished/planned (at
    most every cell x learning rate), solved, running, failed, elapsed and time left; the parent run's metrics
    follow every change; in a log the line is printed every ``every`` seconds and at the end."""
    import io

    from pipeline.common.cell import Cell
    from pipeline.scheduling.console import Counts, SweepProgress, line
    from pipeline.search.frontier import GridPlan
    from pipeline.search.searcher import CellSearcher
    from pipeline.tracking.writer import RunWriter
    from tests.helpers import make_cell

    cells = {c: make_cell(*c, cell_id=f"id{c.width}", lrs=(0.1, 0.01)) for c in
             (Cell("lis", 4, "standard", w, 2, 0) for w in (16, 32, 64))}
    reused = {("id16", 0.1): {"status": "solved", "val_accuracy": 0.95, "reused_from": "run0"}}
    searcher = CellSearcher(GridPlan(cells), cells, {}, lambda cell, lr: reused.get((cell.cell_id, lr)),
                            cost=lambda cell: cell.width)
    client = MlflowClient(f"sqlite:///{store}")
    parent = client.create_run(client.create_experiment("progress")).info.run_id
    out = io.StringIO()
    writer = RunWriter(client)
    progress = SweepProgress(searcher, writer, parent, every=3600, out=out)
    assert searcher.needs_training()
    progress.on_step_begin(0, [])
    assert Counts.of(searcher) == Counts(finished=1, planned=6, at_most=6, solved=1, running=0, failed=0, trained=0)
    assert out.getvalue().startswith("sweep: 1/6 trials | 1 solved | 0 running | 0 failed | ")
    assert out.getvalue().rstrip().endswith("time left unknown yet")
    for trial, status in (("t1", "solved"), ("t2", "unsolved")):
        searcher.suggest(trial)
        progress.on_step_begin(0, [])
        searcher.on_trial_complete(trial, {"final": True, "status": status, "val_accuracy": 0.5})
    searcher.suggest("t3")
    searcher.on_trial_complete("t3", None, error=True)
    searcher.suggest("t4")
    progress.on_experiment_end([])
    writer.flush()
    printed = out.getvalue().splitlines()
    assert len(printed) == 2 and printed[-1].startswith("sweep: 4/6 trials | 2 solved | 1 running | 1 failed | ")
    history = {m: [(x.step, x.value) for x in client.get_metric_history(parent, m)]
               for m in ("trials_finished", "trials_solved", "trials_running", "trials_failed")}
    assert history["trials_finished"][0] == (1, 1) and history["trials_finished"][-1] == (4, 4)
    assert history["trials_running"][-1] == (4, 1) and history["trials_failed"][-1] == (4, 1)
    assert history["trials_solved"][-1] == (4, 2)
    # a frontier plans as it goes: the bound is shown while it is above the plan; the time left once trials ended
    from ray import cloudpickle  # Tune pickles its callbacks when it starts: the console's must pickle

    copy = cloudpickle.loads(cloudpickle.dumps(SweepProgress(searcher, writer, parent)))  # the writer's thread too
    assert copy.stream is sys.stderr and copy.writer._thread is None
    text = line(Counts(finished=3, planned=5, at_most=40, solved=1, running=2, failed=0, trained=2), 120.0)
    assert text == "sweep: 3/5 trials (at most 40) | 1 solved | 2 running | 0 failed | 2m00s elapsed | ~2m00s left"


def test_a_fused_trials_members_each_have_the_run_a_separate_trial_would(store):
    """A fused trial (``sweep.resources.fuse``): a child run per member, named and parametrised by its own learning
    rate, each with its own curve and verdict from the trial's reports, all ended with the trial."""
    client = MlflowClient(f"sqlite:///{store}")
    experiment = client.create_experiment("fused")
    parent = client.create_run(experiment).info.run_id
    members = [{"lr": lr, "trial_key": key, "resume": None, "resume_step": None}
               for lr, key in ((1e-3, "k1"), (3e-3, "k3"))]
    trial = types.SimpleNamespace(trial_id="t1", error_file=None, config={
        "cell": asdict(make_cell(run_key="k")), "train": {"dropout": 0.0}, "members": members})
    children = ChildRuns(client, experiment, parent, "tiny")
    children.on_trial_start(0, [], trial)
    children.on_trial_result(0, [], trial, {"step": 10, "node": "n1", "members": [
        {"trial_key": "k1", "step": 10, "val_accuracy": 0.25}, {"trial_key": "k3", "step": 10, "val_accuracy": 0.5}]})
    children.on_trial_result(0, [], trial, {"step": 20, "node": "n1", "members": [  # k1 stopped at 10
        {"trial_key": "k3", "step": 20, "val_accuracy": 0.75}]})
    children.on_trial_result(0, [], trial, {"step": 20, "final": True, "node": "n1", "members": [
        {"trial_key": "k1", "step": 10, "status": "unsolved", "reason": "converged", "fused_members": 2},
        {"trial_key": "k3", "step": 20, "status": "undecided", "reason": "budget", "fused_members": 2}]})
    children.on_trial_complete(0, [], trial)
    children.on_experiment_end([])
    curves = {}
    for key, lr, status, curve in (("k1", 1e-3, "unsolved", [(10, 0.25)]), ("k3", 3e-3, "undecided",
                                                                            [(10, 0.5), (20, 0.75)])):
        run = client.get_run(children.by_key[key])
        assert run.info.status == "FINISHED" and run.data.tags["status"] == status and run.data.tags["node"] == "n1"
        assert run.data.params["train.lr"] == str(lr) and run.info.run_name.endswith(f"-lr{lr:g}")
        assert run.data.metrics["fused_members"] == 2
        curves[key] = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "val_accuracy")]
        assert curves[key] == curve, key
    assert set(children.runs["t1"]) == {"k1", "k3"}


def test_a_trials_child_run_has_its_datasets_curve_system_metrics_and_verdict(store):
    """ChildRuns over a real SQLite store: the trial's train and test files are the run's dataset inputs (digest:
    the file's hash; context: the split), every report is a point of its curve, the system metrics it reports are
    MLflow system metrics, and the final report's verdict tags the run before it ends."""
    from pipeline.training.system import SystemSampler

    client = MlflowClient(f"sqlite:///{store}")
    experiment = client.create_experiment("lineage")
    parent = client.create_run(experiment).info.run_id
    cell = make_cell(sha256={"train_path": "a" * 64, "test_path": "b" * 64, "val_path": "c" * 64}, run_key="k")
    trial = types.SimpleNamespace(trial_id="t1", config={"cell": asdict(cell), "train": {"lr": 1e-3},
                                                         "trial_key": "c1/lr"}, error_file=None)
    children = ChildRuns(client, experiment, parent, "tiny")
    children.on_trial_start(0, [], trial)
    system = SystemSampler(gpu=False)
    for step in (10, 20):
        children.on_trial_result(0, [], trial, {"step": step, "val_accuracy": step / 40, "node": "n1"}
                                 | system.sample())
    children.on_trial_result(0, [], trial, {"step": 20, "final": True, "status": "unsolved", "reason": "converged",
                                            "final_accuracy": 0.4})
    children.on_trial_complete(0, [], trial)
    children.on_experiment_end([])
    run = client.get_run(children.by_key["c1/lr"])
    assert run.info.status == "FINISHED" and run.data.tags["status"] == "unsolved" and run.data.tags["node"] == "n1"
    # MLflow's standard tags, as its UI's User and Source columns read them
    assert run.data.tags["mlflow.user"] and run.data.tags["mlflow.source.type"] == "LOCAL"
    assert run.data.tags["mlflow.source.git.commit"] == git_commit().sha
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "val_accuracy")] == [
        (10, 0.25), (20, 0.5)]
    assert len(client.get_metric_history(run.info.run_id, "system/process_memory_rss_megabytes")) == 2
    assert 0 <= run.data.metrics["system/cpu_utilization_percentage"] <= 100
    inputs = {i.dataset.name: i for i in run.inputs.dataset_inputs}
    assert sorted(inputs) == ["lis-4-test", "lis-4-train", "lis-4-val"]
    train = inputs["lis-4-train"]
    assert train.dataset.digest == "a" * 16 and [t.value for t in train.tags] == ["train"]
    assert json.loads(train.dataset.profile) | {"split": "train", "profile": "tiny", "task": "lis", "size": 4} == \
        json.loads(train.dataset.profile)
    assert not children.writer.errors


def test_a_reused_trial_is_its_original_run_never_a_copy(store):
    """A later sweep takes a finished run as it is: the record names the original run, nothing is created under the
    new parent, and a copy an earlier version of the sweep made (tag ``reused_from``) is passed over for its
    original."""
    from pipeline.tracking.runs import reused_run

    client = MlflowClient(f"sqlite:///{store}")
    experiment = client.create_experiment("reuse")
    runs = []
    for extra in ({}, {"reused_from": "original"}):  # the original, then a newer copy of it
        sweep = client.create_run(experiment).info.run_id
        run = client.create_run(experiment, tags={"mlflow.parentRunId": sweep, "run_key": "k", "trial_key": "t",
                                                  "status": "solved", "reason": "solved at step 40"} | extra)
        client.log_metric(run.info.run_id, "final_accuracy", 0.95)
        client.set_terminated(run.info.run_id, "FINISHED")
        runs.append(run.info.run_id)
    original = runs[0]
    parent = client.create_run(experiment).info.run_id
    found = ChildRuns(client, experiment, parent, "tiny").finished("k")
    assert list(found) == ["t"] and found["t"].info.run_id == original
    record = reused_run(found["t"])
    assert record["mlflow_run_id"] == record["reused_from"] == original
    assert record["status"] == "solved" and record["final_accuracy"] == 0.95
    assert not client.search_runs([experiment], f"tags.mlflow.parentRunId = '{parent}'")


def test_the_writer_sends_in_order_merges_batches_and_keeps_what_failed(store):
    """RunWriter: a run's metrics and tags reach MLflow before its end, many small writes go out as few batches,
    a write MLflow refuses is kept in ``errors`` (and the rest still goes out), and it pickles without its thread."""
    from ray import cloudpickle

    from pipeline.tracking.writer import RunWriter

    client = MlflowClient(f"sqlite:///{store}")
    experiment = client.create_experiment("writer")
    runs = [client.create_run(experiment).info.run_id for _ in range(2)]
    calls = []
    log_batch = client.log_batch
    client.log_batch = lambda *a, **k: (calls.append(a[0]), log_batch(*a, **k))[1]  # counts the real calls
    writer = RunWriter(client)
    for step in range(1500):  # more than one batch can take: split at MLflow's limit
        writer.log(runs[0], {"loss": 1.0 / (step + 1)}, step=step)
    writer.log(runs[0], tags={"status": "solved"})
    writer.terminate(runs[0], "FINISHED")
    writer.log(runs[1], {"loss": 1.0}, params={"p": 1})
    writer.log(runs[1], params={"p": 2})  # a param changed: MLflow refuses it
    writer.terminate(runs[1], "FAILED")
    writer.flush()
    assert len(client.get_metric_history(runs[0], "loss")) == 1500
    assert client.get_run(runs[0]).info.status == "FINISHED" and client.get_run(runs[0]).data.tags["status"] == "solved"
    assert client.get_run(runs[1]).info.status == "FAILED"
    assert len(calls) <= 4, calls  # 1,500 metrics of one run in 2 batches, run 1's writes in 1 or 2
    assert len(writer.errors) == 1 and "param" in writer.errors[0].lower(), writer.errors
    copy = cloudpickle.loads(cloudpickle.dumps(writer))
    assert copy._thread is None and copy.errors == writer.errors


def test_a_resumed_trials_curve_comes_from_its_checkpoint_not_from_what_a_dead_driver_wrote(store):
    """A driver killed before its writer sent a run's last validations: the trial resumed from its checkpoint
    reports the validations the checkpoint holds, and its new run has each of them once (and the dead run's other
    curves up to the checkpoint)."""
    client = MlflowClient(f"sqlite:///{store}")
    experiment = client.create_experiment("resume")
    parent = client.create_run(experiment).info.run_id
    dead = client.create_run(experiment).info.run_id
    client.log_metric(dead, "val_accuracy", 0.1, step=10)  # step 20 was still queued when the driver died
    client.log_metric(dead, "train_loss", 2.0, step=10)
    cell = make_cell(run_key="k")
    trial = types.SimpleNamespace(trial_id="t1", error_file=None, config={
        "cell": asdict(cell), "train": {"lr": 1e-3}, "trial_key": "c1/lr", "resume": "/ckpt", "resume_step": 20})
    children = ChildRuns(client, experiment, parent, "tiny", killed={"c1/lr": dead})
    children.on_trial_start(0, [], trial)
    history = [{"step": 10, "loss": 2.5, "accuracy": 0.1}, {"step": 20, "loss": 2.0, "accuracy": 0.3}]
    children.on_trial_result(0, [], trial, {"step": 20, "val_accuracy": 0.3, "val_loss": 2.0, "history": history})
    children.on_trial_result(0, [], trial, {"step": 30, "val_accuracy": 0.5, "val_loss": 1.5})
    children.on_experiment_end([])
    run_id = children.by_key["c1/lr"]
    curve = [(m.step, m.value) for m in client.get_metric_history(run_id, "val_accuracy")]
    assert sorted(curve) == [(10, 0.1), (20, 0.3), (30, 0.5)]
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "train_loss")] == [(10, 2.0)]
    assert client.get_run(run_id).data.tags["resumed_from_run"] == dead


def test_tune_saves_a_note_for_the_searcher_and_a_restore_points_to_how_a_sweep_resumes(tmp_path, caplog):
    """Tune's save of the searcher writes where a sweep's state is (no "save not implemented" warning), and its
    restore, as Tuner.restore makes it, stops with how this pipeline resumes."""
    import logging

    from pipeline.scheduling.tuning import TuneSearcher
    from pipeline.search.frontier import GridPlan

    cells = {make_cell().cell: make_cell()}
    searcher = TuneSearcher(GridPlan(cells), cells, {}, lambda cell, lr: None, cost=lambda cell: 1.0)
    with caplog.at_level(logging.WARNING):
        searcher.save_to_dir(str(tmp_path), "s")
    assert "not implemented" not in caplog.text
    (note,) = tmp_path.iterdir()
    assert "dvc repro" in note.read_text() and "not Tuner.restore" in note.read_text()
    with pytest.raises(RuntimeError, match="cannot continue this sweep: a sweep resumes with `dvc repro`"):
        searcher.restore_from_dir(str(tmp_path))
