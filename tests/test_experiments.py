"""DVC's experiments that run in a temporary copy of the checkout (`dvc exp run --temp`, and `--queue` then
`dvc queue start`): the copy, `.dvc/tmp/exps/...`, is deleted once DVC has collected the experiment, so the sweep
must keep its MLflow runs, checkpoints and what it reuses in the project's stores. Real DVC, Ray and SQLite MLflow
on a narrowed tiny profile."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from pipeline.common.config import PROJECT, STORES_LOCK
from pipeline.common.locks import owned
from tests.helpers.repo import NARROW, copy_repo, mlflow_runs, pipeline_env, run

pytestmark = [pytest.mark.slow, pytest.mark.integration]

WAITING = "sweep: waiting for the sweep training against this project's stores"


def queue_status(repo: Path, until, timeout: float = 600) -> str:
    """`dvc queue status`, once ``until`` holds for it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = run(["dvc", "queue", "status"], repo).stdout
        if until(status):
            return status
        time.sleep(2)
    raise AssertionError(f"the queue did not get there in {timeout} s:\n{status}")


def queue_logs(repo: Path) -> dict[str, str]:
    return {name: run(["dvc", "queue", "logs", name], repo).stdout for name in ("both", "lstm")}


def waiting_sweeps(repo: Path) -> int:
    """How many running experiments' sweeps wait for the project's stores, read from their output as DVC writes it
    (`dvc queue logs` would start a DVC process per experiment and poll)."""
    outputs = (repo / ".dvc" / "tmp" / "exps" / "run").glob("*/*.out")
    return sum(WAITING in out.read_text(errors="replace") for out in outputs)


def start_queue(repo: Path, workers: int, log: Path) -> None:
    """`dvc queue start -j workers`; its workers outlive it, with its output written to ``log`` (a pipe would
    stay open until they end)."""
    with log.open("a") as out:
        subprocess.run(["dvc", "queue", "start", "-j", str(workers)], cwd=repo, stdout=out, stderr=out, check=True,
                       env=pipeline_env())


