"""Kernel launches and host syncs per optimizer step of a trial's real step, alone and K fused, counted on a CPU.

    python -m benchmarks.bench_launches [--archs A ...] [--depths 1 6] [--k 7] [--precisions 32-true bf16-mixed]
                                        [--tasks index_lookup eq_ncp] [--graphed] [--out FILE]

A narrow model's step on a GPU costs its kernel launches and its host syncs, not its FLOPs (4-11 ms an H100 step at
the separations paper's shapes, whatever the width): a fused trial of K learning rates pays off as far as it
launches fewer kernels than K trials alone. Both are counts, the same on any machine, so they are taken here on the
CPU, in CI, for every architecture a fused trial can stack (``LanguageModel.unbatched`` is None), under the
`separations` profile's recipe (Adam, no clip, no warm-up): each side a trial's own Lightning fit
(``pipeline.costs.throughput.measure``: the module, its loss, the verdict's checks, the optimizer), its steps counted
after two of warm-up by a ``TorchDispatchMode`` (``Launches``):

- kernel-like ops: every ATen op the step dispatches, forward, backward and optimizer, but views and bare
  allocations; a ``_foreach_*`` op counts once (it is one launch on CUDA);
- host syncs: an op that reads a device value back (``item``, ``nonzero``, a boolean index) or a ``tolist`` /
  ``numpy`` (on a GPU a copy to the host the step waits for).

Attention is counted as PyTorch's math kernel, whose ops vmap batches, as CUDA's fused attention kernels batch (the
CPU's own fused kernel has no batching rule: its K members would run one by one, as no GPU runs them). Shapes are
small (width 16, L = 24, batch 8): the counts do not depend on them. The cells are index lookup's (a classification,
the separations paper's headline task) and eq_ncp's (next-character prediction: its own loss and targets). The test
(tests/test_benchmarks.py) holds the targets: K x alone / fused at least 4 for every architecture at depths 1 and 6,
and no host sync in a step. The table: docs/benchmarks.md, "Kernel launches a step".

``--graphed`` adds the fused trial graphed whole (``sweep.resources.step: graphed``: forward, backward, clip and
update as one CUDA graph, ``pipeline.training.steps.GraphedStep``) as a GPU would launch it: the ops of its eager twin
outside the graph (Lightning's loop, the batch, the verdicts' checks) counted as above, the graph as one replay and
a copy of each of its inputs. An estimate of the GPU's launches from the CPU's program: that the graph records and
replays is the GPU tests' to show.

``--validation`` counts instead what scoring a fused trial's K members costs at a validation, as a classification
decodes (its answer and <eos>, 2 tokens: here each row runs to the cache's end 2 tokens after its prompt, as a
trained classifier stops at its <eos>): each member copied out and decoded alone with its cache, as a chain of
thought is scored, against the K members' batched decode (``Fused.greedy``), which a classification's is.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections import Counter
from dataclasses import replace

import lightning as L
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.optim import adam
from torch.utils._python_dispatch import TorchDispatchMode

import models
from benchmarks.results import Results, figure, out_option, out_path
from models.fused import Fused
from pipeline.common.config import Config, Precision, StepMode, VerdictSection, load_config
from pipeline.costs.throughput import measure
from pipeline.search.cells import defined_cells
from pipeline.training.verdict import Verdict

PROFILE = "separations"
WIDTH, LENGTH, BATCH = 16, 24, 8
WARMUP, STEPS = 2, 2
VOCAB, NEVER = 20, -1  # a validation's: its vocabulary, and a stop token no model produces
ALLOCATIONS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh", "set_",
               "resize_", "_local_scalar_dense", "_unsafe_view", "_reshape_alias"}  # fmt: skip
SYNCS = {"_local_scalar_dense", "nonzero", "masked_select", "is_nonzero", "equal", "item"}


def fusable() -> list[str]:
    """The architectures a fused trial stacks: those vmap batches (``LanguageModel.unbatched`` None)."""
    out = []
    for name in sorted(models.ARCHITECTURES):
        model = models.build_model(name, vocab_size=8, width=8, depth=1, heads=2, max_len=8, dropout=0.0)
        if model.unbatched is None:
            out.append(name)
    return out


class Launches(TorchDispatchMode):
    """Counts what a step dispatches (see the module's docstring): ``kernels`` and ``syncs``, by op name in
    ``ops``."""

    def __init__(self):
        super().__init__()
        self.kernels = self.syncs = 0
        self.ops: Counter[str] = Counter()
        self.saved = {}
        self.host: set[int] = set()  # tensors a GPU keeps on the host (torch's Adam step counts): no sync to read
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.paused:  # inside a graph: one replay on a GPU, counted by its caller
            return func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        indices = args[1] if name in ("index", "index_put_", "index_put") and len(args) > 1 else ()
        bool_index = any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices)
        if (name in SYNCS and not (args and id(args[0]) in self.host)) or bool_index:
            self.syncs += 1
            self.ops[f"sync:{name}"] += 1
        if not func.is_view and name not in ALLOCATIONS:
            self.kernels += 1
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        for method in ("tolist",):  # a host read with no ATen op on a CPU tensor (numpy: CPU kernels only)
            original = getattr(torch.Tensor, method)
            self.saved[method] = original

            def read(tensor, *a, _original=original, _name=method, **k):
                self.syncs += 1
                self.ops[f"sync:{_name}"] += 1
                return _original(tensor, *a, **k)

            setattr(torch.Tensor, method, read)
        return super().__enter__()

    def __exit__(self, *exc):
        for method, original in self.saved.items():
            setattr(torch.Tensor, method, original)
        return super().__exit__(*exc)


class CountSteps(L.Callback):
    """A ``Launches`` over the fit's steps after ``warmup``, through ``steps`` of them (each from its batch's start,
    the data, Lightning's loop and every callback's work included)."""

    def __init__(self, warmup: int, steps: int):
        self.warmup, self.steps = warmup, steps
        self.mode = Launches()
        self.counting = False

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        if trainer.global_step == self.warmup:
            states = trainer.optimizers[0].state.values()
            self.mode.host = {id(s["step"]) for s in states if isinstance(s.get("step"), torch.Tensor)}
            whole = getattr(module, "whole", None)
            if whole is not None:  # a whole step graphed (its CPU twin): what runs inside it is one replay
                whole.fn = self.replayed(whole.fn)
            self.mode.__enter__()
            self.counting = True
        elif trainer.global_step == self.warmup + self.steps:
            self.stop()

    def replayed(self, fn):
        """``fn``, a graphed whole step's program, counted as a GPU launches it once recorded: one replay, and a copy
        of each input into the graph's own."""

        def run(*inputs):
            if self.counting:
                launches = 1 + sum(t is not None for t in inputs)
                self.mode.kernels += launches
                self.mode.ops["graph replay and its inputs' copies"] += launches
            self.mode.paused = True
            try:
                return fn(*inputs)
            finally:
                self.mode.paused = False

        return run

    def on_train_end(self, trainer, module) -> None:
        self.stop()

    def stop(self) -> None:
        if self.counting:
            self.mode.__exit__(None, None, None)
            self.counting = False


