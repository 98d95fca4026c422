"""Synthetic sweep tables: `rows`, for the claim, report and nightly tests."""

from __future__ import annotations

UNDECIDED_REASON = ("budget: still improving at step 6400 (8x the budget of 800); over steps 3200-6400 validation "
                    "loss 0.9 -> 0.5 (gain 44.4%, tolerance 1.0%), validation accuracy 0.600 -> 0.800 (min_delta 0.01)")


def rows(task: str, arch: str, depth: int, solved_from: dict[int, int | None], widths=(16, 32, 64),
         accuracy: float | None = None, seeds=(0,), status_override: str | None = None, undecided=(),
         borderline=()) -> list[dict]:
    """A grid of cells: at each size, widths >= solved_from[size] solve (None: none does). ``undecided`` and
    ``borderline``: (size, width) cells, every seed, that ended undecided (at the unsolved accuracy) or whose
    test accuracy is borderline; a table given ``borderline`` has the column, as the sweep writes it now."""
    out = []
    for size, first in solved_from.items():
        for width in widths:
            for seed in seeds:
                solved = first is not None and width >= first
                status = status_override or ("solved" if solved else "unsolved")
                if (size, width) in undecided:
                    solved, status = False, "undecided"
                acc = 0.95 if solved else (accuracy if accuracy is not None else 0.3)
                row = {"task": task, "size": size, "max_len": 10 * size + 5, "arch": arch, "width": width,
                       "depth": depth, "seed": seed, "measured": True, "status": status,
                       "reason": UNDECIDED_REASON if status == "undecided" else "", "final_accuracy": acc,
                       "paper_gflops": width * width * (10 * size + 7) * 1e-6,
                       "exact_gflops": width * width * (10 * size + 5) * 1.5e-6,
                       "solve_pflops": width * 1e-3 if solved else float("nan"), "parent_run_id": "p"}
                if borderline:
                    row["borderline"] = (size, width) in borderline
                out.append(row)
    return out