def test_queued_and_temp_experiments_keep_their_results_in_the_projects_stores(tmp_path):
    """`dvc exp run --temp` trains the standard cell; two queued experiments (standard + lstm, lstm alone) run at
    once by `dvc queue start -j 2`, their sweeps both waiting for the project's stores. All three sweeps land in the
    project's one MLflow store, one after the other (never two local Rays at once, each claiming every core); each
    trial trains once: the queue reuses the
    temporary run's standard cell, and whichever queued sweep ran second the first's lstm cell. Nothing points into
    the deleted copies: artifacts, checkpoints and published datasets are under the project."""
    # one generate stage: DVC checks each stage of every experiment
    repo = copy_repo(tmp_path / "repo", NARROW, tasks=["lis"])
    for key, value in (("user.name", "t"), ("user.email", "t@t")):  # experiments are commits
        subprocess.run(["git", "config", key, value], cwd=repo, check=True)
    # the datasets once, here, where this checkout's numba kernels are: the experiments take them from DVC's run
    # cache; and they stop after the sweep (their target), which is all this tests
    made = run(["dvc", "repro", "generate"], repo)
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    temp = run(["dvc", "exp", "run", "--temp", "--name", "alone", "sweep"], repo)
    assert temp.returncode == 0, temp.stdout[-3000:] + temp.stderr[-3000:]
    assert "Running stage 'generate" not in temp.stdout
    for name, archs in (("both", "[standard,lstm]"), ("lstm", "[lstm]")):
        queued = run(["dvc", "exp", "run", "--queue", "--name", name, "-S", f"sweep.grid.architectures={archs}",
                      "sweep"],
                     repo)
        assert queued.returncode == 0, queued.stderr[-2000:]
    stores = repo / STORES_LOCK.relative_to(PROJECT)
    try:
        # held here as by a sweep in progress: both queued sweeps, running at once, must wait for it, then take turns
        with owned(stores, "the test holds it"):
            # the second worker once the first runs: DVC's workers starting at the same instant can lose one to a
            # race in its file broker (treeverse/dvc-task#73)
            start_queue(repo, 1, tmp_path / "queue.log")
            queue_status(repo, lambda status: "Running" in status)
            start_queue(repo, 2, tmp_path / "queue.log")
            deadline = time.monotonic() + 300
            while waiting_sweeps(repo) < 2 and time.monotonic() < deadline:
                time.sleep(1)
        status = queue_status(repo, lambda status: "Queued" not in status and "Running" not in status)
    finally:
        run(["dvc", "queue", "stop"], repo)
    logs = queue_logs(repo)
    assert status.count("Success") == 2, status + "\n".join(log[-3000:] for log in logs.values())
    assert all(f"{WAITING} (pid " in log for log in logs.values()), "\n".join(log[-3000:] for log in logs.values())
    assert (repo / "mlflow.db").is_file()  # the project's store, not the copies'

    # the project's one store holds the three sweeps, each tagged with its DVC experiment
    client, parents, children = mlflow_runs(repo)
    by_exp = {p.data.tags.get("dvc_experiment"): p for p in parents}
    assert sorted(by_exp) == ["alone", "both", "lstm"] and all(p.info.status == "FINISHED" for p in parents)
    spans = sorted((p.info.start_time, p.info.end_time) for p in parents)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:])), spans  # one sweep at a time
    of = {p.info.run_id: p.data.tags["dvc_experiment"] for p in parents}
    # each trial trained once: standard by the --temp run, lstm by whichever queued sweep went first; the other
    # sweeps refer to those runs (their parents list them) rather than copy them
    trained = {c.info.run_id: (c.info.run_name.split("-")[1], of[c.data.tags["mlflow.parentRunId"]]) for c in children}
    first = min(("both", "lstm"), key=lambda name: by_exp[name].info.start_time)
    assert sorted(trained.values()) == [("lstm", first), ("standard", "alone")]
    reused = {}  # per sweep, the runs its parent lists as reused
    for name, parent in by_exp.items():
        if any(a.path == "tables/reused.json" for a in client.list_artifacts(parent.info.run_id, "tables")):
            listed = json.loads(Path(client.download_artifacts(parent.info.run_id, "tables/reused.json")).read_text())
            reused[name] = sorted(dict(zip(listed["columns"], row))["mlflow_run_id"] for row in listed["data"])
    by_arch = {arch: run_id for run_id, (arch, _) in trained.items()}
    expected = {"both": [by_arch["standard"]], "lstm": [by_arch["lstm"]]} if first == "both" else \
        {"both": sorted(by_arch.values())}
    assert reused == expected, (first, reused)

    # nothing the sweeps keep lies in DVC's temporary copies, which are gone
    experiment = client.get_experiment_by_name("capacity-atlas")
    assert experiment.artifact_location == (repo / "mlartifacts").as_uri()
    assert all(r.info.artifact_uri.startswith(experiment.artifact_location) for r in parents + children)
    assert {p.data.tags["checkout"] for p in parents} == {str(repo)}
    assert (repo / "ray_results" / "datasets").is_dir()  # the datasets the trials read, published
    assert len(list((repo / "ray_results").glob("tiny-*/lis3-*"))) == 2  # the two trials' directories
    # and DVC kept each experiment's own results (its metrics, in its experiment commit)
    shown = json.loads(run(["dvc", "exp", "show", "--json"], repo).stdout)
    metrics = {rev["name"]: rev["data"]["metrics"]["results/sweep.json"]["data"]
               for commit in shown for exp in commit.get("experiments") or [] for rev in exp["revs"]}
    assert {name: m["cells"] for name, m in metrics.items()} == {"alone": 1, "both": 2, "lstm": 1}
