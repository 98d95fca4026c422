"""ops/install: the torch build it picks on each kind of machine (its --dry-run, with the machine's traits made up:
the wheel folder, an nvidia-smi on the PATH), the two locks it installs from agreeing, and the CPU build installed
from an index as PyTorch's (a local one: this machine cannot reach download.pytorch.org). The local build's install
runs in CI: .ci/run is the README's test command, which calls it."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT
from tests.helpers.repo import copy_repo

WHEEL = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"  # the file PyTorch's CPU index serves
CUDA_OWN = re.compile(r"^(torch|triton|setuptools|nvidia-.*|cuda-.*)$")  # what only the CUDA build of torch pins


def install(*args: str, path=None, wheels=None, root=ROOT, dry=True, **env) -> subprocess.CompletedProcess:
    """ops/install with ``args`` (``--dry-run`` unless ``dry`` is false), the PATH ``path``, the wheel folder
    ``wheels`` and the environment ``env``, as ``root`` has it."""
    env = os.environ | env | ({"PATH": str(path)} if path else {})
    env |= {"CAPACITY_ATLAS_WHEELS": str(wheels)} if wheels else {}
    script = [root / "ops" / "install", *(["--dry-run"] if dry else []), *args]
    return subprocess.run(script, env=env, capture_output=True, text=True)


def pins(name: str) -> dict[str, str]:
    """A lock's package -> version, names normalized as PEP 503 does (uv writes them so, the main lock not always)."""
    lines = (ROOT / name).read_text().splitlines()
    return {re.sub(r"[-_.]+", "-", p.lower()): v for p, v in (ln.split("==") for ln in lines if ln and ln[0] != "#")}


@pytest.fixture
def bare_path(tmp_path):
    """A PATH with the tools the script calls but no nvidia-smi; a made-up nvidia-smi is added where a test asks."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "grep", "dirname", "python3"):
        found = subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True, text=True).stdout.strip()
        (bin_dir / tool).symlink_to(found)
    return bin_dir


def test_install_picks_the_local_wheel_then_cuda_then_pytorchs_cpu_index(tmp_path, bare_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / WHEEL).touch()
    local = install("--test", path=str(bare_path), wheels=wheels)
    assert local.returncode == 0, local.stderr
    expected = f"local build: uv pip install -c requirements.lock --find-links {wheels} -e .[test] torch==2.13.0+cpu"
    assert expected in local.stdout

    empty = tmp_path / "none"
    empty.mkdir()
    cpu = install(path=str(bare_path), wheels=empty)
    assert "cpu build" in cpu.stdout and "--extra-index-url https://download.pytorch.org/whl/cpu" in cpu.stdout
    assert "torch==2.13.0+cpu" in cpu.stdout

    smi = bare_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n")
    smi.chmod(0o755)
    cuda = install(path=str(bare_path), wheels=empty)
    assert "cuda build: uv pip install -c requirements-cuda.lock -e . torch==2.13.0" in cuda.stdout
    assert install(path=str(bare_path), wheels=wheels).stdout.count("local build") == 1  # the wheel folder first

    smi.write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")  # a driver without a GPU
    assert "cpu build" in install(path=str(bare_path), wheels=empty).stdout


@pytest.mark.slow
def test_the_cpu_build_installs_from_pytorchs_index_or_a_mirror_and_an_unreachable_one_is_named(tmp_path):
    """The ``cpu`` choice run for real, as on a machine with neither the wheel folder nor a GPU (this one has no
    nvidia-smi): against a PEP 503 index that serves the wheel PyTorch's CPU index serves, everything else from PyPI."""
    wheel = Path(os.environ.get("CAPACITY_ATLAS_WHEELS", "/opt/wheels")) / WHEEL
    if not wheel.exists():
        pytest.skip(f"no {wheel} to serve")
    repo = copy_repo(tmp_path / "repo")
    (tmp_path / "empty").mkdir()
    unreachable = install(root=repo, dry=False, wheels=tmp_path / "empty", CAPACITY_ATLAS_TORCH_INDEX="file:///none")
    assert unreachable.returncode == 1, unreachable.stdout + unreachable.stderr
    assert "the CPU build comes from file:///none" in unreachable.stderr and "--torch cuda" in unreachable.stderr

    (tmp_path / "index" / "torch").mkdir(parents=True)
    (tmp_path / "index" / "torch" / WHEEL).symlink_to(wheel)
    (tmp_path / "index" / "torch" / "index.html").write_text(f'<a href="{WHEEL}">{WHEEL}</a>')
    try:
        done = install(root=repo, dry=False, wheels=tmp_path / "empty",
                       CAPACITY_ATLAS_TORCH_INDEX=(tmp_path / "index").as_uri())
        assert done.returncode == 0, done.stdout + done.stderr
        assert "cpu build" in done.stdout and "torch 2.13.0+cpu, CUDA available: False" in done.stdout
        python = repo / ".venv" / "bin" / "python"
        check = "import dvc, lightning, mlflow, ray; import pipeline.common.config as c; c.load_config(profile='tiny')"
        assert subprocess.run([python, "-c", check], cwd=repo).returncode == 0
    finally:
        shutil.rmtree(repo / ".venv", ignore_errors=True)  # 2.5 GB


def test_install_names_what_cannot_be_installed(tmp_path):
    for args, named in ((["--torch", "local"], "no torch-2.13.0+cpu wheel"), (["--torch", "rocm"], "'rocm'"),
                        (["--nope"], "unknown argument '--nope'")):
        done = install(*args, wheels=tmp_path)
        assert done.returncode == 2 and named in done.stderr, (args, done.stderr)


def test_the_cuda_lock_pins_what_the_main_lock_pins_plus_the_cuda_builds_own():
    main, cuda = pins("requirements.lock"), pins("requirements-cuda.lock")
    shared = {p for p in main.keys() & cuda.keys() if not CUDA_OWN.match(p)}
    assert shared == {p for p in main if not CUDA_OWN.match(p)}  # nothing of the main lock is missing
    assert {p: main[p] for p in shared} == {p: cuda[p] for p in shared}
    assert cuda["torch"] == main["torch"] == "2.13.0"
    assert {p for p in cuda.keys() - main.keys()} and all(CUDA_OWN.match(p) for p in cuda.keys() - main.keys())


def test_ci_runs_the_readmes_test_command():
    readme = (ROOT / "README.md").read_text()
    command = "ops/install --test && .venv/bin/python -m pytest"
    assert f"```bash\n{command}\n```" in readme
    assert command in (ROOT / ".ci" / "run").read_text().splitlines()
