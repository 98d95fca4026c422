"""ops/install: the torch build it picks on each kind of machine (its --dry-run, with the machine's traits made up:
the wheel folder, an nvidia-smi on the PATH), the two locks it installs from agreeing, and the CPU build installed
from an index as PyTorch's (a local one: this machine cannot reach download.pytorch.org). The local build's install
runs in CI: .ci/run is the README's test command, which calls it."""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT, browser
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
    for tool in ("bash", "grep", "dirname", "head", "sort", "python3"):
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
    smi.write_text(smi_of("580.82.07"))
    smi.chmod(0o755)
    cuda = install(path=str(bare_path), wheels=empty)
    assert "cuda build: uv pip install -c requirements-cuda.lock -e . torch==2.13.0" in cuda.stdout
    assert install(path=str(bare_path), wheels=wheels).stdout.count("local build") == 1  # the wheel folder first

    smi.write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")  # a driver without a GPU
    assert "cpu build" in install(path=str(bare_path), wheels=empty).stdout


@pytest.mark.slow
def test_the_cpu_build_installs_from_pytorchs_index_or_a_mirror_and_an_unreachable_one_is_named(tmp_path):
    """The ``cpu`` choice run for real, as on a machine with neither the wheel folder nor a GPU (this one has no
    nvidia-smi): against a PEP 503 index that serves the wheel PyTorch's CPU index serves, everything else from PyPI;
    with a python3 of another version first on the PATH, which the install passes over for python3.11. Then the
    ``cu128`` choice, where nvidia-smi lists a GPU whose driver runs CUDA 12.8 and not 13.0, against an index that
    serves a stand-in of PyTorch's CUDA 12.8 wheel."""
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
    other = tmp_path / "other"
    other.mkdir()
    (other / "python3").write_text(PYTHON_312)
    (other / "python3").chmod(0o755)
    # both installs without bytecode (uv's UV_COMPILE_BYTECODE=0): compiling the 2.5 GB venv twice was 36 of this
    # test's 85 CPU-s, and it checks the builds picked, not the compiler
    try:
        done = install(root=repo, dry=False, wheels=tmp_path / "empty", path=f"{other}:{os.environ['PATH']}",
                       UV_COMPILE_BYTECODE="0",
                       CAPACITY_ATLAS_TORCH_INDEX=(tmp_path / "index").as_uri())
        assert done.returncode == 0, done.stdout + done.stderr
        assert "cpu build" in done.stdout and "torch 2.13.0+cpu, CUDA available: False" in done.stdout
        assert f"Python 3.11: {shutil.which('python3.11')}" in done.stdout
        python = repo / ".venv" / "bin" / "python"
        assert subprocess.run([python, "-c", "import sys; assert sys.version_info[:2] == (3, 11)"]).returncode == 0
        check = "import dvc, lightning, mlflow, ray; import pipeline.common.config as c; c.load_config(profile='tiny')"
        assert subprocess.run([python, "-c", check], cwd=repo).returncode == 0

        # a GPU whose driver runs CUDA 12.8, not 13.0: the cu128 build, from its index (a stand-in torch: this
        # machine reaches no CUDA 12 wheel), in place of the CPU build
        stand_in = stand_in_wheel(tmp_path / "cu128", "2.13.0+cu128", "12.8")
        (tmp_path / "cu128" / "torch").mkdir()
        (tmp_path / "cu128" / "torch" / stand_in.name).symlink_to(stand_in)
        (tmp_path / "cu128" / "torch" / "index.html").write_text(f'<a href="{stand_in.name}">{stand_in.name}</a>')
        tools = tool_path(tmp_path, **{"nvidia-smi": smi_of("575.57.08")})
        cu128 = install(root=repo, dry=False, wheels=tmp_path / "empty", path=f"{tools}:{os.environ['PATH']}",
                        UV_COMPILE_BYTECODE="0",
                        CAPACITY_ATLAS_TORCH_INDEX=(tmp_path / "cu128").as_uri())
        assert cu128.returncode == 0, cu128.stdout + cu128.stderr
        assert "the newest CUDA build it runs is CUDA 12.8 (570.26 or later)" in cu128.stdout
        assert "torch 2.13.0+cu128, CUDA available: True" in cu128.stdout
    finally:
        shutil.rmtree(repo / ".venv", ignore_errors=True)  # 2.5 GB


