"""Shared fixtures only (the helpers are in tests/helpers/): tiny datasets generated from the `tiny` profile (in this
process, once per session, and by `dvc repro generate` in a copy of the repo, once per run whatever the number of
xdist workers: ``once``), a tiny trial's spec, and an uninterrupted `dvc repro` of KILLABLE_SWEEP (once per run); and
the tiers (`integration` and `cluster` imply `slow`)."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")


def _interpreted_triton() -> None:
    """Without CUDA, triton.language imported under TRITON_INTERPRET=1, so that tests/test_kernels.py can run the
    Triton kernels on the CPU. Triton fixes whether a ``@triton.jit`` function is interpreted when it is defined, its
    own library's (``tl.sum``) at triton's first import, which Lightning's import makes (through torch._dynamo) before
    test_kernels.py is collected. The variable is put back at once: the scans dispatch to Triton on the CPU only
    where a test sets it again (``models.kernels.triton_ready``)."""
    import importlib.util

    import torch

    if importlib.util.find_spec("triton") is None or torch.cuda.is_available():
        return
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TRITON_INTERPRET", "1")
        import triton.language  # noqa: F401


_interpreted_triton()

from pipeline.common.config import Config, load_config  # noqa: E402
from pipeline.common.locks import owned  # noqa: E402
from pipeline.generate import generate_task  # noqa: E402
from tests.helpers import KILLABLE_SWEEP  # noqa: E402

# Marks that make a test slow whatever else it is marked: `-m "not slow"`, the developer's loop, runs none of them
IMPLY_SLOW = ("integration", "cluster")
# Seconds each module's slow tests took in a measured run (`pytest -m slow --store-durations` writes it): the slow
# tier starts with its longest modules
DURATIONS = Path(__file__).with_name("durations.json")


def pytest_addoption(parser):
    parser.addoption("--store-durations", action="store_true",
                     help=f"write the seconds each module's slow tests took in this run to {DURATIONS.name}, which "
                          "orders the slow tier, longest module first")  # fmt: skip


@pytest.hookimpl(tryfirst=True)  # before `-m` selects, so that it selects on the marks added here
def pytest_collection_modifyitems(config, items):
    """The tiers: ``integration`` and ``cluster`` tests are ``slow`` too. ``gpu`` tests need CUDA: skipped, and said
    so, where there is none. The modules that hold slow tests run first, the longest first (``DURATIONS``): with
    ``-n 2`` each module goes whole to the next free worker in this order, so the long ones start early and the many
    short ones even out the end (in alphabetical order the slow tier's longest, test_resume.py, began 17 minutes in
    and ended alone)."""
    import torch

    for item in items:
        if any(item.get_closest_marker(mark) for mark in IMPLY_SLOW) and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    seconds = json.loads(DURATIONS.read_text())
    # stable: each module's tests keep their order, and stay together (one module's key is all its tests')
    items.sort(key=lambda item: (item.path not in slow, -seconds.get(item.nodeid.split("::")[0], 0)))
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs CUDA (gpu marker)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # optional: pytest-xdist is absent where ops/gpu-proof runs
def pytest_xdist_make_scheduler(config, log):
    """Under ``-n`` (the README's test command), each module runs whole on one worker, the modules in collection
    order (``pytest_collection_modifyitems``: the slow ones first), so that module-scoped fixtures are made once."""
    from xdist.scheduler import LoadFileScheduling

    config.option.loadscopereorder = False  # xdist's default orders modules by their number of tests
    return LoadFileScheduling(config, log)


@pytest.fixture(scope="session")
def tiny_cfg() -> Config:
    return load_config(profile="tiny")


@pytest.fixture(scope="session")
def tiny_data(tiny_cfg, tmp_path_factory) -> Path:
    """The tiny profile's datasets, every sample checked by its task's checker as it was written."""
    out = tmp_path_factory.mktemp("data")
    for task in tiny_cfg.tasks:
        generate_task(tiny_cfg, task, out, check=True)
    return out


@pytest.fixture
def spec(tiny_cfg, tiny_data):
    """A tiny trial's spec (tests/test_checkpoints.py, tests/test_distributed.py)."""
    from pipeline.training.settings import TrainSettings
    from pipeline.training.train import TrialSpec
    from tests.helpers import dataset_fields, make_cell

    size = tiny_cfg.generate.datasets["lis"][0]
    cell = make_cell("lis", size, "standard", 16, 1, 3, **dataset_fields(tiny_data, "lis", size))
    # dropout on (the RNG must be put back), several epochs, validations mid-epoch and at an epoch's end
    settings = TrainSettings().replaced(heads=2, dropout=0.1, batch_size=16, epochs=50, max_steps=40,
                                        weight_decay=0.01, warmup_fraction=0.1, grad_clip=1.0, precision="32-true",
                                        val_samples=16, val_every_steps=5, eval_samples=32, eval_batch_size=16,
                                        threads=1, use_gpu=False, threshold=0.99, patience=3, min_delta=0.0,
                                        max_budget_factor=1)
    return TrialSpec(cell=cell, settings=settings, lr=3e-3)


def once(tmp_path_factory, name: str, make: Callable[[Path], str]) -> tuple[Path, str]:
    """Directory ``name`` made by ``make`` once per test run, however many xdist workers ask (each would make a session
    fixture of its own: tens of seconds of `dvc repro` on 2 cores): the first makes it where every worker's temporary
    directories lie, the others wait on its lock and take it as made. Returns the directory and what ``make`` said.
    What is made there is only read (copied) by the tests, as a session fixture's is."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the run's own directory, above each worker's
    directory, made = shared / name, shared / f"{name}.made"
    with owned(shared / f"{name}.lock", busy="", wait=True):
        if not made.exists():
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir()
            made.write_text(make(directory))
    return directory, made.read_text()


@pytest.fixture(scope="session")
def generated(tmp_path_factory) -> Path:
    """A tiny-profile copy of the repo after `dvc repro generate`, once per run: the datasets of every `dvc repro`
    of a sweep on the tiny profile, which ``tests.helpers.repo.copy_generated`` copies instead of generating again."""
    from tests.helpers.repo import copy_repo, run

    def make(repo: Path) -> str:
        copy_repo(repo)
        result = run(["dvc", "repro", "generate"], repo)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        return ""

    return once(tmp_path_factory, "generated", make)[0]


@pytest.fixture(scope="session")
def uninterrupted(generated, tmp_path_factory) -> tuple[Path, float]:
    """A tiny-profile copy of the repo after `dvc repro sweep` of KILLABLE_SWEEP (keeping the trials' checkpoints),
    with a local Ray and SQLite MLflow, and the wall time of that `dvc repro sweep` (its data generated before,
    ``generated``), once per run."""
    from tests.helpers.repo import copy_generated, run

    def make(repo: Path) -> str:
        # keep_checkpoints changes what stays in storage, not a result (tests/test_resume.py checks both ways)
        copy_generated(generated, repo, KILLABLE_SWEEP + "\n  runs: {keep_checkpoints: true}")
        began = time.time()
        result = run(["dvc", "repro", "sweep"], repo)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        return str(time.time() - began)

    repo, seconds = once(tmp_path_factory, "whole", make)
    return repo, float(seconds)


_slow_seconds: Counter[str] = Counter()  # module -> seconds of its slow tests in this run (setup, call, teardown)


def pytest_runtest_logreport(report):
    if "slow" in report.keywords:
        _slow_seconds[report.nodeid.split("::")[0]] += report.duration


def pytest_sessionfinish(session):
    """``--store-durations``: this run's seconds of each module's slow tests into ``DURATIONS``, the modules it did
    not run kept (under xdist the controller writes it: it sees every worker's reports)."""
    if not session.config.getoption("store_durations") or hasattr(session.config, "workerinput"):
        return
    kept = json.loads(DURATIONS.read_text())
    merged = kept | {module: round(seconds, 1) for module, seconds in _slow_seconds.items()}
    DURATIONS.write_text(json.dumps(dict(sorted(merged.items())), indent=1) + "\n")
