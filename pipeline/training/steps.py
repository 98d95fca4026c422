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

A fused trial's step graphed is graphed whole (``GraphedStep``): forward, backward, each member's clip and
``FusedAdam``'s update, recorded as one CUDA graph per input shape (torch's "whole-network capture"), a step one replay
and the copies of its batch in. Its optimizer keeps every factor on the device (no host sync, a member's rate and
warm-up as tensors), so a graph holds it; what the host decides (which members are frozen, the flat buffers) is the
optimizer's ``program``, and a new one is recorded anew.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch

from pipeline.common.config import StepMode

log = logging.getLogger(__name__)

# torch.compile keeps one cache entry per shape and model on a forward's code object, shared by every model of a class,
# and past its recompile limit (8) runs the frame eager without a word: a process that compiles more models than that
# (bench_pack's rows; a Ray actor reused across trials) would train eager under a "graphed" label. So the limit is
# raised, and hitting it raises, so that the step falls back eager and says so: set once for the process where a step
# compiles (a config.patch around every call costs about 0.2 ms of host time a step).
RECOMPILE_LIMIT = 64
# A whole step is run eagerly this many times a shape before it is recorded: the lazy work of a first step (cuBLAS's
# handles, the autograd engine's device threads, the optimizer's flat buffers) may not happen inside a capture, and
# torch's recipe warms up on a side stream. At most GRAPHS shapes are recorded (each holds its activations).
WARMUP = 3
GRAPHS = 4


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


# a recorded step's: its inputs' shapes and dtypes (None for an input that is None), and the host's program
Key = tuple[tuple, Hashable]


@dataclass
class Recorded:
    """One recorded step: its graph, the static inputs it reads (a call copies its tensors into them) and its
    output (overwritten by each replay)."""

    graph: torch.cuda.CUDAGraph
    inputs: tuple[torch.Tensor | None, ...]
    output: torch.Tensor


class GraphedStep:
    """``fn``, a whole training step of tensors only (forward, backward, clip, optimizer update; no host sync), run
    on a GPU as CUDA graphs: ``WARMUP`` eager steps of a shape (on a side stream), then that shape recorded and every
    later step of it one replay. A step is one step either way: the one that records also replays.

    A graph is of one shape and of the host's decisions at its recording: ``program()`` names them (a fused
    optimizer's frozen members, its buffers), and a step under a new program warms up and records anew, the old
    graphs dropped. Where graphs cannot run (no GPU: the CPU twin, which runs ``fn`` eagerly and keeps the same
    books; a recording that failed) the step runs eagerly and ``why`` says so; so do shapes past ``GRAPHS``, logged.
    ``replays`` and ``eager`` count the steps run each way, ``warmed`` the eager ones of each (shapes, program)."""

    graph_breaks = 0  # recorded whole: of a replayed step, only the copies of its inputs run outside its graph

    def __init__(self, fn: Callable[..., torch.Tensor], device: torch.device, program: Callable[[], Hashable]):
        self.fn, self.device, self.program = fn, device, program
        self.graphs: dict[Key, Recorded] = {}
        self.warmed: dict[Key, int] = {}
        # one memory pool for all its graphs
        self.pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None
        self.why = "" if device.type == "cuda" else f"a whole step graphed needs a GPU; on {device.type} it runs eager"
        self.replays, self.eager = 0, 0

    @property
    def mode(self) -> StepMode:
        return "eager" if self.why else "graphed"

    def __call__(self, *inputs: torch.Tensor | None) -> torch.Tensor:
        key: Key = (tuple(None if t is None else (tuple(t.shape), t.dtype) for t in inputs), self.program())
        recorded = self.graphs.get(key)
        if recorded is not None:
            for static, t in zip(recorded.inputs, inputs):
                if static is not None and t is not None:
                    static.copy_(t)
            recorded.graph.replay()
            self.replays += 1
            return recorded.output
        self.eager += 1
        self.warmed[key] = warmed = self.warmed.get(key, 0) + 1
        if self.why:
            return self.fn(*inputs)
        if warmed <= WARMUP:
            return self.on_side_stream(*inputs)
        if len({shape for shape, _ in self.graphs}) >= GRAPHS:  # its shapes past the first GRAPHS run eager
            if warmed == WARMUP + 1:
                log.warning("sweep.resources.step: graphed whole: %s eager, past %d shapes recorded", key[0], GRAPHS)
            return self.fn(*inputs)
        return self.record(key, inputs)

    def on_side_stream(self, *inputs: torch.Tensor | None) -> torch.Tensor:
        """One eager step on a side stream, as torch's recipe warms up before a capture."""
        stream, current = torch.cuda.Stream(self.device), torch.cuda.current_stream(self.device)
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            out = self.fn(*inputs)
        current.wait_stream(stream)
        return out

    def record(self, key: Key, inputs: tuple[torch.Tensor | None, ...]) -> torch.Tensor:
        """Records the step of this shape and program (running nothing), then replays it once: this step."""
        self.graphs = {k: g for k, g in self.graphs.items() if k[1] == key[1]}  # an old program's are never replayed
        static = tuple(None if t is None else t.clone() for t in inputs)
        graph = torch.cuda.CUDAGraph()
        cache = torch.is_autocast_cache_enabled()
        torch.set_autocast_cache_enabled(False)  # casts cached across a capture would be freed under it
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                output = self.fn(*static)
        except Exception as err:  # noqa: BLE001 (a capture raises many types); the step then runs eager as it was
            self.why = f"a whole step graphed failed ({failure(err)}); eager"
            log.warning("sweep.resources.step: %s", self.why)
            return self.fn(*inputs)
        finally:
            torch.set_autocast_cache_enabled(cache)
        self.graphs[key] = Recorded(graph, static, output)
        log.info("sweep.resources.step: graphed whole (forward, backward, clip, optimizer): recorded for %s", key[0])
        graph.replay()
        self.replays += 1
        return output