def stand_in_wheel(folder: Path, version: str, cuda: str) -> Path:
    """A wheel of a made-up torch ``version`` whose CUDA ``cuda`` sees a GPU: what ops/install's check reads of it."""
    import base64
    import hashlib
    import zipfile

    info = f"torch-{version}.dist-info"
    files = {
        "torch/__init__.py": f"__version__ = {version!r}\nclass version:\n    cuda = {cuda!r}\nclass cuda:\n"
                             "    @staticmethod\n    def is_available():\n        return True\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\n"
                         "Tag: cp311-cp311-manylinux_2_28_x86_64\n",
    }

    def digest(text: str) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
    record = "".join(f"{name},sha256={digest(text)},{len(text.encode())}\n" for name, text in files.items())
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"torch-{version}-cp311-cp311-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in {**files, f"{info}/RECORD": record + f"{info}/RECORD,,\n"}.items():
            z.writestr(name, text)
    return wheel


def smi_of(driver: str) -> str:
    """An nvidia-smi listing one GPU whose driver is ``driver``."""
    return f"""#!/bin/sh
case "$*" in
    -L) echo 'GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-0)' ;;
    *driver_version*) echo {driver} ;;
esac
"""


@pytest.mark.parametrize(("driver", "build", "command"), [
    ("590.48.01", "CUDA 13.0 (580.65.06 or later)", "cuda build: uv pip install -c requirements-cuda.lock -e . "
                                                     "torch==2.13.0"),
    ("580.65.06", "CUDA 13.0 (580.65.06 or later)", "cuda build: uv pip install -c requirements-cuda.lock"),
    ("575.57.08", "CUDA 12.8 (570.26 or later)", "cu128 build: uv pip install -c requirements.lock --extra-index-url "
                                                 "https://download.pytorch.org/whl/cu128 --index-strategy "
                                                 "unsafe-best-match -e . torch==2.13.0+cu128"),
    ("565.57.01", "CUDA 12.6 (560.28.03 or later)", "cu126 build: uv pip install -c requirements.lock "
                                                    "--extra-index-url https://download.pytorch.org/whl/cu126 "
                                                    "--index-strategy unsafe-best-match -e . torch==2.13.0+cu126"),
])
def test_install_picks_the_cuda_build_the_drivers_version_runs_before_downloading(tmp_path, bare_path, driver, build,
                                                                                   command):
    (bare_path / "nvidia-smi").write_text(smi_of(driver))
    (bare_path / "nvidia-smi").chmod(0o755)
    empty = tmp_path / "none"
    empty.mkdir()
    picked = install(path=str(bare_path), wheels=empty)
    assert picked.returncode == 0, picked.stderr
    assert f"nvidia-smi lists a GPU, driver {driver}: the newest CUDA build it runs is {build}" in picked.stdout
    assert command in picked.stdout


def test_a_driver_too_old_for_a_cuda_build_is_named_before_anything_is_downloaded(tmp_path, bare_path):
    """Chosen by the machine or forced by --torch: a CUDA build the listed GPU's driver cannot run stops the install
    at once, naming the driver, the one the build needs and the build it can run; with no GPU listed (a login node
    preparing a venv for GPU nodes) any build may be forced."""
    empty = tmp_path / "none"
    empty.mkdir()
    smi = bare_path / "nvidia-smi"
    smi.write_text(smi_of("550.54.15"))
    smi.chmod(0o755)
    old = install(path=str(bare_path), wheels=empty)
    assert old.returncode == 2 and "uv pip install" not in old.stdout
    assert ("this node's NVIDIA driver 550.54.15 is older than any CUDA build of torch 2.13.0 needs (CUDA 12.6: "
            "560.28.03 or later): update the driver, or install the CPU build (--torch cpu)") in old.stderr
    smi.write_text(smi_of("575.57.08"))
    forced = install("--torch", "cuda", path=str(bare_path), wheels=empty)
    assert forced.returncode == 2 and "uv pip install" not in forced.stdout
    assert ("--torch cuda: its CUDA 13.0 needs an NVIDIA driver 580.65.06 or later, and this node's is 575.57.08: "
            "choose --torch cu128, or update the driver") in forced.stderr
    mirrored = install("--torch", "cu126", path=str(bare_path), wheels=empty, CAPACITY_ATLAS_TORCH_INDEX="https://m/cu")
    assert "cu126 build: uv pip install -c requirements.lock --extra-index-url https://m/cu " in mirrored.stdout
    smi.unlink()
    assert "cuda build: uv pip install" in install("--torch", "cuda", path=str(bare_path), wheels=empty).stdout
    bad = install("--torch", "cu118", path=str(bare_path), wheels=empty)
    assert bad.returncode == 2 and "--torch 'cu118': choose local, cuda, cu128, cu126 or cpu" in bad.stderr


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
    command = ("ops/install --test && .venv/bin/python -m pytest -n 2 -m \"not slow\" && "
               ".venv/bin/python -m pytest -n 2 -m slow")
    assert f"```bash\n{command}\n```" in readme
    assert command in (ROOT / ".ci" / "run").read_text().splitlines()


