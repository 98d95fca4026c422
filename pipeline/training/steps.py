"""How a trial's training step runs (``sweep.resources.step``): eager, compiled, or graphed, eager the fallback of both.

A narrow model's step on a GPU is bound by kernel launches and host work, not by its FLOPs: an H100 took 5.5 ms for a
1-layer Transformer step at width 64 and 5.95 ms at width 512 (docs/gpu.md). ``compiled`` runs the model's training
forward (and so its backward) through ``torch.compile``: fewer, fused kernels. ``graphed`` adds CUDA graphs
(``torch.compile``'s reduce-overhead mode): the step's kernels are recorded once per input shape and replayed by one
launch. A graph holds one shape, so a graphed trial's batches are padded to the dataset's longest sequence
(``pad_to``): the models are causal, so padding after a sequence changes none of its logits, and the padded targets
are ignored; the FLOP count reads the real lengths. Without a GPU, ``graphed`` trains eager and says so.

Compilation happens at the first step of each shape; a model it cannot compile trains eager from there on, and says
why (``StepForward``). A model that compiles in pieces (a graph break: an op torch.compile leaves to Python, such as
Mamba's numba scan on the CPU) is counted (``graph_breaks``) and its log says so, with the first reason: "compiled"
then means its pieces, not one graph. Decoding (validation's greedy answers, the test set) always runs the eager
model: its cached one-token steps are another program.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from pipeline.common.config import StepMode

log = logging.getLogger(__name__)


def effective(step: StepMode, device: torch.device) -> tuple[StepMode, str]:
    """The step mode that runs on ``device``, and why it is not ``step`` ("" when it is)."""
    if step == "graphed" and device.type != "cuda":
        return "eager", f"sweep.resources.step: graphed needs a GPU (CUDA graphs); on {device.type} the step runs eager"
    return step, ""


def pad_to(step: StepMode, device: torch.device, longest: int) -> int | None:
    """The length every training batch is padded to: the dataset's longest input where the step is graphed (one shape
    a graph), else None (each batch to its own longest)."""
    return longest if effective(step, device)[0] == "graphed" else None


def graph_breaks() -> dict[str, int]:
    """torch.compile's graph breaks in this process so far, by reason."""
    from torch._dynamo.utils import counters

    return dict(counters["graph_break"])


class StepForward:
    """The model's training forward, (B, T) tokens -> (B, T, V) logits, as ``sweep.resources.step`` runs it; eager where
    that mode cannot run (``mode`` says what ran last, ``why`` why it is not the mode asked for, ``graph_breaks`` how
    many times compiling it broke the graph)."""

    def __init__(self, model: torch.nn.Module, step: StepMode, device: torch.device):
        self.model = model
        self.mode, self.why = effective(step, device)
        self.graph_breaks = 0
        self.compiled: Callable[[torch.Tensor], torch.Tensor] | None = None
        if self.why:
            log.warning(self.why)
        if self.mode != "eager":
            # dynamic=False: one graph (and one compilation) a shape, as CUDA graphs need
            mode = "reduce-overhead" if self.mode == "graphed" else None
            self.compiled = torch.compile(model, dynamic=False, mode=mode)

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.compiled is None:
            return self.model(tokens)
        before = graph_breaks()
        try:
            out = self.compiled(tokens)
        except Exception as err:  # noqa: BLE001 (compilation raises many types); the model is unchanged by it
            self.why = (
                f"sweep.resources.step: {self.mode} failed ({type(err).__name__}: {str(err).strip()[:300]}); eager"
            )
            log.warning(self.why)
            self.mode, self.compiled = "eager", None
            return self.model(tokens)
        new = {reason: n - before.get(reason, 0) for reason, n in graph_breaks().items() if n > before.get(reason, 0)}
        if new:  # compiled just now, in pieces
            self.graph_breaks += sum(new.values())
            first = next(iter(new)).strip().splitlines()[0]
            n = sum(new.values())
            log.warning("sweep.resources.step: %s in pieces, %d graph breaks (the first: %s)", self.mode, n, first)
        return out
