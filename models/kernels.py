"""Which implementation the scans run: the Triton kernels (``models.selective_scan_triton``,
``models.linear_triton``) or the torch forms beside them. The switch lets a benchmark or a test run both side by
side:

    with kernels.use("torch"):      # the torch forms even on CUDA
        ...

Triton is imported only by the kernel modules, and only when a scan dispatches to them: a CPU install without
triton never imports it.

The kernels' autograd Functions run under ``torch.func.vmap`` too (the K models of a fused trial, ``models.fused``):
each has a ``vmap`` rule that folds the model axis into an axis the kernel already loops over (``fold``, ``unfold``),
so K models are one launch, not K.
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


def fold(t: torch.Tensor | None, dim: int | None, size: int, into: int = 0) -> torch.Tensor | None:
    """Under vmap: a Function input whose model axis (of ``size`` models) is ``dim`` (None: shared by every model,
    expanded) -> the model axis merged into axis ``into``, model-major: (..., size * n, ...). None stays None."""
    if t is None:
        return None
    t = t.movedim(dim, into) if dim is not None else t.unsqueeze(into).expand(*t.shape[:into], size, *t.shape[into:])
    return t.flatten(into, into + 1)


def unfold(t: torch.Tensor, size: int, at: int = 0) -> torch.Tensor:
    """``fold``'s inverse on an output: axis ``at``, (size * n) long, split into (size, n); the model axis is ``at``."""
    return t.unflatten(at, (size, -1))