# ---- for any user, on any machine


def tool_path(tmp_path: Path, **fakes: str) -> Path:
    """A PATH folder with the tools the scripts call (not nvidia-smi, sudo, apt-get, chromium, npm, uv, python) and
    ``fakes``: name -> a script's text."""
    bin_dir = tmp_path / "tools"
    bin_dir.mkdir()
    for tool in ("bash", "sh", "grep", "sed", "dirname", "mktemp", "rm", "mv", "mkdir", "tar", "id", "cat", "head",
                 "printf", "env", "chmod", "touch", "gzip"):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    for name, text in fakes.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


PYTHON_312 = "#!/bin/sh\necho 3.12\n"  # answers the install's question, `import sys; print(version)`, and no other


def test_install_says_how_it_is_used_and_adds_the_cluster_extra():
    usage = install("--help", dry=False)
    assert usage.returncode == 0 and "usage: ops/install [--test] [--cluster]" in usage.stdout
    assert "--check" in usage.stdout and "uv's managed CPython" in usage.stdout
    assert "-e .[cluster] torch==2.13.0+cpu" in install("--cluster", "--torch", "local").stdout
    assert "-e .[test,cluster] torch==2.13.0+cpu" in install("--test", "--cluster", "--torch", "local").stdout


def test_install_takes_python_311_and_uvs_managed_cpython_where_python3_is_another_version(tmp_path):
    tools = tool_path(tmp_path, python3=PYTHON_312)
    managed = install("--torch", "local", path=str(tools))
    assert managed.returncode == 0 and "Python 3.11: uv's managed CPython (python3 is 3.12" in managed.stdout
    (tools / "python3.11").symlink_to(sys.executable)
    picked = install("--torch", "local", path=str(tools))
    assert f"Python 3.11: {tools / 'python3.11'}" in picked.stdout
    (tools / "python3").unlink()
    (tools / "python3.11").unlink()
    none = install("--torch", "local", path=str(tools))
    assert none.returncode == 2 and "no Python 3.11 and no python3 or uv to get uv with" in none.stderr


# a Python 3.11 as stock Debian and Ubuntu ship it without their python3.11-venv package: no ensurepip
PYTHON_NO_ENSUREPIP = '#!/bin/sh\ncase "$*" in *ensurepip*) exit 1 ;; *) echo 3.11 ;; esac\n'


def test_a_python_without_ensurepip_gets_its_venv_from_uv_or_names_uvs_per_user_installer(tmp_path):
    """No root anywhere: where python3.11 lacks ensurepip (python3.11-venv is a root install), uv makes the venv; with
    no uv either, the error says how this user gets one."""
    tools = tool_path(tmp_path, **{"python3.11": PYTHON_NO_ENSUREPIP})
    none = install("--torch", "local", path=str(tools))
    assert none.returncode == 2
    assert "has no ensurepip (the python3.11-venv package, which needs root) and no uv is on the PATH" in none.stderr
    assert "curl -LsSf https://astral.sh/uv/install.sh | sh (uv's per-user installer" in none.stderr
    (tools / "uv").symlink_to(Path(sys.executable).parent / "uv")
    by_uv = install("--torch", "local", path=str(tools))
    assert by_uv.returncode == 0 and "has no ensurepip: the venv by uv" in by_uv.stdout


