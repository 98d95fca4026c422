"""Is eq_one's count shortcut learnable from our data? A model built to represent it, trained as the pilots train.

The separations paper (App. H.2, Remark) notes that eq_one "can be solved perfectly by just maintaining a dictionary
of the counts of each symbol": w2 differs from w1 in one position, so the symbol counts of the two halves differ
exactly for the negatives. This script checks two things on the strings our generator (tasks/eq_one.py) makes:

- **the data admits it**: the exact rule "label yes iff every symbol occurs as often in w1 as in w2", scored on the
  test strings (length exactly N), no training;
- **a model with that structure learns it**: a count model, the sum of the w1 symbols' embeddings plus the sum of the
  w2 symbols' embeddings (two tables of its own, width 64, so it must learn that the second cancels the first),
  then an MLP (64 ReLU units) to a yes/no logit, trained as `benchmarks/pilot-eq-cpu.yaml` trains the LSTM and the
  Transformer: Adam, batch 64, a constant rate, the architectures' init (Xavier), the train distribution (lengths 2
  to N, fresh strings every step, as the paper samples), stopped once validation (1,024 strings of length N) holds
  99% at 3 checks in a row, then scored on 5,000 test strings.

It is not one of the paper's models and says nothing of what the LSTM or the Transformer can learn: it shows that
the strings hold the shortcut and that a model with its structure finds it from them (a yes/no logit, not the
next-token label the architectures are trained on). Per (N, alphabet, rate), over ``--seeds``: test accuracy, and
the steps to hold 99% over the seeds that did.

    python -m benchmarks.eq_shortcut                      # N = 20 and 400, alphabets 1024 and 16, three rates, 3 seeds
    python -m benchmarks.eq_shortcut --quick              # one small run (a test runs it); writes nothing unless --out

The figures go to ``docs/benchmarks/eq_shortcut.json`` (``--out``), with the command line, date and commit.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

import tasks  # noqa: E402
from benchmarks.results import Results, figure, out_option, out_path  # noqa: E402
from models.backbone import init_weights  # noqa: E402
from tasks.equality import YES_ID  # noqa: E402

BATCH, TARGET, PATIENCE = 64, 0.99, 3  # the separations profile's batch, target ("near-perfect") and patience


def halves(task: tasks.Task, batch: tasks.Packed) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(w1, w2, label) of ``w1 [sep] w2 label <eos>`` strings: symbol indices 0..alphabet-1, padded with
    ``alphabet`` to the longest half; label 1 for yes."""
    sym0, alphabet = task.index["0"], task.params["alphabet"]
    half = (batch.lengths - 2) // 2  # (B,) |w1| = |w2|
    at = np.arange(half.max())  # (H,)
    pad = at[None, :] >= half[:, None]  # (B, H)
    first = batch.offsets[:-1, None] + np.minimum(at[None, :], half[:, None] - 1)  # (B, H) into values
    w1 = np.where(pad, alphabet, batch.values[first].astype(np.int64) - sym0)
    w2 = np.where(pad, alphabet, batch.values[first + half[:, None] + 1].astype(np.int64) - sym0)
    return w1, w2, (batch.answer == YES_ID).astype(np.float32)


def count_rule(w1: np.ndarray, w2: np.ndarray, alphabet: int) -> np.ndarray:
    """The paper's shortcut, exactly: yes iff every symbol's count in w1 equals its count in w2."""
    rows = np.arange(len(w1))[:, None]
    counts = np.zeros((len(w1), alphabet + 1), np.int64)  # the last column counts padding, equal on both sides
    np.add.at(counts, (rows, w1), 1)
    np.add.at(counts, (rows, w2), -1)
    return (counts == 0).all(axis=1)