def replace_rules(cfg) -> VerdictSection:
    return cfg.sweep.verdict.model_copy(update={"max_budget_factor": 1})


@contextlib.contextmanager
def as_on_cuda():
    """torch's Adam(W) as it defaults on CUDA, its ``_foreach`` implementation (on a CPU it defaults to a loop over
    the parameters, a dozen ops each)."""
    chosen = adam._default_to_fused_or_foreach
    adam._default_to_fused_or_foreach = lambda *a, **k: (False, True)
    try:
        yield
    finally:
        adam._default_to_fused_or_foreach = chosen


def on_one_thread(cfg: Config) -> Config:
    """``cfg`` with a trial on one CPU thread: threads change no op's count, and two on a busy 2-core machine (the
    test tier's other worker) ran a count 2-3x slower than one."""
    resources = cfg.sweep.resources.model_copy(update={"cpus_per_trial": 1})
    return cfg.model_copy(update={"sweep": cfg.sweep.model_copy(update={"resources": resources})})


def count(
    arch: str, depth: int, k: int, precision: Precision, task: str = "index_lookup", step: StepMode = "eager"
) -> dict:
    """Per optimizer step of ``arch`` at ``depth`` on ``task``: kernel-like ops and host syncs, one trial alone
    (``k`` 1) or ``k`` fused; ``step`` graphed: the fused trial's whole step as one graph, its eager twin's ops
    outside it counted, and it as a GPU replays it (``CountSteps.replayed``)."""
    cfg = on_one_thread(load_config(profile=PROFILE))
    base = next(c for c in defined_cells(cfg).values() if c.task == task)  # as the profile runs it, arch replaced
    cell = replace(base, cell=base.cell._replace(arch=arch, width=WIDTH, depth=depth), max_len=LENGTH, arch_options={})
    counter = CountSteps(WARMUP, STEPS)
    # a trial alone checks its verdict every step (a fused one's Members does): here too, its budget never extended
    checks = [] if k > 1 else [Verdict(cfg.report.accuracy_threshold, replace_rules(cfg))]
    with sdpa_kernel(SDPBackend.MATH), as_on_cuda():
        measure(cfg, cell, length=LENGTH, batch=BATCH, steps=STEPS + 1, warmup=WARMUP, device=torch.device("cpu"),
                precision=precision, models=k, callbacks=[counter, *checks], step=step)  # fmt: skip
    mode = counter.mode
    return {"kernels": mode.kernels / STEPS, "syncs": mode.syncs / STEPS,
            "top": dict(mode.ops.most_common(8))}  # fmt: skip


