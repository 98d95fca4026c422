"""Helpers shared by the tests; shared fixtures live in tests/conftest.py, and no test module imports from another
test module or from conftest (tests/test_test_helpers.py checks).

What lives where:

- ``tests.helpers`` (here): ``ROOT`` (this checkout), ``write_params``, ``make_cell`` (a synthetic cell record),
  ``dataset_fields`` (a generated dataset's fields of a cell record), ``default_stop_signals`` (a child's
  ``preexec_fn`` for the tests that stop it: SIGINT and SIGTERM as a terminal starts it),
  ``KILLABLE_SWEEP`` (the sweep of the kill and cluster tests) and ``SMALL_SIZES`` (each task's small sizes,
  its ``test_sizes``).
- ``tests.helpers.repo``: ``copy_repo`` (a git copy of this checkout on the tiny profile, some tasks only if asked),
  ``copy_generated`` (a copy with the tiny datasets made), ``run`` (a command in it, with this venv's tools),
  ``compiled_kernels`` (numba caches a copy reuses) and ``mlflow_runs`` (a copy's runs).
- ``tests.helpers.upstream``: ``upstream_and_clone`` (a bare upstream of a git repository and a fresh clone of it),
  ``push_change`` (a commit pushed to the upstream), ``copy_kernels`` (a copy's numba kernels into a clone), ``git``.
- ``tests.helpers.training``: ``Curve``, a Lightning callback recording a trial's curve; ``Copies`` and
  ``MemberCopies``, a trial's and a fused trial's checkpoints as a test keeps them; ``short_trial``, a 20-step
  trial on the tiny profile (the GPU tests and their CPU twin); ``needs_cpu_bf16``, a skip, with the reason, where
  this CPU cannot train an architecture in bf16.
- ``tests.helpers.fused``: ``members``, K models of one shape for a fused model (the fused tests and their GPU
  twin).
- ``tests.helpers.without``: ``python -m tests.helpers.without ray,mlflow,dvc -m MODULE``, a module run with packages
  blocked from import, as the lent GPU machine's image lacks them; ``run_without``, the same from a test.
- ``tests.helpers.tables``: ``rows``, synthetic sweep-table rows for the claim, report and nightly tests;
  ``recorded_grid``, a made-up grid sweep's trials.csv and curves.csv for the replay tests.
- ``tests.helpers.browser``: headless Chromium over the DevTools protocol (``Page``, ``report_problems``,
  ``vega_plots`` for the page of `dvc plots show`, ``group_running``); ``python -m tests.helpers.browser
  report/index.html [shot.png]``.
- ``tests.helpers.services``: real services (a two-node Ray cluster, its head with Ray's job server if asked, an
  MLflow server) in a network namespace.
- ``tests.helpers.papers``: ``PAPERS`` (where the papers' text lies), ``TEXTS``, ``normalized`` (the text as the PDF's
  extraction writes it), for the tests that check quotes against the papers.
- ``tests.helpers.webhook``: ``webhook``, a chat webhook: a real HTTP server on loopback that records the POSTs.
- tests/conftest.py: the fixtures only (``tiny_cfg``, ``tiny_data``, ``spec``, ``generated``, ``uninterrupted``) and
  ``once``, which makes the last two once per run for every xdist worker.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from pipeline.common.cell import Cell, CellSpec, cell_id
from pipeline.common.config import ROOT
from tasks import TASKS

__all__ = [
    "KILLABLE_SWEEP", "ROOT", "SMALL_SIZES", "dataset_fields", "default_stop_signals", "make_cell", "write_params",
]


def make_cell(task: str = "lis", size: int = 4, arch: str = "standard", width: int = 16, depth: int = 1,
              seed: int = 0, **fields) -> CellSpec:
    """A complete cell record on made-up data (no file behind it), for tests that drive the searcher or MLflow
    runs without a sweep; ``fields`` replace any other field."""
    defaults: dict[str, Any] = {
        "arch_options": {}, "lrs": (1e-3,), "train_path": "train.parquet", "test_path": "test.parquet",
        "val_path": "val.parquet", "sha256": {"train_path": "0", "test_path": "1", "val_path": "2"},
        "data_hash": "h", "vocab_size": 12, "family": "cot", "vocab": (), "train_samples": 100, "max_len": 10,
        "cell_id": cell_id(task, size, arch, width, depth, seed, "h"),
        "name": f"{task}{size}-{arch}-w{width}-d{depth}-s{seed}"}
    return CellSpec(cell=Cell(task, size, arch, width, depth, seed), **(defaults | fields))


def dataset_fields(data_dir: Path, task: str, size: int) -> dict:
    """The fields of a cell record that a generated dataset under ``data_dir`` gives (its three files, its L over
    them, its vocabulary and family), for ``make_cell``: a trial of it reads the files."""
    from pipeline.data.datasets import dataset_path, read_metadata

    paths = {f"{s}_path": dataset_path(data_dir, task, size, s) for s in ("train", "test", "val")}
    meta = {key: read_metadata(path) for key, path in paths.items()}
    train = meta["train_path"]
    return {key: str(path) for key, path in paths.items()} | {
        "max_len": max(m["stats"]["max_length"] for m in meta.values()), "vocab_size": len(train["vocab"]),
        "family": train["family"], "vocab": tuple(train["vocab"]), "train_samples": train["stats"]["samples"]}


def default_stop_signals() -> None:
    """SIGINT and SIGTERM at their defaults and unblocked in a child (its ``preexec_fn``), as a terminal starts it,
    whatever this process's: an ignored or blocked signal is inherited (a shell can trap neither), and pytest's
    process is not always clean (twice in the full suite, ops/ray-job could not be stopped by SIGINT, as it cannot
    when pytest runs with SIGINT blocked; generate leaves SIGINT ignored, as a shell's background job wants)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def write_params(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# Two trials (one per architecture, 1,600 steps) at once (tiny runs one at a time), long enough to be killed mid-way,
# and to spread over two nodes, on 2 busy cores; dropout on, so that the RNG must resume too. The sweep of the kill
# tests (tests/test_resume.py, tests/test_lost_node.py) and the cluster tests (tests/test_cluster.py)
KILLABLE_SWEEP = """sweep:
  grid:
    architectures: [standard, lstm]
    widths: [16]
    datasets: {lis: [3]}
  model:
    dropout: 0.1
  optim:
    epochs: 100
    max_steps: 1600
  verdict:
    stop_when_solved: false
  evaluation:
    val_every_steps: 20
  resources:
    max_concurrent_trials: 2"""

# Each task's small sizes, as the task declares them (``Task.test_sizes``)
SMALL_SIZES = {name: list(task.test_sizes) for name, task in TASKS.items()}
