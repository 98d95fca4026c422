"""Synthetic sweep tables: `rows`, for the claim, report and nightly tests."""

from __future__ import annotations


def rows(task: str, arch: str, depth: int, solved_from: dict[int, int | None], widths=(16, 32, 64),
         accuracy: float | None = None, seeds=(0,), status_override: str | None = None) -> list[dict]:
    """A grid of cells: at each size, widths >= solved_from[size] solve (None: none does)."""
    out = []
    for size, first in solved_from.items():
        for width in widths:
            for seed in seeds:
                solved = first is not None and width >= first
                status = status_override or ("solved" if solved else "unsolved")
                acc = 0.95 if solved else (accuracy if accuracy is not None else 0.3)
                out.append({"task": task, "size": size, "max_len": 10 * size + 5, "arch": arch, "width": width,
                            "depth": depth, "seed": seed, "measured": True, "status": status, "reason": "",
                            "final_accuracy": acc, "paper_gflops": width * width * (10 * size + 7) * 1e-6,
                            "exact_gflops": width * width * (10 * size + 5) * 1.5e-6,
                            "solve_pflops": width * 1e-3 if solved else float("nan"), "parent_run_id": "p"})
    return out