def table(
    archs: list[str],
    depths: list[int],
    k: int,
    precisions: list[Precision],
    task: str = "index_lookup",
    graphed: bool = False,
) -> list[dict]:
    """A row per (precision, depth, architecture): one trial alone against ``k`` fused; ``graphed``: also the fused
    trial graphed whole, as a GPU would launch it."""
    rows = []
    for precision in precisions:
        for depth in depths:
            for arch in archs:
                alone, fused = count(arch, depth, 1, precision, task), count(arch, depth, k, precision, task)
                row = {"task": task, "arch": arch, "depth": depth, "precision": precision, "k": k,
                       "alone_kernels": alone["kernels"], "fused_kernels": fused["kernels"],
                       "ratio": k * alone["kernels"] / fused["kernels"],
                       "alone_syncs": alone["syncs"], "fused_syncs": fused["syncs"],
                       "fused_top_ops": fused["top"]}  # fmt: skip
                line = (f"{task:12} {arch:15} d{depth} {precision:10} alone {row['alone_kernels']:6.0f}  {k} fused "
                        f"{row['fused_kernels']:6.0f}  {k} x alone / fused {row['ratio']:5.2f}  syncs "
                        f"{row['alone_syncs']:.0f} / {row['fused_syncs']:.0f}")  # fmt: skip
                if graphed:
                    whole = count(arch, depth, k, precision, task, step="graphed")
                    row |= {"graphed_kernels": whole["kernels"],
                            "graphed_ratio": k * alone["kernels"] / whole["kernels"],
                            "graphed_syncs": whole["syncs"], "graphed_top_ops": whole["top"]}  # fmt: skip
                    line += f"  graphed whole {whole['kernels']:4.0f} ({row['graphed_ratio']:5.1f}x)"
                rows.append(row)
                print(line, flush=True)
    return rows


