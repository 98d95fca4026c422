"""A copy of this checkout to run the real pipeline in: `copy_repo`, `copy_generated` (a copy whose datasets are
made already), `run`, the numba kernels a copy reuses, and the copy's MLflow runs."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from mlflow.tracking import MlflowClient

from models.selective_scan import selective_scan
from pipeline.common.config import load_config
from pipeline.generate import generate_task
from tests.helpers import ROOT


def pipeline_env(**env) -> dict[str, str]:
    """This process's environment for a pipeline's subprocess, with ``env``: this venv's executables first on the
    PATH, and without the MLflow and Ray addresses an earlier test may have left in it (``mlflow.set_tracking_uri``
    sets MLFLOW_TRACKING_URI, for a server long stopped)."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS")}
    full_env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{full_env['PATH']}"
    return full_env | env


# a sweep of one cell (standard, width 8, lis 3), no retries: what a test of the machinery around a sweep trains
NARROW = "sweep: {grid: {architectures: [standard], widths: [8], datasets: {lis: [3]}}, runs: {max_failures: 0}}"


def run(cmd: list[str], cwd: Path, **env) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=pipeline_env(**env), capture_output=True, text=True, timeout=900)


def copy_repo(dst: Path, sweep: str | None = None, tasks: list[str] | None = None) -> Path:
    """A git copy of this checkout (tracked and new files, not ignored ones) on the tiny profile; ``sweep``
    replaces params.yaml's empty sweep override. ``tasks``: only these tasks have a generate stage, each with the
    tiny profile's sizes; every `dvc repro` or night that generates makes one stage per task (about 0.7 s each),
    most of them writing only a manifest on the tiny profile."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dst / name)
    for cache in compiled_kernels():  # beside sources with the same mtimes (copy2), which numba's index checks
        (dst / cache.parent.relative_to(ROOT)).mkdir(exist_ok=True)
        shutil.copy2(cache, dst / cache.relative_to(ROOT))
    params = dst / "params.yaml"
    text = params.read_text().replace("profile: laptop", "profile: tiny")
    text = text.replace("sweep: {}", sweep) if sweep else text
    if tasks:
        sizes = load_config(profile="tiny").generate.datasets
        datasets = ", ".join(f"{task}: {list(sizes[task])}" for task in tasks if task in sizes)
        text = re.sub(r"(?m)^tasks: .*$", f"tasks: [{', '.join(tasks)}]", text)
        text = text.replace("generate: {}", f"generate: {{datasets: {{{datasets}}}}}")
    params.write_text(text)
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "copy"]):
        subprocess.run(cmd, cwd=dst, check=True)
    return dst


def copy_generated(src: Path, dst: Path, sweep: str | None = None) -> Path:
    """A copy of ``src``, a ``copy_repo`` without a sweep override after `dvc repro generate`, with its datasets, DVC's
    record of them and its cache: `dvc repro` in it runs no generate stage (the generate stages read nothing of the
    sweep). ``sweep`` replaces params.yaml's empty sweep override, committed as ``copy_repo`` commits it. DVC's
    temporary state (its locks, its hashes by inode) stays behind."""
    shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True,
                    ignore=lambda folder, names: ["tmp"] if Path(folder) == src / ".dvc" else [])
    if sweep:
        params = dst / "params.yaml"
        params.write_text(params.read_text().replace("sweep: {}", sweep))
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "sweep"], cwd=dst,
                       check=True)
    return dst


@functools.cache
def compiled_kernels() -> list[Path]:
    """This checkout's numba cache files (``__pycache__/*.nbi``, ``*.nbc``), after compiling what the tiny profile's
    stages run: its generators and deduplication, and Mamba's scan. A copy given them loads these kernels instead of
    compiling them again in each stage's process and each Ray worker (about 20 s a `dvc repro` on 2 cores); the
    stages' own compiling from nothing is what this checkout's first generate and training do."""
    cfg = load_config(profile="tiny")
    with tempfile.TemporaryDirectory() as tmp:
        for name in cfg.generate.datasets:
            generate_task(cfg, name, Path(tmp), check=False)
    B, T, E, N = 1, 3, 2, 2
    inputs = [torch.rand(*shape, requires_grad=True) for shape in ((B, T, E), (B, T, E), (E, N), (B, T, N), (B, T, N),
                                                                   (B, E, N))]  # dt, x, A, Bm, Cm, h0
    y, h = selective_scan(*inputs)
    (y.sum() + h.sum()).backward()
    return sorted(ROOT.glob("*/__pycache__/*.nb[ic]"))


def mlflow_runs(repo: Path):
    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    exp = client.get_experiment_by_name("capacity-atlas")
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    return client, parents, children
