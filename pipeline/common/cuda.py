"""Whether this machine's torch can use the GPUs its NVIDIA driver lists: asked of the driver's own machine before a
sweep that trains on GPUs starts (``pipeline.sweep.check_before_compute``) and of every node by the sweep's probe
(``pipeline.scheduling.cluster.probe``), so that a CUDA build newer than a node's driver is named there, with the
driver it needs, instead of every trial on that node failing.

``DRIVER_FOR``: NVIDIA's minimum driver for each CUDA version of torch's builds (the CUDA toolkit's release notes,
table 3); ``BUILDS``: the CUDA builds ops/install installs (its ``--torch``), newest first, and their CUDA versions.
ops/install, which runs before any Python environment exists, keeps the same tables (tests/test_install.py holds
them equal).
"""

from __future__ import annotations

import subprocess

DRIVER_FOR = {"13.0": "580.65.06", "12.9": "575.51.03", "12.8": "570.26", "12.6": "560.28.03", "12.4": "550.54.14"}
BUILDS = {"cuda": "13.0", "cu128": "12.8", "cu126": "12.6"}


def newest_build(driver: str) -> str | None:
    """The newest of ``BUILDS`` a driver of version ``driver`` runs, or None."""

    def version(text: str) -> tuple[int, ...]:
        return tuple(int(part) for part in text.split(".") if part.isdigit())

    return next((b for b, cuda in BUILDS.items() if version(driver) >= version(DRIVER_FOR[cuda])), None)


def listed_gpus() -> tuple[int, str] | None:
    """The GPUs nvidia-smi lists and their driver's version, or None where there is no nvidia-smi or it lists none."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    versions = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return (len(versions), versions[0]) if out.returncode == 0 and versions else None


def cuda_problem() -> str:
    """'' where this machine's torch can use a GPU, else why not: no GPU listed, or ``unusable_gpus``'s reason."""
    import torch

    return "" if torch.cuda.is_available() else unusable_gpus() or "nvidia-smi lists no GPU"


def unusable_gpus() -> str:
    """'' where nvidia-smi lists no GPU or this machine's torch can use one, else why its torch cannot use those it
    lists: the CPU build of torch, or a CUDA build the driver is too old for (naming both, the driver the build needs
    and the build the driver runs). What a sweep asks before trials on GPUs: where none is listed, Ray sees none
    either, and its resource check names the missing GPU."""
    import torch

    listed = None if torch.cuda.is_available() else listed_gpus()
    if listed is None:
        return ""
    gpus, driver = listed
    build, version = torch.version.cuda, torch.__version__
    if build is None:
        return f"its torch {version} is the CPU build, though nvidia-smi lists {gpus} GPU(s): ops/install --torch cuda"
    need, runs = DRIVER_FOR.get(build), newest_build(driver)
    return (
        f"its torch {version} (CUDA {build}) cannot use the {gpus} GPU(s) nvidia-smi lists: it needs an NVIDIA "
        f"driver for CUDA {build}{f' ({need} or later)' if need else ''}, and this one's is {driver}: update the "
        f"driver{f', or install the build it runs (ops/install --torch {runs})' if runs else ''}"
    )
