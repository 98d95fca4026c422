"""The GPU proof kit as the lent GPU machine meets it, rehearsed on the CPU: its image has no Ray, MLflow or DVC (and
no network), so the GPU tests, bench_gpu and the forecast's throughput measurement must import none of them, and
``ops/gpu-proof`` must install what it lacks from prepared wheels and name bad input before anything runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import models
from tests.helpers import ROOT
from tests.helpers.training import short_trial
from tests.helpers.without import run_without

PROOF = str(ROOT / "ops" / "gpu-proof")
THIS_PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"


def proof(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([PROOF, *args], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=os.environ | {"PYTHON": sys.executable} | (env or {}))


def test_a_short_trial_trains_its_steps_on_the_cpu(tiny_cfg, tiny_data):
    """The CPU twin of the GPU tests' bf16 trial: 20 steps, whatever the tiny profile's epoch is."""
    result = short_trial(tiny_cfg, tiny_data)
    assert result["train_steps"] == 20 and 0 <= result["final_accuracy"] <= 1


@pytest.mark.slow
def test_a_trial_trains_with_ray_mlflow_and_dvc_blocked():
    test = "tests/test_gpu_kit.py::test_a_short_trial_trains_its_steps_on_the_cpu"
    done = run_without("pytest", test, "-q", "-p", "no:cacheprovider")
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]


def test_the_block_refuses_the_packages_and_what_is_under_them():
    """The sweep's driver needs Ray: blocked, it cannot be imported (``ray.tune`` refused as ``ray`` is)."""
    done = run_without("pipeline.scheduling.driver", timeout=120)
    assert done.returncode != 0 and "No module named 'ray" in done.stderr and "blocked" in done.stderr


@pytest.mark.slow
def test_the_proof_prepares_and_rehearses_on_the_cpu_without_ray_mlflow_and_dvc(tmp_path):
    """prepare downloads the wheels (here for this Python), run --rehearse installs them to a temporary path and runs
    every part with Ray, MLflow and DVC blocked: the GPU tests collect (and skip: no CUDA), the throughput file and
    bench_gpu's rows are written."""
    wheels = {"GPU_PROOF_WHEELS": str(tmp_path / "wheels")}
    prepared = proof("prepare", "--python", THIS_PYTHON, env=wheels)
    assert prepared.returncode == 0, prepared.stderr[-3000:]
    out = tmp_path / "out"
    done = proof("run", str(out), "--rehearse", env=wheels)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-3000:]
    log = (out / "proof.log").read_text()
    for part in ("gpu tests", "throughput tiny", "bench_gpu"):
        assert f"== {part}: passed" in log
    assert "pydantic 2.14.3" in log and "no CUDA device" in log
    tests = (out / "gpu-tests.txt").read_text()
    assert " skipped" in tests and "error" not in tests.lower() and " passed" not in tests
    throughput = json.loads((out / "throughput-tiny.json").read_text())
    rates = throughput["flops_per_s"]
    assert rates and all(rate > 0 for by_width in rates.values() for rate in by_width.values())
    rows = json.loads((out / "bench_gpu.json").read_text())["sections"]["quick"]["figures"]
    assert set(rows) == set(models.ARCHITECTURES)
    assert all(row["tokens_per_s"]["median"] > 0 for row in rows.values())


def test_bad_input_is_named_before_anything_runs(tmp_path):
    out = tmp_path / "out"
    missing = proof("run", str(out), env={"GPU_PROOF_WHEELS": str(tmp_path / "none")})
    assert missing.returncode == 2 and "no prepared wheels" in missing.stderr
    assert "ops/gpu-proof prepare" in missing.stderr
    assert "no CUDA device" in missing.stderr  # every problem named at once
    other = tmp_path / "other"
    other.mkdir()
    (other / "PYTHON").write_text("3.12\n" if THIS_PYTHON != "3.12" else "3.11\n")
    wrong = proof("run", str(out), "--rehearse", env={"GPU_PROOF_WHEELS": str(other)})
    assert wrong.returncode == 2 and f"this Python is {THIS_PYTHON}" in wrong.stderr
    (tmp_path / "file").write_text("")
    unwritable = proof("run", str(tmp_path / "file" / "out"), "--rehearse", env={"GPU_PROOF_WHEELS": str(other)})
    assert unwritable.returncode == 2 and "cannot write the output folder" in unwritable.stderr
    assert not out.exists() or not any(out.iterdir())  # nothing ran
    usage = proof("run")
    assert usage.returncode == 2 and "name the output folder" in usage.stderr


def test_the_figures_carry_the_commit_the_proof_prepared(tmp_path, monkeypatch):
    """The lent machine's copy of the tree has no .git, or one of the session's first commit (seen on an H100): its
    figures carry the commit ``prepare`` recorded."""
    from pipeline.common.provenance import git_commit

    monkeypatch.delenv("CAPACITY_ATLAS_COMMIT", raising=False)
    assert git_commit(tmp_path).sha == "unknown"
    monkeypatch.setenv("CAPACITY_ATLAS_COMMIT", "0123abc+dirty")
    assert (git_commit(tmp_path).sha, git_commit(tmp_path).dirty) == ("0123abc", True)
    assert git_commit(ROOT).sha == "0123abc"  # also where a .git is there
    monkeypatch.delenv("CAPACITY_ATLAS_COMMIT")
    assert git_commit(ROOT).sha not in ("0123abc", "unknown")
