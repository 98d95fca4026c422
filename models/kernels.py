"""Which implementation the scans run: the Triton kernels (``models.selective_scan_triton``,
``models.linear_triton``) or the torch forms beside them. The switch lets a benchmark or a test run both side by
side:

    with kernels.use("torch"):      # the torch forms even on CUDA
        ...

Triton is imported only by the kernel modules, and only when a scan dispatches to them: a CPU install without
triton never imports it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
from collections.abc import Iterator
from typing import Literal

import torch

Backend = Literal["triton", "torch"]
BACKENDS: tuple[Backend, ...] = ("triton", "torch")
_backend: Backend = "triton"  # the default: Triton wherever it can run


@contextlib.contextmanager
def use(backend: Backend) -> Iterator[None]:
    """Inside the block, the scans run ``backend``: "torch" forces the torch forms even where Triton could run;
    "triton" (the default) runs the kernels where ``triton_ready``."""
    global _backend
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r}: one of {BACKENDS}")
    before, _backend = _backend, backend
    try:
        yield
    finally:
        _backend = before


@functools.cache
def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def triton_ready(*tensors: torch.Tensor) -> bool:
    """Whether the Triton kernels run on these tensors: the "triton" backend chosen, triton installed, and every
    tensor on CUDA, or every one on the CPU under Triton's interpreter (TRITON_INTERPRET=1: the CPU tests). Not in
    float64: the kernels accumulate in float32, and float64 is the dtype the torch forms are checked in."""
    devices = {t.device.type for t in tensors}
    on_device = devices == {"cuda"} or (devices == {"cpu"} and os.environ.get("TRITON_INTERPRET") == "1")
    wide = any(t.dtype == torch.float64 for t in tensors)
    return on_device and not wide and _backend == "triton" and triton_installed()
