"""Fast CPU fixtures: tiny datasets generated once per session from the `tiny` profile."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

from pipeline import config as config_mod  # noqa: E402
from pipeline.generate import generate_task  # noqa: E402

ROOT = config_mod.ROOT


@pytest.fixture(scope="session")
def tiny_cfg() -> config_mod.Config:
    return config_mod.load(profile="tiny")


@pytest.fixture(scope="session")
def tiny_data(tiny_cfg, tmp_path_factory) -> Path:
    """The tiny profile's datasets, every sample re-checked by its task's checker while written."""
    out = tmp_path_factory.mktemp("data")
    for task in tiny_cfg.tasks:
        generate_task(tiny_cfg, task, out, check=True)
    return out


def write_params(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
