"""Fast CPU fixtures: tiny datasets generated once per session from the `tiny` profile."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

from pipeline.common import config as config_mod  # noqa: E402
from pipeline.generate import generate_task  # noqa: E402

ROOT = config_mod.ROOT


@pytest.fixture(scope="session")
def tiny_cfg() -> config_mod.Config:
    return config_mod.load(profile="tiny")


@pytest.fixture(scope="session")
def tiny_data(tiny_cfg, tmp_path_factory) -> Path:
    """The tiny profile's datasets, every sample checked by its task's checker as it was written."""
    out = tmp_path_factory.mktemp("data")
    for task in tiny_cfg.tasks:
        generate_task(tiny_cfg, task, out, check=True)
    return out


def write_params(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# Two trials (one per architecture, 1,600 steps) long enough to be killed mid-way, dropout on so that the RNG must
# resume too: the sweep of the kill tests (tests/test_resume.py) and of the cluster test (tests/test_cluster.py)
KILLABLE_SWEEP = """sweep:
  architectures: [standard, lstm]
  widths: [16]
  datasets: {lis: [3]}
  dropout: 0.1
  epochs: 100
  max_steps: 1600
  val_every_steps: 20
  stop_when_solved: false"""


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory) -> tuple[Path, float]:
    """A tiny-profile copy of the repo after `dvc repro` of KILLABLE_SWEEP (keeping the trials' checkpoints), with
    a local Ray and SQLite MLflow, and the wall time of that `dvc repro` (its data generated first, outside the
    timing)."""
    import time

    from tests.test_pipeline import copy_repo, run

    # keep_checkpoints changes what stays in storage, not a result (tests/test_resume.py checks both ways)
    repo = copy_repo(tmp_path_factory.mktemp("whole"), KILLABLE_SWEEP + "\n  keep_checkpoints: true")
    assert run(["dvc", "repro", "generate"], repo).returncode == 0
    began = time.time()
    result = run(["dvc", "repro"], repo)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return repo, time.time() - began
