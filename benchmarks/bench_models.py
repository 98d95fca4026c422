"""Model speed, measured side by side in one run on this machine (CPU). Every figure is the median of repeated
timings taken after warm-up, printed with its spread (min..max over the repeats); a ratio of two training
variants is taken round by round (both timed in the same round, so a slow spell of the machine hits both) and
printed the same way:

1. training tokens/s of every registered architecture, and its cost per token relative to standard
   (L=400, D=128, batch 32, depth 2, AdamW); local attention also at L=2048, blockwise against the dense masked call;
   a classification's step and greedy prefill at index lookup's shapes, whole forward against the answer's logits
   alone (``--answers-only``);
2. greedy decoding: our cached decoding vs recomputing the whole prefix every token (what the DP paper's evaluation
   does), checked to produce the same tokens, and the per-token cost early vs late in the sequence;
3. this CPU's peak (best torch.mm over several sizes) beside its theoretical figure, and training FLOP/s against it;
4. resident memory (``benchmarks.bench_memory``, run as a subprocess when present).

What Lightning costs a step against a bare loop is ``benchmarks.bench_pack``'s part ``lightning``, on any device.

    python -m benchmarks.bench_models                 # every section (about 15 minutes on 2 cores)
    python -m benchmarks.bench_models --quick         # a smoke run in seconds: checks the script, measures nothing
    python -m benchmarks.bench_models --training-only # section 1 alone (about 3 minutes)

The figures go to ``docs/benchmarks/bench_models.json`` (``--out``; a ``--quick`` run writes none unless given),
one section per part measured, each with its command line, date and commit (``benchmarks.results``); the
memory section goes to ``bench_memory.json`` beside it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

import models
from benchmarks.repeats import ratios, side_by_side, spread
from benchmarks.results import RESULTS, Results, figure, out_option, out_path
from models.attention import SoftmaxAttention

VOCAB = 64


def build(arch: str, width: int, depth: int, max_len: int, **options) -> models.LanguageModel:
    torch.manual_seed(0)
    return models.build_model(arch, vocab_size=VOCAB, width=width, depth=depth, heads=4, max_len=max_len,
                              dropout=0.0, **options).eval()


@dataclass
class Timing:
    """Seconds of repeated measurements: the median and the spread."""

    samples: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    def rate(self, work: float) -> str:
        """work / seconds as 'median (min..max)'."""
        rates = sorted(work / s for s in self.samples)
        return f"{work / self.median:9,.0f} ({rates[0]:,.0f}..{rates[-1]:,.0f})"

    def ratio(self, base: Timing) -> str:
        """self / base, round by round (both timed in the same rounds): 'median (min..max)' of the ratios."""
        return spread(ratios(self.samples, base.samples), ".2f", "x")

    def rate_figure(self, work: float, unit: str) -> dict:
        """work / seconds of every repeat, as a figure for the results file."""
        return figure([work / s for s in self.samples], unit)

    def ratio_figure(self, base: Timing) -> dict:
        return figure(ratios(self.samples, base.samples), "x")


# ---- 1. training throughput ---------------------------------------------------------------------------------
def set_blockwise(model: models.LanguageModel, on: bool) -> None:
    for m in model.modules():
        if isinstance(m, SoftmaxAttention):
            m.blockwise = on


def train_step(model, opt, batch) -> None:
    """Forward, next-token loss, backward, clip, AdamW: what a trial does per step."""
    inputs, targets = batch
    loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def batch_of(batch: int, length: int):
    x = torch.randint(2, VOCAB, (batch, length + 1))
    return x[:, :-1], x[:, 1:]


def train_rates(variants: dict[str, tuple[str, dict, bool]], width: int, depth: int, batch: int, length: int,
                rounds: int, steps: int) -> dict[str, Timing]:
    """Seconds per training step of each variant (name -> arch, options, blockwise). Each round times ``steps``
    steps of every variant in turn, so slow drifts of the machine hit all of them alike; one warm-up step each."""
    data = batch_of(batch, length)
    setups = {}
    for name, (arch, options, blockwise) in variants.items():
        model = build(arch, width, depth, length, **options).train()
        set_blockwise(model, blockwise)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        train_step(model, opt, data)  # warm-up: allocations, numba's compiled-kernel load
        setups[name] = (model, opt)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (model, opt) in setups.items():
            start = time.perf_counter()
            for _ in range(steps):
                train_step(model, opt, data)
            times[name].append((time.perf_counter() - start) / steps)
    return {name: Timing(t) for name, t in times.items()}


def bench_training(q: bool, res: Results) -> None:
    width, depth, batch, length = (32, 2, 4, 32) if q else (128, 2, 32, 400)
    rounds, steps = (1, 1) if q else (7, 2)
    figures = res.section("training", {"L": length, "D": width, "batch": batch, "depth": depth,
                                       "threads": torch.get_num_threads(), "rounds": rounds, "steps": steps})
    print(f"\n== training tokens/s: L={length}, D={width}, batch {batch}, depth {depth}, AdamW, "
          f"{torch.get_num_threads()} threads; median (min..max) of {rounds} rounds x {steps} steps")
    archs = sorted(models.ARCHITECTURES)
    timings = train_rates({a: (a, {}, True) for a in archs}, width, depth, batch, length, rounds, steps)
    tokens = batch * length
    base = timings["standard"]
    print(f"{'arch':>16} {'tokens/s (min..max)':>30} {'cost/token vs standard, per round':>34}")
    for arch in sorted(archs, key=lambda a: timings[a].median):
        print(f"{arch:>16} {timings[arch].rate(tokens):>30} {timings[arch].ratio(base):>34}")
        figures[arch] = {"tokens_per_s": timings[arch].rate_figure(tokens, "tokens/s"),
                         "cost_per_token_vs_standard": timings[arch].ratio_figure(base)}

    long, long_batch, window = (256, 2, 8) if q else (2048, 4, 64)
    print(f"\n== local attention at L={long}, batch {long_batch}: blockwise vs the dense masked call "
          f"(window {window}, sinks 4, sparse B={models.sparse.block_size(long)})")
    local = {"sliding_window": {"window": window}, "sinks": {"window": window, "sinks": 4}, "sparse": {}}
    variants: dict[str, tuple[str, dict, bool]] = {"standard": ("standard", {}, True)}
    for arch, options in local.items():
        variants[arch] = (arch, options, True)
        variants[f"{arch} dense"] = (arch, options, False)
    timings = train_rates(variants, width, depth, long_batch, long, rounds, steps)
    tokens, base = long_batch * long, timings["standard"]
    figures = res.section("local_attention", {
        "L": long, "D": width, "batch": long_batch, "depth": depth, "window": window, "sinks": 4,
        "sparse_block": models.sparse.block_size(long), "threads": torch.get_num_threads(), "rounds": rounds,
        "steps": steps})
    print(f"{'variant':>20} {'tokens/s (min..max)':>30} {'vs standard':>20} {'blockwise speed-up':>20}")
    for name, t in timings.items():
        dense = timings.get(f"{name} dense")
        print(f"{name:>20} {t.rate(tokens):>30} {t.ratio(base):>20} {dense.ratio(t) if dense else '':>20}")
        figures[name] = {"tokens_per_s": t.rate_figure(tokens, "tokens/s"), "cost_vs_standard": t.ratio_figure(base)}
        if dense:
            figures[name]["blockwise_speedup"] = dense.ratio_figure(t)


def answers_step(model, opt, inputs: torch.Tensor, targets: torch.Tensor, at: torch.Tensor | None) -> None:
    """A classification's step (Adam, as the separations paper): its loss at the answer positions, from the whole
    forward's logits (``at`` None) or from those positions' alone (``model(inputs, at=at)``)."""
    logits = model(inputs) if at is None else model(inputs, at=at)
    wanted = targets if at is None else targets.gather(1, at)
    loss = F.cross_entropy(logits.flatten(0, 1), wanted.flatten(), ignore_index=-100)
    opt.zero_grad()
    loss.backward()
    opt.step()


def answers_timings(length: int, batch: int, rounds: int, steps: int) -> dict[str, list[float]]:
    """Seconds a step (whole forward, answers alone) and a greedy prefill (whole, last position alone) at one length,
    each pair side by side."""
    model = build("transformer", 64, 1, length + 2).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    inputs = torch.randint(2, VOCAB, (batch, length))
    targets = torch.full((batch, length), -100)
    targets[:, -2:] = torch.randint(2, VOCAB, (batch, 2))  # the label and <eos>
    at = torch.tensor([[length - 2, length - 1]]).expand(batch, 2)

    def timed(fn, *args) -> Callable[[], float]:
        def run() -> float:
            start = time.perf_counter()
            for _ in range(steps):
                fn(*args)
            return (time.perf_counter() - start) / steps

        return run

    @torch.no_grad()
    def prefill(where: torch.Tensor | None) -> None:
        model(inputs, model.new_cache(batch), at=where)

    answers_step(model, opt, inputs, targets, None)  # warm-up
    whole, part = side_by_side(timed(answers_step, model, opt, inputs, targets, None),
                               timed(answers_step, model, opt, inputs, targets, at), rounds)
    model.eval()
    full, one = side_by_side(timed(prefill, None), timed(prefill, at[:, 1:]), rounds)
    return {"whole": whole, "answers": part, "prefill_whole": full, "prefill_last": one}


def bench_answers(q: bool, res: Results) -> None:
    """Index lookup's shapes (the claim's 1-layer Transformer of width 64, batch 64): a training step from the whole
    forward against one computing only the answer's logits, and greedy decoding's prefill likewise, side by side."""
    lengths, batch, rounds, steps = ((32,), 4, 1, 1) if q else ((102, 202, 402), 64, 5, 3)
    figures = res.section("answers", {"arch": "transformer", "D": 64, "depth": 1, "batch": batch,
                                      "threads": torch.get_num_threads(), "rounds": rounds, "steps": steps})
    print(f"\n== a classification's step, whole forward vs the answer's logits alone: 1-layer transformer D=64, "
          f"batch {batch}, Adam, {torch.get_num_threads()} threads; median (min..max) of {rounds} rounds x {steps}")
    print(f"{'L':>5} {'whole ms':>22} {'answers ms':>22} {'speed-up':>22} {'prefill speed-up':>22}")
    for length in lengths:
        t = answers_timings(length, batch, rounds, steps)
        whole, part = [1e3 * x for x in t["whole"]], [1e3 * x for x in t["answers"]]
        step, pre = ratios(t["whole"], t["answers"]), ratios(t["prefill_whole"], t["prefill_last"])
        figures[f"L={length}"] = {"whole_ms": figure(whole, "ms"), "answers_ms": figure(part, "ms"),
                                  "step_speedup": figure(step, "x"), "prefill_speedup": figure(pre, "x")}
        print(f"{length:>5} {spread(whole, '.1f'):>22} {spread(part, '.1f'):>22} {spread(step, '.2f', 'x'):>22} "
              f"{spread(pre, '.2f', 'x'):>22}")


# ---- 2. decoding ---------------------------------------------------------------------------------------------
@torch.no_grad()
def decode_cached(model, prompt: torch.Tensor, tokens: int) -> tuple[torch.Tensor, list[float], float]:
    """Greedy tokens, the seconds of each one-token step after the prefill, and the seconds of the whole decode."""
    start = time.perf_counter()
    cache = model.new_cache(prompt.shape[0])
    out = [model(prompt, cache)[:, -1].argmax(-1, keepdim=True)]
    steps = []
    for _ in range(tokens - 1):
        step = time.perf_counter()
        out.append(model(out[-1], cache)[:, -1].argmax(-1, keepdim=True))
        steps.append(time.perf_counter() - step)
    return torch.cat(out, 1), steps, time.perf_counter() - start


@torch.no_grad()
def decode_recompute(model, prompt: torch.Tensor, tokens: int) -> tuple[torch.Tensor, float]:
    seq = prompt
    start = time.perf_counter()
    for _ in range(tokens):
        seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], 1)
    return seq[:, prompt.shape[1]:], time.perf_counter() - start


def bench_decode(archs, width, depth, batch, tokens, recompute_for, repeats, recompute_repeats, res: Results):
    figures = res.section("decoding", {"tokens": tokens, "batch": batch, "width": width, "depth": depth,
                                       "repeats": repeats, "recompute_repeats": recompute_repeats})
    print(f"\n== greedy decoding: {tokens} tokens, batch {batch}, width {width}, depth {depth}; median (min..max) of "
          f"{repeats} cached decodes after a warm-up one; recomputing the prefix every token {recompute_repeats} "
          f"times, each in the same round as a cached decode (the speed-up is per round)")
    print(f"{'arch':>16} {'cached s':>18} {'recompute s':>20} {'speed-up':>18} {'same tokens':>11} "
          f"{'ms/token first 10%':>20} {'ms/token last 10%':>20} {'late/early':>18}")
    prompt = torch.randint(2, VOCAB, (batch, 10))
    for arch in archs:
        model = build(arch, width, depth, tokens + 16)
        decode_cached(model, prompt, min(tokens, 20))  # warm-up
        cached, steps, recomputed, outputs = [], [], [], []
        for r in range(repeats):
            out, times, seconds = decode_cached(model, prompt, tokens)
            cached.append(seconds)
            steps.append(times)
            outputs.append(out)
            if arch in recompute_for and r < recompute_repeats:
                again, seconds = decode_recompute(model, prompt, tokens)
                recomputed.append(seconds)
                outputs.append(again)
        tenth = max(1, len(steps[0]) // 10)
        early = [sum(t[:tenth]) / tenth for t in steps]
        late = [sum(t[-tenth:]) / tenth for t in steps]
        figures[arch] = {"cached_s": figure(cached, "s"),
                         "ms_per_token_first_tenth": figure([1e3 * t for t in early], "ms"),
                         "ms_per_token_last_tenth": figure([1e3 * t for t in late], "ms"),
                         "late_over_early": figure(ratios(late, early), "x")}
        if recomputed:
            same = "yes" if all(torch.equal(o, outputs[0]) for o in outputs) else "NO"
            figures[arch] |= {"recompute_s": figure(recomputed, "s"),
                              "speedup": figure(ratios(recomputed, cached), "x"), "same_tokens": same == "yes"}
            extra = (f"{spread(recomputed):>20} {spread(ratios(recomputed, cached), '.1f', 'x'):>18} "
                     f"{same:>11}")
        else:
            extra = f"{'-':>20} {'-':>18} {'-':>11}"
        print(f"{arch:>16} {spread(cached):>18} {extra} {spread([1e3 * t for t in early]):>20} "
              f"{spread([1e3 * t for t in late]):>20} {spread(ratios(late, early)):>18}")


# ---- 3. peak and utilisation -----------------------------------------------------------------------------------
def theoretical_peak(threads: int) -> tuple[float, str]:
    """threads x clock x 32 FLOP/cycle: two 256-bit FMA pipes, 8 float32 lanes x 2 FLOP each (AVX2 / AVX-512 on
    AMD Zen 4); the clock is /proc/cpuinfo's, which a boost clock can exceed."""
    mhz = 0.0
    if Path("/proc/cpuinfo").exists():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("cpu MHz"):
                mhz = float(line.split(":")[1])
                break
    return threads * mhz * 1e6 * 32, f"{threads} cores x {mhz / 1e3:.2f} GHz x 32 FLOP/cycle"


