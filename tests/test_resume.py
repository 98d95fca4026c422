"""Sweeps that survive kills, for real: `dvc repro` on a small tiny-profile sweep (a local Ray, SQLite MLflow) is
(a) run through, (b) killed with SIGKILL, driver and all, mid-sweep and rerun, (c) left running while one Ray
worker is SIGKILLed (a separate trial's, and a fused trial's), (d) stopped by SIGTERM to dvc, then by SIGTERM to
the runner the launchers start it with, and rerun, (e) killed on one host (a UTS namespace named node-a) and rerun
on another. (b) to (e) must end exactly as (a), with one MLflow run per trial holding the whole curve. A run that
goes to its end is `dvc repro sweep`: the report stage after it reads the tables compared here, and its own tests are
in tests/test_pipeline.py."""

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
from tests.helpers.repo import copy_generated, mlflow_runs, run

pytestmark = [pytest.mark.slow, pytest.mark.integration]

SAME = ["status", "reason", "final_accuracy", "val_accuracy", "train_steps", "train_pflops"]


def start(cmd: list[str], cwd: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # its own process group: killed as a cluster node dies


def checkpoints(repo: Path) -> list[dict]:
    """What each checkpoint in storage says of itself: a trial's, or each member's of a fused trial's."""
    metas = []
    for pattern in ("*/*/checkpoint_*/meta.json", "*/*/checkpoint_*/*/meta.json"):
        for m in (repo / "ray_results").glob(pattern):
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
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def trial_workers(proc: subprocess.Popen) -> list[psutil.Process]:
    """The Ray workers running trials under ``proc`` (a `dvc repro`)."""
    tree = psutil.Process(proc.pid).children(recursive=True)
    return [p for p in tree if "ray::ImplicitFunc" in " ".join(p.cmdline())]


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


def test_killed_dvc_repro_resumes_its_trials_and_closes_its_runs(uninterrupted, generated, tmp_path):
    reference, whole_seconds = uninterrupted
    repo = copy_generated(generated, tmp_path, KILLABLE_SWEEP)
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
    assert max(checkpoint_counts(repo)) <= 3  # sweep.runs.checkpoints_to_keep, and one still being copied

    result = run(["dvc", "repro", "sweep"], repo)
    total = time.time() - began
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    print(f"\nkill-and-resume: {total:.1f} s in all, against {whole_seconds:.1f} s uninterrupted")
    got, want = trials(repo), trials(reference)
    assert (got.resumed_step >= 20).any()  # continued, not restarted
    pd.testing.assert_frame_equal(got[SAME], want[SAME])
    client, parents, children = mlflow_runs(repo)
    killed = [r for r in parents if r.info.status == "KILLED"]
    assert len(killed) == 1 and "died before the sweep ended" in killed[0].data.tags["reason"]
    assert_one_whole_run_per_trial(repo, reference)
    assert not any(checkpoint_counts(repo))  # finished: the rerun's checkpoints and the killed sweep's are gone


def test_a_killed_ray_worker_is_retried_from_its_checkpoint(uninterrupted, generated, tmp_path):
    reference, _ = uninterrupted
    repo = copy_generated(generated, tmp_path, KILLABLE_SWEEP)
    sweep = start(["dvc", "repro", "sweep"], repo)
    # whichever trial the killed worker runs has a checkpoint at step 60 or later, so Tune has taken one at step 40
    # or later (a trial starting a second after the other had none yet when the first reached step 40)
    wait_for(lambda: len(newest := newest_steps(repo)) == 2 and min(newest.values()) >= 60,
             "a checkpoint at step 60 of both trials")
    wait_for(lambda: trial_workers(sweep), "a Ray trial worker of this sweep")[0].kill()
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
    reference, _ = uninterrupted  # sweep.runs.keep_checkpoints: true; the tests above run with the default, false
    assert sorted(checkpoint_counts(reference)) == [2, 2]  # sweep.runs.checkpoints_to_keep of each trial


def sweep_process(dvc: subprocess.Popen) -> psutil.Process:
    return wait_for(lambda: next((p for p in psutil.Process(dvc.pid).children(recursive=True)
                                  if "pipeline.sweep" in " ".join(p.cmdline())), None), "the sweep stage to start")


def ended(proc: psutil.Process) -> bool:
    """Gone, or dead and not yet reaped (an orphan waits for the container's init to reap it)."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def new_checkpoint(repo: Path, before: list[dict]) -> bool:
    seen = {(m["trial_key"], m["step"]) for m in before}
    return any((m["trial_key"], m["step"]) not in seen for m in checkpoints(repo))


def test_a_stopped_dvc_repro_closes_its_runs_as_killed_and_a_rerun_resumes(uninterrupted, generated, tmp_path):
    """Stopped twice, then run through: (1) SIGTERM to dvc alone, which passes no signal to its stage: the sweep stops
    as its parent dies; (2) started as the launchers start it (``python -m pipeline.common.signals -- dvc repro``),
    SIGTERM to that runner: SIGINT to the whole process group, which dvc waits out and the sweep stops on. Each stop
    closes the sweep's runs as KILLED with the reason, within the stop's bound; the last run ends as the
    uninterrupted one did."""
    reference, _ = uninterrupted
    repo = copy_generated(generated, tmp_path, KILLABLE_SWEEP)
    first = start(["dvc", "repro"], repo)
    stage = sweep_process(first)
    # both trials: each must continue at the end (a trial whose worker started later may not have saved yet)
    wait_for(lambda: len({m["trial_key"] for m in checkpoints(repo) if m["step"] >= 20}) == 2,
             "a checkpoint at step 20 of each trial")  # fmt: skip
    first.send_signal(signal.SIGTERM)
    began = time.monotonic()
    out, _ = first.communicate(timeout=90)  # to its end: the sweep writes to the same pipe as dvc
    print(f"\nthe sweep stopped {time.monotonic() - began:.1f} s after dvc's SIGTERM")
    assert first.returncode == -signal.SIGTERM and wait_for(lambda: ended(stage), "the sweep's end", 10), out[-3000:]
    assert "error: the sweep was stopped by SIGTERM (its parent process" in out
    _, parents, children = mlflow_runs(repo)
    assert [p.info.status for p in parents] == ["KILLED"] and {c.info.status for c in children} == {"KILLED"}
    assert "stopped by SIGTERM (its parent process" in parents[0].data.tags["reason"]
    assert all("stopped by SIGTERM" in c.data.tags["reason"] and "status" not in c.data.tags for c in children)

    before = checkpoints(repo)
    second = start([sys.executable, "-m", "pipeline.common.signals", "--", "dvc", "repro"], repo)
    wait_for(lambda: new_checkpoint(repo, before), "a checkpoint of the resumed sweep")
    second.send_signal(signal.SIGTERM)
    out, _ = second.communicate(timeout=120)
    assert second.returncode != 0 and "sweep: SIGINT received: stopping" in out, out[-3000:]
    assert "failed to reproduce 'sweep'" in out  # dvc waited for its stage and said so
    _, parents, children = mlflow_runs(repo)
    assert sorted(p.info.status for p in parents) == ["KILLED", "KILLED"]
    assert not [r for r in parents + children if r.info.status == "RUNNING"]

    result = run(["dvc", "repro", "sweep"], repo)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    got, want = trials(repo), trials(reference)
    assert (got.resumed_step >= 20).all()  # continued, not restarted
    pd.testing.assert_frame_equal(got[SAME], want[SAME])
    assert_one_whole_run_per_trial(repo, reference)


NO_UTS = None if subprocess.run(["unshare", "--uts", "true"], capture_output=True).returncode == 0 else \
    "`unshare --uts` fails (run as root)"


@pytest.mark.skipif(NO_UTS is not None, reason=f"needs a host name of its own: {NO_UTS}")
def test_a_sweep_killed_on_one_host_is_resumed_on_another(uninterrupted, generated, tmp_path):
    """`dvc repro` killed, process group and all, on host node-a (a UTS namespace of its own: the same machine under
    another name, as a Slurm job or a KubeRay retry lands on another node), then run on this host: its runs are known
    dead by their missed heartbeat, not by their host, closed as KILLED, and their trials continued with their
    curves; the table is the uninterrupted run's."""
    reference, _ = uninterrupted
    repo = copy_generated(generated, tmp_path, KILLABLE_SWEEP)
    params = repo / "params.yaml"
    params.write_text(params.read_text().replace("node_wait_s: 300", "node_wait_s: 300\n  heartbeat_s: 1"))
    first = start(["unshare", "--uts", "sh", "-c", "hostname node-a && exec dvc repro"], repo)
    wait_for(lambda: any(m["step"] >= 20 for m in checkpoints(repo)), "a checkpoint at step 20")
    os.killpg(first.pid, signal.SIGKILL)  # the node is gone: nothing of it cleans up
    first.wait()
    _, parents, _ = mlflow_runs(repo)
    assert [(p.info.status, p.data.tags["driver_host"]) for p in parents] == [("RUNNING", "node-a")]

    result = run(["dvc", "repro", "sweep"], repo)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "(pid" in result.stdout and "on node-a) missed 3 heartbeats (every 1 s" in result.stdout
    got, want = trials(repo), trials(reference)
    assert (got.resumed_step >= 20).any()
    pd.testing.assert_frame_equal(got[SAME], want[SAME])
    _, parents, children = mlflow_runs(repo)
    killed = [p for p in parents if p.info.status == "KILLED"]
    assert len(killed) == 1 and "on node-a) missed 3 heartbeats" in killed[0].data.tags["reason"]
    newest = max(parents, key=lambda r: r.info.start_time)
    mine = [c for c in children if c.data.tags["mlflow.parentRunId"] == newest.info.run_id]
    dead = {c.info.run_id for c in children if c.info.status == "KILLED"}
    assert {c.data.tags.get("resumed_from_run") for c in mine if "resumed_from_run" in c.data.tags} <= dead
    assert any("resumed_from_run" in c.data.tags for c in mine)  # the killed run's curve handed on
    assert_one_whole_run_per_trial(repo, reference)


def test_a_killed_fused_sweep_resumes_each_member_from_its_own_checkpoint(generated, tmp_path):
    """``sweep.resources.fuse``: two learning rates of one cell as one fused trial. The sweep killed with SIGKILL: the
    rerun finds each member's directory of the fused trial's checkpoints (under its own trial key) and continues them
    as one fused trial. Its Ray worker then SIGKILLed: Tune retries it, each member going on from its directory of the
    retried trial's own last checkpoint (past the dead sweep's). Each member ends as the uninterrupted fused sweep
    did, one whole MLflow run each, no checkpoint left."""
    fused = KILLABLE_SWEEP.replace("[standard, lstm]", "[standard]") + (
        "\n    fuse: learning_rates\n  search: {lrs: [0.003, 0.001]}")  # under its resources
    reference = copy_generated(generated, tmp_path / "whole", fused)
    assert run(["dvc", "repro", "sweep"], reference).returncode == 0
    repo = copy_generated(generated, tmp_path / "killed", fused)
    first = start(["dvc", "repro"], repo)
    wait_for(lambda: len({m["trial_key"] for m in checkpoints(repo) if m["step"] >= 20}) == 2,
             "both members' checkpoints at step 20")
    tree = psutil.Process(first.pid).children(recursive=True)  # its Ray too, which outlives dvc's group a moment
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    wait_for(lambda: all(ended(p) for p in tree), "the dead sweep's Ray processes to end")
    dead_sweeps = max(m["step"] for m in checkpoints(repo))  # the newest checkpoint any of them wrote
    rerun = start(["dvc", "repro", "sweep"], repo)
    wait_for(lambda: len({m["trial_key"] for m in checkpoints(repo) if m["step"] >= dead_sweeps + 40}) == 2,
             "both members' checkpoints 40 steps past the dead sweep's")
    wait_for(lambda: trial_workers(rerun), "the fused trial's Ray worker")[0].kill()
    out, _ = rerun.communicate(timeout=900)
    assert rerun.returncode == 0, out[-3000:]
    got, want = trials(repo), trials(reference)
    assert (got.restarts == 1).all() and (got.fused_members == 2).all()  # retried once, fused again
    assert (got.resumed_step > dead_sweeps).all()  # from the retried trial's own checkpoints, not the dead sweep's
    pd.testing.assert_frame_equal(got[SAME], want[SAME])
    assert_one_whole_run_per_trial(repo, reference)
    assert not list((repo / "ray_results").glob("*/*/checkpoint_*"))



@pytest.mark.slow
def test_retries_count_failures_without_progress(tmp_path):
    """sweep.runs.max_failures (2) bounds failures in a row without a newer checkpoint (``RetriesOnProgress``): a
    trial killed five times, each after saving a step further, ends as an undisturbed one would; one that dies before
    any checkpoint fails after its 2 retries. Real Ray Tune on a local Ray (about 20 s)."""
    import ray
    from ray import tune

    from pipeline.scheduling.tuning import RetriesOnProgress
    from tests.helpers import ROOT
    from tests.helpers.flaky import flaky

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})  # the workers import tests.helpers
    try:
        tuner = tune.Tuner(
            tune.with_resources(flaky, {"cpu": 1}),
            param_space={"progress": tune.grid_search([True, False])},
            run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0, callbacks=[RetriesOnProgress()],
                                      failure_config=tune.FailureConfig(max_failures=2)),
        )  # fmt: skip
        results = {r.config["progress"]: r for r in tuner.fit()}
    finally:
        ray.shutdown()
    assert results[True].error is None and results[True].metrics["step"] == 5 and results[True].metrics["done"]
    assert results[False].error is not None and "killed before any checkpoint" in str(results[False].error)
