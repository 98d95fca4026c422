"""Model speed, measured side by side in one run on this machine (CPU):

1. greedy decoding of a long chain of thought: our cached decoding vs recomputing the whole prefix every token
   (what the DP paper's evaluation does), and the per-token cost early vs late in the sequence;
2. one Lightning training step vs a bare PyTorch loop on the same model and batch;
3. achieved training FLOP/s (exact count x 3 / time) against this CPU's peak, measured by a large torch.mm.

    python benchmarks/bench_models.py                 # the issue's settings (several minutes on 2 cores)
    python benchmarks/bench_models.py --quick         # a smoke run in seconds
"""

from __future__ import annotations

import argparse
import time

import lightning as L
import torch
import torch.nn.functional as F

import models
from pipeline.train import SequenceModel, TrialSpec

VOCAB = 64


def build(arch: str, width: int, depth: int, max_len: int) -> models.LanguageModel:
    torch.manual_seed(0)
    return models.build_model(arch, vocab_size=VOCAB, width=width, depth=depth, heads=4, max_len=max_len,
                              dropout=0.0).eval()


@torch.no_grad()
def decode_cached(model, prompt: torch.Tensor, tokens: int) -> list[float]:
    """Seconds per generated token, using the model's cache."""
    cache = model.new_cache(prompt.shape[0])
    nxt = model(prompt, cache)[:, -1].argmax(-1, keepdim=True)
    times = []
    for _ in range(tokens - 1):
        start = time.perf_counter()
        nxt = model(nxt, cache)[:, -1].argmax(-1, keepdim=True)
        times.append(time.perf_counter() - start)
    return times


@torch.no_grad()
def decode_recompute(model, prompt: torch.Tensor, tokens: int) -> float:
    seq = prompt
    start = time.perf_counter()
    for _ in range(tokens):
        seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], 1)
    return time.perf_counter() - start


def bench_decode(archs, width, depth, batch, tokens, recompute_for):
    print(f"\n== greedy decoding: {tokens} tokens, batch {batch}, width {width}, depth {depth}")
    print(f"{'arch':>16} {'cached s':>9} {'recompute s':>12} {'speed-up':>9} {'ms/token first 10%':>19} "
          f"{'last 10%':>9} {'late/early':>10}")
    prompt = torch.randint(2, VOCAB, (batch, 10))
    for arch in archs:
        model = build(arch, width, depth, tokens + 16)
        times = decode_cached(model, prompt, tokens)
        cached = sum(times)
        tenth = max(1, len(times) // 10)
        early, late = sum(times[:tenth]) / tenth, sum(times[-tenth:]) / tenth
        if arch in recompute_for:
            recompute = decode_recompute(model, prompt, tokens)
            extra = f"{recompute:12.2f} {recompute / cached:8.1f}x"
        else:
            extra = f"{'-':>12} {'-':>9}"
        print(f"{arch:>16} {cached:9.2f} {extra} {1e3 * early:19.2f} {1e3 * late:9.2f} {late / early:10.2f}")


def spec_for(arch: str, width: int, depth: int, length: int) -> TrialSpec:
    return TrialSpec(arch=arch, width=width, depth=depth, seed=0, train_path="", test_path="", max_len=length,
                     vocab_size=VOCAB, heads=4, dropout=0.0, arch_options={}, batch_size=0, epochs=1, max_steps=-1,
                     lr=1e-3, weight_decay=0.01, warmup_fraction=0.1, grad_clip=1.0, precision="32-true",
                     val_samples=1, val_every_steps=None, eval_samples=None, eval_batch_size=1, threads=2,
                     use_gpu=False)


def batch_of(batch: int, length: int):
    x = torch.randint(2, VOCAB, (batch, length + 1))
    return x[:, :-1], x[:, 1:]


def bare_steps(module: SequenceModel, batch, steps: int) -> float:
    """Seconds per step of the plain loop: forward, loss, backward, clip, AdamW, schedule."""
    opt_cfg = module.configure_optimizers_for(steps)
    opt, sched = opt_cfg["optimizer"], opt_cfg["lr_scheduler"]["scheduler"]
    module.train()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = module.training_loss(batch)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        opt.step()
        sched.step()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


class StepTimer(L.Callback):
    def __init__(self):
        self.times, self.start = [], 0.0

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.start = time.perf_counter()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.times.append(time.perf_counter() - self.start)


def lightning_steps(module: SequenceModel, batch, steps: int) -> float:
    timer = StepTimer()
    trainer = L.Trainer(accelerator="cpu", max_steps=steps, gradient_clip_val=1.0, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[timer], num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(module, torch.utils.data.DataLoader([batch] * steps, batch_size=None))
    return sorted(timer.times)[len(timer.times) // 2]


def peak_flops(threads: int, n: int = 2048, repeats: int = 10) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    start = time.perf_counter()
    for _ in range(repeats):
        torch.mm(a, b)
    return 2 * n ** 3 * repeats / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny sizes: checks the script runs, measures nothing")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    q = args.quick
    recurrent = ["linear", "retnet", "linear_nofm", "lstm", "dss", "mamba"]
    bench_decode(["standard", "sparse", "sliding_window", *recurrent], width=32 if q else 64, depth=2,
                 batch=8 if q else 64, tokens=40 if q else 500, recompute_for={"standard", "linear"})

    print("\n== one training step: Lightning vs a bare PyTorch loop (median of steps, same model and batch)")
    steps, length = (5, 32) if q else (40, 221)
    for width in ([32] if q else [64, 256]):
        batch = batch_of(16 if q else 64, length)
        bare = bare_steps(SequenceModel(spec_for("standard", width, 3, length)), batch, steps)
        lit = lightning_steps(SequenceModel(spec_for("standard", width, 3, length)), batch, steps)
        print(f"standard D={width}: bare {1e3 * bare:.1f} ms, Lightning {1e3 * lit:.1f} ms, "
              f"overhead {100 * (lit / bare - 1):+.1f}%")

    print("\n== training utilisation: exact FLOPs x 3 / step time vs peak torch.mm FLOP/s")
    peak = peak_flops(args.threads, n=512 if q else 2048)
    print(f"peak (torch.mm {512 if q else 2048}^2, {args.threads} threads): {peak / 1e9:.1f} GFLOP/s")
    for width in ([32] if q else [64, 256]):
        module = SequenceModel(spec_for("standard", width, 3, length))
        batch = batch_of(16 if q else 64, length)
        step = bare_steps(module, batch, steps)
        achieved = 3 * module.model.exact_flops(length) * len(batch[0]) / step
        print(f"standard D={width}, L={length}, batch {len(batch[0])}: {achieved / 1e9:.1f} GFLOP/s = "
              f"{100 * achieved / peak:.0f}% of peak")


if __name__ == "__main__":
    main()