def test_uvs_managed_cpython_that_cannot_be_downloaded_is_named(tmp_path):
    """The managed path run for real, as on a machine whose python3 is 3.12 and that has uv: uv is asked for its own
    CPython 3.11 (none on the PATH counts), from a mirror that does not answer."""
    repo = copy_repo(tmp_path / "repo")
    tools = tool_path(tmp_path, python3=PYTHON_312)
    (tools / "uv").symlink_to(Path(sys.executable).parent / "uv")
    done = install("--torch", "local", root=repo, dry=False, path=str(tools),
                   UV_PYTHON_INSTALL_DIR=str(tmp_path / "py"), UV_CACHE_DIR=str(tmp_path / "uv"),
                   UV_PYTHON_INSTALL_MIRROR=(tmp_path / "no-mirror").as_uri())
    assert done.returncode == 2, done.stdout + done.stderr
    assert "uv could not get its managed CPython 3.11 (it downloads it: is the network reachable?" in done.stderr
    assert "UV_PYTHON_INSTALL_MIRROR names a mirror of its builds" in done.stderr
    assert not (repo / ".venv" / "bin" / "python").exists()


STUB_TORCH = """__version__ = "2.13.0+cu130"
class version:
    cuda = "13.0"
class cuda:
    @staticmethod
    def is_available():
        return False
"""
SMI = """#!/bin/sh
case "$*" in
    -L) echo 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)' ;;
    *driver_version*) echo 535.104.05 ;;
esac
"""


def test_a_cuda_build_that_cannot_see_the_gpu_names_the_driver_it_needs(tmp_path):
    """``--check`` of a venv whose torch is a CUDA 13.0 build that sees no GPU (torch stood in for: this machine has
    no CUDA build), on a node where nvidia-smi lists one with an older driver."""
    repo = copy_repo(tmp_path / "repo")
    (repo / ".venv").symlink_to(Path(sys.executable).parent.parent)
    stub = tmp_path / "stub"
    (stub / "torch").mkdir(parents=True)
    (stub / "torch" / "__init__.py").write_text(STUB_TORCH)
    tools = tool_path(tmp_path, **{"nvidia-smi": SMI})
    failed = install("--check", root=repo, dry=False, path=f"{tools}:{os.environ['PATH']}", PYTHONPATH=str(stub))
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert ("torch 2.13.0+cu130 (CUDA 13.0) cannot use the GPU that nvidia-smi lists: it needs an NVIDIA driver for "
            "CUDA 13.0 (580.65.06 or later); this node's is 535.104.05") in failed.stderr
    (tools / "nvidia-smi").unlink()  # a login node, no GPU: the CUDA build is what it is for
    assert install("--check", root=repo, dry=False, path=f"{tools}:{os.environ['PATH']}",
                   PYTHONPATH=str(stub)).returncode == 0
    # this machine's own venv, the CPU build, with a GPU listed: no error (the CPU build was chosen)
    (tools / "nvidia-smi").write_text(SMI)
    (tools / "nvidia-smi").chmod(0o755)
    done = install("--check", root=repo, dry=False, path=f"{tools}:{os.environ['PATH']}")
    assert done.returncode == 0 and "torch 2.13.0+cpu, CUDA available: False" in done.stdout, done.stderr