class CountModel(nn.Module):
    """Sum of w1's embeddings plus sum of w2's (separate tables), then an MLP: can represent the count shortcut
    (second table = minus the first, then "is the sum zero"), and must learn it."""

    def __init__(self, alphabet: int, width: int):
        super().__init__()
        self.first = nn.Embedding(alphabet + 1, width, padding_idx=alphabet)
        self.second = nn.Embedding(alphabet + 1, width, padding_idx=alphabet)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1))
        self.apply(init_weights)
        for table in (self.first, self.second):  # Xavier touched the padding row: padding adds nothing
            nn.init.zeros_(table.weight[alphabet])

    def forward(self, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:  # (B, H) each
        total = self.first(w1).sum(1) + self.second(w2).sum(1)  # (B, D)
        return self.mlp(total).squeeze(-1)  # (B,) logit of yes


def accuracy(model: CountModel, data: tuple[np.ndarray, np.ndarray, np.ndarray]) -> float:
    w1, w2, label = (torch.from_numpy(a) for a in data)
    with torch.no_grad():
        return ((model(w1, w2) > 0).float() == label).float().mean().item()


def train(size: int, alphabet: int, lr: float, seed: int, max_steps: int, every: int, test_samples: int) -> dict:
    """One run: trained until validation holds 99% at 3 checks in a row, or ``max_steps``; scored on the test set."""
    task = tasks.get_task("eq_one", size, alphabet=alphabet)
    rng = np.random.default_rng([seed, size, alphabet])
    val = halves(task, task.sample_batch(rng, "val", 1024))
    test = halves(task, task.sample_batch(rng, "test", test_samples))
    torch.manual_seed(seed)
    model = CountModel(alphabet, 64)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = nn.BCEWithLogitsLoss()
    start, streak, held, step = time.perf_counter(), 0, None, 0
    while step < max_steps and held is None:
        w1, w2, label = (torch.from_numpy(a) for a in halves(task, task.sample_batch(rng, "train", BATCH)))
        loss = loss_fn(model(w1, w2), label)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if step % every == 0:
            streak = streak + 1 if accuracy(model, val) >= TARGET else 0
            held = step if streak == PATIENCE else None
    return {
        "test_accuracy": accuracy(model, test),
        "rule_accuracy": float((count_rule(*test[:2], alphabet) == test[2].astype(bool)).mean()),
        "held_step": held,
        "steps": step,
        "seconds": time.perf_counter() - start,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.eq_shortcut",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--sizes", type=int, nargs="+", default=[20, 400], help="N (default: %(default)s)")
    ap.add_argument("--alphabets", type=int, nargs="+", default=[1024, 16], help="(default: %(default)s)")
    ap.add_argument("--lrs", type=float, nargs="+", default=[1e-2, 1e-3, 1e-4], help="(default: %(default)s)")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per run (default: %(default)s)")
    ap.add_argument("--max-steps", type=int, default=20_000, help="(default: %(default)s)")
    ap.add_argument("--every", type=int, default=250, help="steps between validations (default: %(default)s)")
    ap.add_argument("--test-samples", type=int, default=5000, help="(default: %(default)s)")
    ap.add_argument("--quick", action="store_true", help="N = 20, alphabet 16, rate 1e-2, one seed, 800 steps")
    out_option(ap, "eq_shortcut")
    args = ap.parse_args(argv)
    if args.quick:
        args.sizes, args.alphabets, args.lrs, args.seeds = [20], [16], [1e-2], 1
        args.max_steps, args.every, args.test_samples = 800, 100, 1000
    if args.seeds < 1 or args.max_steps < args.every or args.every < 1:
        ap.error("--seeds must be at least 1 and --max-steps at least --every (at least 1)")
    try:
        for size in args.sizes:
            for alphabet in args.alphabets:
                tasks.get_task("eq_one", size, alphabet=alphabet)  # impossible sizes named before any training
    except tasks.TaskError as err:
        ap.error(str(err))
    torch.set_num_threads(1)  # a small model: one core, beside whatever else runs
    results = Results("eq_shortcut", argv)
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "quick")}
    figures = results.section("quick" if args.quick else "count model", settings)
    for size in args.sizes:
        for alphabet in args.alphabets:
            for lr in args.lrs:
                runs = [
                    train(size, alphabet, lr, s, args.max_steps, args.every, args.test_samples)
                    for s in range(args.seeds)
                ]
                accuracies = [100 * r["test_accuracy"] for r in runs]
                rule = [100 * r["rule_accuracy"] for r in runs]
                held = [r["held_step"] for r in runs if r["held_step"] is not None]
                figures[f"N={size} alphabet={alphabet} lr={lr:g}"] = {
                    "test accuracy": figure(accuracies, "%"),
                    "held 99%": f"{len(held)} of {len(runs)} seeds",
                    "steps to hold 99%": figure(held, "steps") if held else f"not within {args.max_steps}",
                    "seconds": figure([r["seconds"] for r in runs], "s"),
                    "count rule, test accuracy": figure(rule, "%"),
                }
                print(
                    f"N={size:<4} alphabet={alphabet:<5} lr={lr:<7g} test {min(accuracies):.1f}-{max(accuracies):.1f}%"
                    f", held 99% at steps {[r['held_step'] for r in runs]}, count rule {min(rule):.1f}%",
                    flush=True,
                )
    results.write(out_path(args, "eq_shortcut"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
