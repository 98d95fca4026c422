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
import traceback
from collections.abc import Callable

import torch

from pipeline.common.config import StepMode

log = logging.getLogger(__name__)

# torch.compile keeps one cache entry per shape and model on a forward's code object, shared by every model of a class,
# and past its recompile limit (8) runs the frame eager without a word: a process that compiles more models than that
# (bench_pack's rows; a Ray actor reused across trials) would train eager under a "graphed" label. So the limit is
# raised, and hitting it raises, so that the step falls back eager and says so: set once for the process where a step
# compiles (a config.patch around every call costs about 0.2 ms of host time a step).
RECOMPILE_LIMIT = 64


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


class Compiled:
    """``fn`` as ``sweep.resources.step`` runs it (``compiled``: under torch.compile; ``graphed``: its reduce-overhead
    mode, CUDA graphs), eager where that mode cannot run: ``mode`` says what ran last, ``why`` why it is not the mode
    asked for, ``graph_breaks`` how many times compiling it broke the graph."""

    def __init__(self, fn: Callable, step: StepMode, device: torch.device):
        self.fn = fn
        self.mode, self.why = effective(step, device)
        self.graph_breaks = 0
        self.compiled: Callable | None = None
        if self.why:
            log.warning(self.why)
        if self.mode != "eager":
            # dynamic=False: one graph (and one compilation) a shape, as CUDA graphs need
            mode = "reduce-overhead" if self.mode == "graphed" else None
            self.compiled = torch.compile(fn, dynamic=False, mode=mode)
            config = torch._dynamo.config
            config.recompile_limit = max(RECOMPILE_LIMIT, config.recompile_limit)
            config.fail_on_recompile_limit_hit = True

    def __call__(self, *args, **kwargs):
        if self.compiled is None:
            return self.fn(*args, **kwargs)
        before = graph_breaks()
        if self.mode == "graphed":
            # a new step: the graphs' memory from earlier steps may be reused (nothing reads their outputs again), as
            # CUDA-graph trees need where more than one model is graphed in a process (bench_pack's rounds; a Ray
            # actor reused across trials), lest they take one model's step for the continuation of another's
            torch.compiler.cudagraph_mark_step_begin()
        try:
            out = self.compiled(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 (compilation raises many types); what it runs is unchanged by it
            self.why = f"sweep.resources.step: {self.mode} failed ({failure(err)}); eager"
            log.warning(self.why)
            self.mode, self.compiled = "eager", None
            return self.fn(*args, **kwargs)
        new = {reason: n - before.get(reason, 0) for reason, n in graph_breaks().items() if n > before.get(reason, 0)}
        if new:  # compiled just now, in pieces
            self.graph_breaks += sum(new.values())
            first = next(iter(new)).strip().splitlines()[0]
            n = sum(new.values())
            log.warning("sweep.resources.step: %s in pieces, %d graph breaks (the first: %s)", self.mode, n, first)
        return out


class StepForward(Compiled):
    """The model's training forward, (B, T) tokens -> (B, T, V) logits (or (B, R, V) at positions ``at=``), as
    ``sweep.resources.step`` runs it."""

    def __init__(self, model: torch.nn.Module, step: StepMode, device: torch.device):
        super().__init__(model, step, device)
        self.model = model


def failure(err: BaseException) -> str:
    """What went wrong, and where where it says nothing (a bare ``assert`` deep in torch's CUDA-graph code): the type,
    the message or the innermost frame, and the cause."""
    text = str(err).strip()[:300]
    if isinstance(err, torch._dynamo.exc.FailOnRecompileLimitHit):
        text = "this process has compiled this forward for torch._dynamo.config.recompile_limit models or shapes"
    elif not text:
        frames = traceback.extract_tb(err.__traceback__)
        text = f"at {frames[-1].filename}:{frames[-1].lineno}" if frames else "no message"
    cause = err.__cause__
    return f"{type(err).__name__}: {text}" + (f" (from {type(cause).__name__})" if cause is not None else "")