def test_the_sweep_names_a_machines_torch_that_cannot_use_its_gpus_before_training(tmp_path, monkeypatch):
    """``pipeline.common.cuda``, which the sweep asks of its own machine before trials on GPUs (and its probe of every
    node): a CUDA build whose driver is too old is named with both and the driver it needs, as ops/install names it
    (the same table); the CPU build where nvidia-smi lists a GPU is named too; none listed, or a torch that sees its
    GPU, is no problem to it (without a GPU, the sweep's resource check names the missing one)."""
    import torch

    from pipeline.common import cuda
    from pipeline.common.config import ConfigError, load_config
    from pipeline.sweep import check_before_compute

    script = (ROOT / "ops" / "install").read_text()
    table = re.search(r"declare -A DRIVER_FOR=\(([^)]*)\)", script)
    assert table and dict(re.findall(r"\[([\d.]+)\]=([\d.]+)", table[1])) == cuda.DRIVER_FOR
    builds, order = re.search(r"declare -A CUDA_OF=\(([^)]*)\)", script), re.search(r"CUDA_BUILDS=\(([^)]*)\)", script)
    assert builds and dict(re.findall(r"\[(\w+)\]=([\d.]+)", builds[1])) == cuda.BUILDS
    assert order and order[1].split() == list(cuda.BUILDS)  # newest first, in both
    assert [cuda.newest_build(d) for d in ("590.1", "580.65.06", "575.57.08", "560.28.03", "555.42")] == \
        ["cuda", "cuda", "cu128", "cu126", None]

    tools = tool_path(tmp_path, **{"nvidia-smi": SMI})
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch, "__version__", "2.13.0+cu130")
    assert cuda.listed_gpus() == (1, "535.104.05")
    too_old = ("torch 2.13.0+cu130 (CUDA 13.0) cannot use the 1 GPU(s) nvidia-smi lists: it needs an NVIDIA driver "
               "for CUDA 13.0 (580.65.06 or later), and this one's is 535.104.05: update the driver")
    (tools / "nvidia-smi").write_text(smi_of("575.57.08"))  # one a CUDA 12 build runs: named
    assert cuda.cuda_problem().endswith("this one's is 575.57.08: update the driver, or install the build it runs "
                                        "(ops/install --torch cu128)")
    (tools / "nvidia-smi").write_text(SMI)
    assert cuda.cuda_problem() == f"its {too_old}"
    gpus = load_config(profile="tiny").model_copy(deep=True)
    gpus.sweep.resources.gpus_per_trial = 1
    with pytest.raises(ConfigError, match=re.escape(f"sweep.resources.gpus_per_trial: this machine's {too_old}")):
        check_before_compute(gpus)
    check_before_compute(load_config(profile="tiny"))  # trials on the CPU: the CUDA build may be what it is for

    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch, "__version__", "2.13.0+cpu")
    assert cuda.cuda_problem() == ("its torch 2.13.0+cpu is the CPU build, though nvidia-smi lists 1 GPU(s): "
                                   "ops/install --torch cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cuda.cuda_problem() == ""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    (tools / "nvidia-smi").unlink()
    assert cuda.listed_gpus() is None and cuda.cuda_problem() == "nvidia-smi lists no GPU"
    check_before_compute(gpus)  # no GPU listed: Ray sees none either, and the resource check names it


SUDO_ASKING = """#!/bin/sh
# sudo as for a user whose sudo asks a password: -n says so and fails, anything else waits for the password
[ "$1" = -n ] && { echo "sudo: a password is required" >&2; exit 1; }
sleep 600
"""
RECORDED = """#!/bin/sh
echo "$0 $*" >>"$HOME/called"
"""


def test_the_test_tools_install_for_a_user_without_root_and_what_it_cannot_get_makes_its_tests_skip(monkeypatch):
    """ops/install-test-deps as a user who is not root and whose sudo asks a password (as `nobody` where the tests
    run as root), offline (no browser to download): it never waits for a password nor calls apt-get, succeeds at
    once, and says why the browser tests will skip; they then skip with that reason. (The scripts of `dvc plots
    show`'s page are vendored in tests/vendor/cdn/: nothing to download.)"""
    home = Path(tempfile.mkdtemp(prefix="user-", dir="/tmp"))
    try:
        home.chmod(0o777)
        # a python the user may run (this venv's may live in root's home)
        python = shutil.which("python3.11", path="/usr/bin:/usr/local/bin") or sys.executable
        tools = tool_path(home, sudo=SUDO_ASKING, **{"apt-get": RECORDED})
        (tools / "python3").symlink_to(python)
        as_user = ["runuser", "-u", "nobody", "--"] if os.getuid() == 0 else []
        subprocess.run(["chown", "-R", "nobody", str(home)], check=True) if as_user else None
        env = {"HOME": str(home), "PATH": str(tools), "CAPACITY_ATLAS_BROWSER_INDEX": (home / "none.json").as_uri()}
        began = time.monotonic()
        done = subprocess.run([*as_user, "env", "-i", *(f"{k}={v}" for k, v in env.items()),
                               str(ROOT / "ops" / "install-test-deps")], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and time.monotonic() - began < 60, done.stdout + done.stderr
        assert not (home / "called").exists()  # no apt-get without root
        cache = home / ".cache" / "capacity-atlas"
        reason = (cache / "browser-missing").read_text()
        assert reason.startswith("no headless Chromium: cannot download Chrome for Testing's chrome-headless-shell")
        assert "the browser tests will skip" in done.stderr
        monkeypatch.setenv("PATH", str(tools))
        monkeypatch.setattr(browser, "MISSING", cache / "browser-missing")
        monkeypatch.setattr(browser, "USER_BROWSER", home / "none")
        with pytest.raises(pytest.skip.Exception, match="no headless Chromium: cannot download"):
            browser.chromium()
    finally:
        shutil.rmtree(home, ignore_errors=True)
