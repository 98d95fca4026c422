"""Members of a fused model for the tests (``tests/test_fused.py``, ``tests/test_gpu.py``): ``members``, K models of
one shape, each from its own seed."""

from __future__ import annotations

import torch

import models

VOCAB, LENGTH = 11, 20  # the members' vocabulary and max_len unless given


def members(arch: str, dtype=torch.float64, k: int = 3, **shape) -> list:
    """``k`` models of one shape (``shape`` overrides width 16, depth 2, 2 heads, no dropout), each from its own seed,
    as a cell's seeds differ; float64 by ``.double()``, which keeps DSS's complex parameter complex."""
    out = []
    for seed in range(k):
        torch.manual_seed(seed)
        args = dict(vocab_size=VOCAB, width=16, depth=2, heads=2, max_len=LENGTH, dropout=0.0) | shape
        model = models.build_model(arch, **args)
        out.append(model.double() if dtype == torch.float64 else model)
    return out
