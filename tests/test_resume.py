"""Sweeps that survive kills, for real: `dvc repro` on a small tiny-profile sweep (a local Ray, SQLite MLflow) is
(a) run through, (b) killed with SIGKILL, driver and all, mid-sweep and rerun, (c) left running while one Ray
worker is SIGKILLed. (b) and (c) must end exactly as (a), with one MLflow run per trial holding the whole curve."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from tests.helpers import KILLABLE_SWEEP
from tests.helpers.repo import copy_repo, mlflow_runs, run

pytestmark = [pytest.mark.slow, pytest.mark.integration]

SAME = ["status", "reason", "final_accuracy", "val_accuracy", "train_steps", "train_pflops"]


def start(cmd: list[str], cwd: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # its own process group: killed as a cluster node dies


def checkpoints(repo: Path) -> list[dict]:
    metas = []
    for m in (repo / "ray_results").glob("*/*/checkpoint_*/meta.json"):
        with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):  # Tune removing an old one, or writing
            metas.append(json.loads(m.read_text()))
    return metas


def checkpoint_counts(repo: Path) -> list[int]:
    """Checkpoints in storage of each trial directory of every sweep."""
    return [len(list(d.glob("checkpoint_*"))) for d in (repo / "ray_results").glob("*/*-lr*") if d.is_dir()]


def newest_steps(repo: Path) -> dict[str, int]:
    """trial key -> the step of its newest checkpoint in storage."""
    newest: dict[str, int] = {}
    for meta in checkpoints(repo):
        newest[meta["trial_key"]] = max(newest.get(meta["trial_key"], 0), meta["step"])
    return newest


def wait_for(condition, what: str, timeout: float = 300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if value := condition():
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def trials(repo: Path) -> pd.DataFrame:
    return pd.read_csv(repo / "results" / "trials.csv").set_index(["arch", "lr"]).sort_index()


def assert_one_whole_run_per_trial(repo: Path, reference: Path) -> None:
    """Under the newest parent: one FINISHED child per trial, whose validation curve has every step the
    uninterrupted run's has; nothing left RUNNING anywhere."""
    client, parents, children = mlflow_runs(repo)
    assert not [r for r in parents + children if r.info.status == "RUNNING"]
    newest = max(parents, key=lambda r: r.info.start_time)
    mine = [c for c in children if c.data.tags["mlflow.parentRunId"] == newest.info.run_id]
    assert sorted(c.data.tags["trial_key"] for c in mine) == sorted(set(c.data.tags["trial_key"] for c in mine))
    assert all(c.info.status == "FINISHED" for c in mine) and len(mine) == 2
    ref_client, _, ref_children = mlflow_runs(reference)
    for child in mine:
        twin = next(c for c in ref_children if c.data.tags["trial_key"] == child.data.tags["trial_key"])
        steps = sorted({m.step for m in client.get_metric_history(child.info.run_id, "val_accuracy")})
        assert steps == sorted({m.step for m in ref_client.get_metric_history(twin.info.run_id, "val_accuracy")})


def test_killed_dvc_repro_resumes_its_trials_and_closes_its_runs(uninterrupted, tmp_path):
    reference, whole_seconds = uninterrupted
    repo = copy_repo(tmp_path, KILLABLE_SWEEP)
    assert run(["dvc", "repro", "generate"], repo).returncode == 0
    began = time.time()
    first = start(["dvc", "repro"], repo)
    lock = repo / "results" / ".sweep.lock"
    wait_for(lambda: lock.exists() and lock.read_text(), "the sweep stage to start")
    second = run(["dvc", "repro"], repo)  # the same checkout, at the same time
    assert second.returncode != 0 and "lock" in (second.stdout + second.stderr).lower()
    direct = run([sys.executable, "-m", "pipeline.sweep"], repo)
    assert direct.returncode == 2 and "another sweep is running" in direct.stderr
    wait_for(lambda: any(m["step"] >= 20 for m in checkpoints(repo)), "a checkpoint at step 20")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    print(f"\nkilled at step {max(m['step'] for m in checkpoints(repo))} of 1600")
    assert not (repo / "results" / "trials.csv").exists()
    _, parents, children = mlflow_runs(repo)
    assert [r.info.status for r in parents] == ["RUNNING"]  # what a dead driver leaves
    assert checkpoints(repo)
    assert max(checkpoint_counts(repo)) <= 3  # sweep.checkpoints_to_keep, and one still being copied

    result = run(["dvc", "repro"], repo)
    total = time.time() - began
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    print(f"\nkill-and-resume: {total:.1f} s in all, against {whole_seconds:.1f} s uninterrupted")
    got, want = trials(repo), trials(reference)
    assert (got.resumed_step >= 20).any()  # continued, not restarted
    pd.testing.assert_frame_equal(got[SAME], want[SAME])
    client, parents, children = mlflow_runs(repo)
    killed = [r for r in parents if r.info.status == "KILLED"]
    assert len(killed) == 1 and "driver process died" in killed[0].data.tags["reason"]
    assert_one_whole_run_per_trial(repo, reference)
    assert not any(checkpoint_counts(repo))  # finished: the rerun's checkpoints and the killed sweep's are gone


def test_a_killed_ray_worker_is_retried_from_its_checkpoint(uninterrupted, tmp_path):
    reference, _ = uninterrupted
    repo = copy_repo(tmp_path, KILLABLE_SWEEP)
    assert run(["dvc", "repro", "generate"], repo).returncode == 0
    sweep = start(["dvc", "repro"], repo)
    # whichever trial the killed worker runs has a checkpoint at step 60 or later, so Tune has taken one at step 40
    # or later (a trial starting a second after the other had none yet when the first reached step 40)
    wait_for(lambda: len(newest := newest_steps(repo)) == 2 and min(newest.values()) >= 60,
             "a checkpoint at step 60 of both trials")
    workers = wait_for(lambda: [p for p in psutil.Process(sweep.pid).children(recursive=True)
                                if "ray::ImplicitFunc" in " ".join(p.cmdline())], "a Ray trial worker of this sweep")
    workers[0].kill()
    out, _ = sweep.communicate(timeout=900)
    assert sweep.returncode == 0, out[-3000:]
    got, want = trials(repo), trials(reference)
    assert got.restarts.sum() == 1 and (got.resumed_step >= 40).sum() == 1
    pd.testing.assert_frame_equal(got[SAME], want[SAME])
    client, parents, children = mlflow_runs(repo)
    assert [c.data.tags.get("restarts") for c in children].count("1") == 1
    assert_one_whole_run_per_trial(repo, reference)
    assert not any(checkpoint_counts(repo))


def test_finished_trials_keep_their_checkpoints_only_when_asked(uninterrupted):
    reference, _ = uninterrupted  # sweep.keep_checkpoints: true; the tests above run with the default, false
    assert sorted(checkpoint_counts(reference)) == [2, 2]  # sweep.checkpoints_to_keep of each trial
