"""The sweep's MLflow parent run: what it records of the grid, the training settings, the reuse key, the library
versions and where the code came from, so that a run in the UI says which sweep made it and how to make it again.
Its children, one per trained trial, are ``pipeline.tracking.runs``'. ``SweepRun`` is the sweep's run record: where
it records and since when."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import yaml
from mlflow.tracking import MlflowClient

from pipeline.common.cell import Cell, CellSpec
from pipeline.common.config import Config
from pipeline.common.provenance import git_commit, library_versions
from pipeline.search.halving import Halving
from pipeline.tracking.runs import dataset_inputs, driver_tags, start_parent


@dataclass(frozen=True)
class SweepRun:
    """A sweep's run record: where it records (MLflow's client, its parent run, the results folder) and since when."""

    client: MlflowClient
    parent: str  # the parent run's id
    out_dir: Path  # results/
    started: float  # time.time() as the sweep began training
    stage_start: float  # the stage's process start, its imports included (the slots' time is counted from it)


def open_parent_run(cfg: Config, cells: dict[Cell, CellSpec], train: dict, key: str) -> tuple[MlflowClient, str]:
    """The sweep's MLflow parent run, with the grid, the training settings and where the code came from."""
    s = cfg.sweep
    commit = git_commit()
    params = {
        "profile": cfg.profile,
        "search": s.search.strategy,
        "predict": ",".join(s.search.predict) or "none",
        "lr_search": s.search.lr_search,
        **Halving.of(s.search).params(),
        "cells": len(cells),
        "architectures": ",".join(s.grid.architectures),
        "widths": ",".join(map(str, s.grid.widths)),
        "depths": ",".join(map(str, s.grid.depths)),
        "seeds": ",".join(map(str, s.grid.seeds)),
        "lrs": ",".join(f"{lr:g}" for lr in s.search.learning_rates()),
        **{f"lrs.{a}": ",".join(f"{lr:g}" for lr in lrs) for a, lrs in s.search.arch_lrs.items()},
        "run_key": key,
        "reuse": s.runs.reuse,
        **{f"train.{k}": v for k, v in train.items()},
        **{f"library.{k}": v for k, v in library_versions().items()},  # what the run key hashes besides the code
    }
    tags = {
        "git_commit": commit.sha,
        "git_dirty": str(commit.dirty),
        "profile": cfg.profile,
        "stage": "sweep",
        **driver_tags(cfg.cluster.heartbeat_s),
    }
    client, parent = start_parent(
        cfg.cluster.mlflow(),
        s.runs.experiment,
        f"sweep-{cfg.profile}-{time.strftime('%Y%m%d-%H%M%S')}",
        params=params,
        tags=tags,
    )
    client.log_text(parent, yaml.safe_dump(cfg.model_dump(), sort_keys=False), "config.yaml")
    client.log_inputs(parent, dataset_inputs(list(cells.values()), cfg.profile))
    return client, parent