def peak_flops(sizes: list[int], repeats: int) -> dict[int, Timing]:
    """Seconds of one torch.mm per size, each size warmed up, ``repeats`` timed runs of several products."""
    out = {}
    for n in sizes:
        a, b = torch.randn(n, n), torch.randn(n, n)
        inner = max(1, 2 * 1024 ** 3 // n ** 3)  # about 2 GFLOP per timed run
        for _ in range(inner):
            torch.mm(a, b)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(inner):
                torch.mm(a, b)
            times.append((time.perf_counter() - start) / inner)
        out[n] = Timing(times)
    return out


def bench_peak(q: bool, threads: int, res: Results) -> float:
    sizes, repeats = ([256, 512], 2) if q else ([512, 1024, 1536, 2048, 3072], 5)
    theory, how = theoretical_peak(threads)
    print(f"\n== CPU peak: torch.mm, {threads} threads, median (min..max) of {repeats} warmed-up runs per size")
    timings = peak_flops(sizes, repeats)
    figures = res.section("peak", {"threads": threads, "sizes": sizes, "repeats": repeats})
    for n, t in timings.items():
        print(f"{n:>6}^2: {t.rate(2 * n ** 3 / 1e9)} GFLOP/s")
        figures[f"mm {n}^2"] = t.rate_figure(2 * n ** 3 / 1e9, "GFLOP/s")
    best = max(2 * n ** 3 / min(t.samples) for n, t in timings.items())
    figures["best"] = figure(best / 1e9, "GFLOP/s")
    figures["theoretical"] = figure(theory / 1e9, "GFLOP/s")
    figures["theoretical_how"] = how
    print(f"peak (best of all): {best / 1e9:.1f} GFLOP/s; theoretical {theory / 1e9:.1f} GFLOP/s at the nominal clock "
          f"({how}); the best implies {best / (threads * 32e9):.2f} GHz, i.e. the cores boost above nominal"
          if best > theory else f"peak (best of all): {best / 1e9:.1f} GFLOP/s = {100 * best / theory:.0f}% of the "
          f"theoretical {theory / 1e9:.1f} GFLOP/s ({how})")
    return best


def bench_utilisation(q: bool, peak: float, res: Results) -> None:
    steps, length, batch_size = (3, 32, 8) if q else (10, 221, 64)
    print("\n== training utilisation: exact FLOPs x 3 / step time vs the peak above")
    figures = res.section("utilisation", {"arch": "standard", "L": length, "batch": batch_size, "depth": 3,
                                          "steps": steps, "peak_gflops": peak / 1e9})
    for width in ([32] if q else [64, 256]):
        model = build("standard", width, 3, length).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        batch = batch_of(batch_size, length)
        train_step(model, opt, batch)
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            train_step(model, opt, batch)
            times.append(time.perf_counter() - start)
        flops = 3 * model.exact_flops(length) * batch_size
        figures[f"D={width}"] = {"gflops_per_s": Timing(times).rate_figure(flops / 1e9, "GFLOP/s"),
                                 "share_of_peak": figure([100 * flops / t / peak for t in times], "%")}
        print(f"standard D={width}, L={length}, batch {batch_size}: {Timing(times).rate(flops / 1e9)} GFLOP/s = "
              f"{100 * flops / Timing(times).median / peak:.0f}% of peak")


# ---- 4. memory --------------------------------------------------------------------------------------------------
def bench_memory(q: bool, out: Path | None) -> None:
    """``benchmarks.bench_memory`` in its own process; its figures go to ``bench_memory.json`` beside ``out``."""
    script = Path(__file__).with_name("bench_memory.py")
    print("\n== memory (benchmarks.bench_memory)")
    if not script.exists():
        print("skipped: benchmarks.bench_memory is not in this checkout")
        return
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    mine = out.with_name("bench_memory.json").resolve() if out else None
    where = ["--out", str(mine)] if mine and mine != RESULTS / "bench_memory.json" else []  # else its default
    subprocess.run([sys.executable, "-m", "benchmarks.bench_memory", *(["--quick"] if q else []), *where], cwd=root,
                   env=env, check=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_models", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny sizes: checks the script runs, measures nothing")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--training-only", action="store_true", help="only section 1 (about 3 minutes)")
    ap.add_argument("--answers-only", action="store_true",
                    help="only a classification's step and prefill, whole against answers alone (about a minute)")
    out_option(ap, "bench_models")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    q, out = args.quick, out_path(args, "bench_models")
    res = Results("bench_models", argv)
    if not args.answers_only:
        bench_training(q, res)
    bench_answers(q, res)
    if not (args.training_only or args.answers_only):
        recurrent = ["linear", "retnet", "linear_nofm", "lstm", "dss", "mamba"]
        bench_decode(["standard", "sparse", "sliding_window", *recurrent], width=32 if q else 64, depth=2,
                     batch=8 if q else 64, tokens=40 if q else 500, recompute_for={"standard", "linear", "mamba"},
                     repeats=2 if q else 3, recompute_repeats=2, res=res)
        bench_utilisation(q, bench_peak(q, args.threads, res), res)
        bench_memory(q, out)
    res.write(out)


if __name__ == "__main__":
    main()
