"""Cells that fit: how many micro-batches a trial splits its batch into so that it fits the memory it was given.

A trial's memory = the static part (weights, gradients and AdamW's two moments: 16 bytes a parameter, float32 also under
mixed precision, where Lightning keeps float32 weights) + the activations autograd keeps for the backward pass, which
grow with the samples of one forward pass. Those are measured, not modelled: one forward pass of one sample at the
dataset's longest length, on the trial's device under its precision, with autograd's saved-tensor hooks (each storage
counted once), plus the logits and their gradient. The batch (``sweep.optim.batch_size``, per data-parallel worker) then
runs as ``micro_batches`` forward and backward passes whose gradients add up to the batch's
(``pipeline.training.batches`` weighs each part's loss by its share of the batch's predicted tokens).

The budget: ``sweep.resources.memory_gb_per_trial``, else the trial's share of its GPU (``gpus_per_trial`` below 1,
which the worker's allocator is also capped to), else none (a CPU trial runs its whole batch at once). A trial that does
not fit even one sample per pass raises ``DoesNotFit``, which says how many GB it needs; the trainable records it as
failed with that reason, without retrying it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch

from pipeline.common.status import Status

BYTES_PER_PARAMETER = 16  # float32 weight, gradient and AdamW's exp_avg and exp_avg_sq
# the backward pass holds, besides what the forward saved, the gradients of the layer it is in and the allocator's
# rounding: measured peaks on CUDA stay within this margin of saved bytes + static (bench_gpu prints both)
HEADROOM = 1.25
GB = 1e9
# what a CUDA process holds outside its caching allocator (its context, the libraries' handles and modules), which
# set_per_process_memory_fraction does not cap: each of the processes that share a GPU leaves this much of its share
# (bench_pack's packing rows measure it: 0.80 GB on an H200 under torch 2.11 and CUDA 13, docs/gpu.md)
CUDA_CONTEXT = 0.8 * GB
# makes the forward context of a trial's precision: a new one per pass, as Lightning's may be entered only once
Precision = Callable[[], AbstractContextManager]


class DoesNotFit(RuntimeError):
    """Even one sample per forward pass needs more memory than the trial was given."""

    def record(self) -> dict:
        """The trial's record: failed, with how much it needs (a retry would not fit either)."""
        return {"status": Status.FAILED, "reason": f"does not fit: {self}", "train_steps": 0}


@dataclass(frozen=True)
class MemoryFit:
    """A trial's measured memory and the micro-batches it trains in."""

    budget: float | None  # bytes a worker may fill; None: no limit
    static: int  # bytes: weights, gradients, optimiser state
    per_sample: int  # bytes of activations one sample of the longest length keeps for backward
    micro_batches: int

    def needed(self, samples: int) -> float:
        """Bytes a forward and backward pass of ``samples`` samples needs (with the headroom)."""
        return HEADROOM * (self.static + samples * self.per_sample)


def activation_bytes(model: torch.nn.Module, length: int, device: torch.device, precision: Precision) -> int:
    """Bytes of activations one sample of ``length`` tokens keeps for the backward pass, measured on ``device`` under
    ``precision`` (it makes a context of the trial's precision): each saved storage once, plus the logits and their
    gradient in float32. On CUDA, the larger of that and a training pass's measured peak growth per sample
    (``transient_bytes``)."""
    storages: dict[tuple, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        storages[(s.device, s.data_ptr())] = s.nbytes()
        return t

    tokens = torch.zeros(1, length, dtype=torch.long, device=device)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), precision():
        logits = model(tokens)  # (1, length, V)
    saved = sum(storages.values()) + 2 * logits.numel() * 4
    del logits
    if device.type != "cuda":
        return saved
    return max(saved, transient_bytes(model, length, device, precision))


def transient_bytes(model: torch.nn.Module, length: int, device: torch.device, precision: Precision) -> int:
    """How much a forward and backward pass's peak CUDA memory grows per sample: peak(2 samples) - peak(1).

    Saved tensors miss what a pass builds and frees, such as the (B, T, E, N) states that the torch form of the
    Mamba scan recomputes in its backward. The slope between two batch sizes leaves out what does not grow with the
    batch (gradients, cuBLAS workspaces: a warm-up pass allocates them first)."""

    def peak(samples: int) -> int:
        tokens = torch.zeros(samples, length, dtype=torch.long, device=device)
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        with precision():
            logits = model(tokens)  # (samples, length, V)
        logits.float().sum().backward()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before

    peak(1)  # warm-up: gradients and workspaces
    slope = peak(2) - peak(1)
    model.zero_grad(set_to_none=True)
    return slope


def fit_memory(
    model: torch.nn.Module, length: int, batch: int, budget: float | None, device: torch.device, precision: Precision
) -> MemoryFit:
    """The fewest micro-batches whose forward and backward pass fits ``budget`` bytes (1 without a budget)."""
    static = BYTES_PER_PARAMETER * sum(p.numel() for p in model.parameters())
    per_sample = activation_bytes(model, length, device, precision)
    fit = MemoryFit(budget, static, per_sample, 1)
    if budget is None:
        return fit
    room = budget / HEADROOM - static  # bytes left for activations
    if room < per_sample:
        raise DoesNotFit(
            f"needs {fit.needed(1) / GB:.3g} GB at one sample per forward pass (weights and optimiser state "
            f"{static / GB:.3g} GB, activations of one sample of {length} tokens {per_sample / GB:.3g} GB, "
            f"x {HEADROOM} headroom), has {budget / GB:.3g} GB (sweep.resources.memory_gb_per_trial, or the "
            "trial's GPU share)"
        )
    return MemoryFit(budget, static, per_sample, math.ceil(batch / math.floor(room / per_sample)))


def budget_bytes(memory_gb: float | None, gpu_share: float, device: torch.device) -> float | None:
    """The memory one worker may fill: the configured figure, else its share of the GPU (``memory_cap``), else no
    limit."""
    if memory_gb is not None:
        return memory_gb * GB
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        return memory_cap(gpu_share, total) * total
    return None


def memory_cap(share: float, total: float, context: float = CUDA_CONTEXT) -> float:
    """The fraction of a GPU of ``total`` bytes that a process training on ``share`` of it may allocate: the whole GPU
    for a share of 1, else its share less a CUDA context, so that the 1 / share processes packed on it fit together,
    contexts included. Raises DoesNotFit where a share holds no more than a context."""
    if share >= 1:
        return 1.0
    cap = share - context / total
    if cap <= 0:
        raise DoesNotFit(
            f"a share of {share:g} of a GPU of {total / GB:.3g} GB is {share * total / GB:.3g} GB, no more than the "
            f"{context / GB:.3g} GB a CUDA process holds outside its allocator: pack fewer trials a GPU "
            "(sweep.resources.gpus_per_trial)"
        )
    return cap