def validation(arch: str, depth: int, k: int) -> dict:
    """Kernel-like ops and host syncs of scoring ``k`` members' greedy answers, one by one and batched."""
    members = []
    for seed in range(k):
        torch.manual_seed(seed)
        members.append(models.build_model(arch, vocab_size=VOCAB, width=WIDTH, depth=depth, heads=2,
                                          max_len=LENGTH, dropout=0.0).eval())  # fmt: skip
    fused = Fused(members).eval()
    prompts = torch.randint(0, VOCAB, (BATCH, LENGTH - 1))  # 2 tokens to the cache's end
    counts = {}
    with sdpa_kernel(SDPBackend.MATH), torch.no_grad():
        for side, score in (("alone", lambda: [fused.member(m).eval().greedy(prompts, NEVER) for m in range(k)]),
                            ("fused", lambda: fused.greedy(prompts, NEVER))):  # fmt: skip
            with Launches() as mode:
                score()
            counts[side] = mode
    alone, batched = counts["alone"], counts["fused"]
    ratio = alone.kernels / batched.kernels
    print(f"validation   {arch:15} d{depth} alone {alone.kernels:6d}  {k} batched {batched.kernels:6d}  alone / "
          f"batched {ratio:5.2f}  syncs {alone.syncs} / {batched.syncs}", flush=True)  # fmt: skip
    return {"arch": arch, "depth": depth, "precision": "32-true", "ratio": ratio,
            "alone_kernels": alone.kernels, "fused_kernels": batched.kernels,
            "alone_syncs": alone.syncs, "fused_syncs": batched.syncs}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_launches", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    ap.add_argument("--archs", nargs="+", help="architectures (default: every fusable one)")
    ap.add_argument("--depths", nargs="+", type=int, default=[1, 6], help="depths (default: 1 6)")
    ap.add_argument("--k", type=int, default=7, help="members of a fused trial (default: 7, the paper's rates)")
    ap.add_argument("--precisions", nargs="+", default=["32-true", "bf16-mixed"], choices=["32-true", "bf16-mixed"])
    ap.add_argument("--tasks", nargs="+", default=["index_lookup", "eq_ncp", "validation"],
                    choices=["index_lookup", "eq_ncp", "validation"],
                    help="the cells' tasks, a training step's (index_lookup eq_ncp: a classification and the ncp "
                         "loss), and validation: scoring the members (fp32; default: all three)")
    ap.add_argument("--graphed", action="store_true",
                    help="also the fused trial graphed whole (sweep.resources.step: graphed), as a GPU launches it: "
                         "its eager twin's ops outside its graph, one replay and its inputs' copies")  # fmt: skip
    out_option(ap, "bench_launches", quick_note=False)
    args = ap.parse_args(argv)
    archs = args.archs or fusable()
    unknown = sorted(set(archs) - set(fusable()))
    if unknown:
        ap.error(f"not fusable or not registered: {unknown}; fusable: {fusable()}")
    results = Results("bench_launches", argv)
    for task in args.tasks:
        settings = {"profile": PROFILE, "task": task, "k": args.k, "width": WIDTH, "length": LENGTH, "batch": BATCH,
                    "counted_steps": STEPS, "after": WARMUP}  # fmt: skip
        if task == "validation":
            settings = {"k": args.k, "width": WIDTH, "prompt": LENGTH - 1, "decoded": 2, "batch": BATCH}
            rows = [validation(arch, depth, args.k) for depth in args.depths for arch in archs]
        else:
            rows = table(archs, args.depths, args.k, args.precisions, task, graphed=args.graphed)
        per = "ops a validation batch" if task == "validation" else "ops a step"
        figures = results.section(task, settings)
        for row in rows:
            figures[f"{row['arch']} d{row['depth']} {row['precision']}"] = {
                name: figure(row[key], unit)
                for name, key, unit in (
                    ("alone kernels", "alone_kernels", per),
                    (f"{args.k} fused kernels", "fused_kernels", per),
                    (f"{args.k} x alone / fused", "ratio", "x"),
                    ("alone syncs", "alone_syncs", per.removeprefix("ops ")),
                    ("fused syncs", "fused_syncs", per.removeprefix("ops ")),
                    (f"{args.k} fused graphed whole, launches", "graphed_kernels", per),
                    (f"{args.k} x alone / graphed whole", "graphed_ratio", "x"),
                    ("graphed whole syncs", "graphed_syncs", per.removeprefix("ops ")),
                )
                if key in row
            }
    results.write(out_path(args, "bench_launches"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
