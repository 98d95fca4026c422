"""DVC's experiments that run in a temporary copy of the checkout (`dvc exp run --temp`, and `--queue` then
`dvc queue start`): the copy, `.dvc/tmp/exps/...`, is deleted once DVC has collected the experiment, so the sweep
must keep its MLflow runs, checkpoints and what it reuses in the project's stores. Real DVC, Ray and SQLite MLflow
on a narrowed tiny profile."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.repo import copy_repo, mlflow_runs, run

pytestmark = [pytest.mark.slow, pytest.mark.integration]

# one width, two architectures at most: 2 cells per architecture (arithmetic 2, lis 3)
NARROW = "sweep: {architectures: [standard], widths: [8], max_failures: 0}"


def queue_status(repo: Path, until, timeout: float = 600) -> str:
    """`dvc queue status`, once ``until`` holds for it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = run(["dvc", "queue", "status"], repo).stdout
        if until(status):
            return status
        time.sleep(2)
    raise AssertionError(f"the queue did not get there in {timeout} s:\n{status}")


def start_queue(repo: Path, workers: int, log: Path) -> None:
    """`dvc queue start -j workers`; its workers outlive it, with its output written to ``log`` (a pipe would
    stay open until they end)."""
    with log.open("a") as out:
        subprocess.run(["dvc", "queue", "start", "-j", str(workers)], cwd=repo, stdout=out, stderr=out, check=True,
                       env=os.environ | {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"})


def test_queued_and_temp_experiments_keep_their_results_in_the_projects_stores(tmp_path):
    """`dvc exp run --temp` trains the standard cells; two queued experiments (standard + lstm, lstm alone) run
    by `dvc queue start -j 2`. All three sweeps land in the project's one MLflow store, one after the other (never
    two local Rays at once, each claiming every core); each trial trains once: the queue reuses the temporary
    run's standard cells, and whichever queued sweep ran second the first's lstm cells. Nothing points into the
    deleted copies: artifacts, checkpoints and published datasets are under the project."""
    repo = copy_repo(tmp_path / "repo", NARROW)
    for key, value in (("user.name", "t"), ("user.email", "t@t")):  # experiments are commits
        subprocess.run(["git", "config", key, value], cwd=repo, check=True)
    temp = run(["dvc", "exp", "run", "--temp", "--name", "alone"], repo)
    assert temp.returncode == 0, temp.stdout[-3000:] + temp.stderr[-3000:]
    for name, archs in (("both", "[standard,lstm]"), ("lstm", "[lstm]")):
        queued = run(["dvc", "exp", "run", "--queue", "--name", name, "-S", f"sweep.architectures={archs}"], repo)
        assert queued.returncode == 0, queued.stderr[-2000:]
    try:
        # the second worker once the first runs: DVC's workers starting at the same instant can lose one to a race
        # in its file broker (treeverse/dvc-task#73)
        start_queue(repo, 1, tmp_path / "queue.log")
        queue_status(repo, lambda status: "Running" in status)
        start_queue(repo, 2, tmp_path / "queue.log")
        status = queue_status(repo, lambda status: "Queued" not in status and "Running" not in status)
    finally:
        run(["dvc", "queue", "stop"], repo)
    logs = {name: run(["dvc", "queue", "logs", name], repo).stdout for name in ("both", "lstm")}
    assert status.count("Success") == 2, status + "\n".join(log[-3000:] for log in logs.values())
    # both ran at once, and their sweeps took turns
    assert sum("sweep: waiting for the sweep training against this project's stores" in log for log in logs.values()) \
        == 1, "\n".join(log[-3000:] for log in logs.values())
    assert (repo / "mlflow.db").is_file()  # the project's store, not the copies'

    # the project's one store holds the three sweeps, each tagged with its DVC experiment
    client, parents, children = mlflow_runs(repo)
    by_exp = {p.data.tags.get("dvc_experiment"): p for p in parents}
    assert sorted(by_exp) == ["alone", "both", "lstm"] and all(p.info.status == "FINISHED" for p in parents)
    spans = sorted((p.info.start_time, p.info.end_time) for p in parents)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:])), spans  # one sweep at a time
    of = {p.info.run_id: p.data.tags["dvc_experiment"] for p in parents}
    trained = [c for c in children if "reused_from" not in c.data.tags]
    assert sorted(c.data.tags["trial_key"] for c in trained) == sorted({c.data.tags["trial_key"] for c in children})
    assert len(trained) == 4  # 2 standard (alone), 2 lstm (the first queued sweep): each trial once
    assert {of[c.data.tags["mlflow.parentRunId"]] for c in trained if "-standard-" in c.info.run_name} == {"alone"}
    first, second = (of[p.info.run_id] for p in sorted((by_exp["both"], by_exp["lstm"]),
                                                         key=lambda p: p.info.start_time))
    lstm_runs = [c for c in trained if "-lstm-" in c.info.run_name]
    assert {of[c.data.tags["mlflow.parentRunId"]] for c in lstm_runs} == {first}
    reused = {c.data.tags["trial_key"] for c in children if of[c.data.tags["mlflow.parentRunId"]] == second}
    assert reused == {c.data.tags["trial_key"] for c in lstm_runs} | ({c.data.tags["trial_key"] for c in trained
                                                                         if "-standard-" in c.info.run_name}
                                                                        if second == "both" else set())

    # nothing the sweeps keep lies in DVC's temporary copies, which are gone
    assert not list((repo / ".dvc" / "tmp" / "exps").glob("**/mlflow.db"))
    experiment = client.get_experiment_by_name("capacity-atlas")
    assert experiment.artifact_location == (repo / "mlartifacts").as_uri()
    assert all(r.info.artifact_uri.startswith(experiment.artifact_location) for r in parents + children)
    assert {p.name for p in (repo / "ray_results").iterdir()} >= {"datasets"}
    assert len([p for p in (repo / "ray_results").iterdir() if p.name.startswith("tiny-")]) == 2  # 2 sweeps trained
    # and DVC kept each experiment's own results (its metrics, in its experiment commit)
    shown = json.loads(run(["dvc", "exp", "show", "--json"], repo).stdout)
    metrics = {rev["name"]: rev["data"]["metrics"]["results/sweep.json"]["data"]
               for commit in shown for exp in commit.get("experiments") or [] for rev in exp["revs"]}
    assert {name: m["cells"] for name, m in metrics.items()} == {"alone": 2, "both": 4, "lstm": 2}
