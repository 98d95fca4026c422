"""A results table built from what a paper reports, in the shape the claim rules read (results/sweep.csv's): the
checker's own positive control. Run on the papers' own results every claim must hold; a rule they fail is wrong.

An entry states one model's outcomes as its paper words them, with the quote it stands for:

    - quote: "..."                # verbatim from the paper (tests/test_claims_papers.py checks it)
      where: "§6.2, Table 2"
      numbers: stated             # stated: the paper gives them; illustrative: the paper gives words only
      task: arithmetic            # a registered task
      arch: standard              # a registered architecture
      depth: 3
      widths: [32, 64, 128, 256, 512]
      solved_from: {6: 64, 10: 128}      # per size, the smallest width that solves (null: none of ``widths``)
      accuracy: {solved: 0.99, unsolved: 0.5}
    # or, one accuracy per size at every width of ``widths``:
      accuracy: {20: 1.0, 200: 0.6}

A size must be one the task's paper ran (``Task.paper_sizes``): an unknown task, architecture or size is a named
``ReportedError``. A cell is solved where its accuracy reaches its paper's threshold
(``tasks.papers.PAPER_THRESHOLD``), else unsolved; each is one measured seed, converged (the paper trained it to the
end).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

import models
from pipeline.common.status import Status
from tasks import TASKS
from tasks.papers import PAPER_THRESHOLD

KEYS = {"quote", "where", "numbers", "task", "arch", "depth", "widths", "solved_from", "accuracy"}


class ReportedError(ValueError):
    """A reported-results entry the registries cannot place, or a malformed one."""


def check_entry(i: int, entry: Mapping[str, Any]) -> None:
    where = f"reported entry {i} ({entry.get('task')} {entry.get('arch')})"
    unknown = set(entry) - KEYS
    missing = {"quote", "where", "numbers", "task", "arch", "depth", "widths", "accuracy"} - set(entry)
    if unknown or missing:
        raise ReportedError(f"{where}: unknown keys {sorted(unknown)}, missing keys {sorted(missing)}")
    if entry["task"] not in TASKS:
        raise ReportedError(f"{where}: unknown task {entry['task']!r}; registered: {', '.join(sorted(TASKS))}")
    if entry["arch"] not in models.ARCHITECTURES:
        raise ReportedError(
            f"{where}: unknown architecture {entry['arch']!r}; registered: {', '.join(sorted(models.ARCHITECTURES))}"
        )
    if entry["numbers"] not in ("stated", "illustrative"):
        raise ReportedError(f"{where}: numbers must be 'stated' or 'illustrative', got {entry['numbers']!r}")
    paper = TASKS[entry["task"]].paper_sizes
    sizes = entry.get("solved_from") or {k: v for k, v in entry["accuracy"].items() if isinstance(k, int)}
    strays = sorted(set(sizes) - set(paper))
    if not sizes or strays:
        raise ReportedError(f"{where}: sizes {strays or 'none'}: {entry['task']}'s paper ran {list(paper)}")
    if not all(isinstance(w, int) and w > 0 for w in [entry["depth"], *entry["widths"]]):
        raise ReportedError(f"{where}: depth and widths must be positive integers")


def cells(entry: Mapping[str, Any]) -> Iterable[tuple[int, int, float]]:
    """(size, width, accuracy) of every cell ``entry`` states."""
    accuracy = entry["accuracy"]
    if "solved_from" in entry:
        for size, first in entry["solved_from"].items():
            for width in entry["widths"]:
                solved = first is not None and width >= first
                yield size, width, accuracy["solved" if solved else "unsolved"]
    else:
        for size, value in accuracy.items():
            for width in entry["widths"]:
                yield size, width, value


def reported_table(entries: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """The results table ``entries`` stand for (checked first: a ``ReportedError`` names the first bad one)."""
    entries = list(entries)
    for i, entry in enumerate(entries):
        check_entry(i, entry)
    rows = []
    for entry in entries:
        task = TASKS[entry["task"]]
        for size, width, acc in cells(entry):
            solved = acc >= PAPER_THRESHOLD[task.paper] - 1e-9
            rows.append(
                {
                    "task": entry["task"], "size": size, "max_len": size, "arch": entry["arch"], "width": width,
                    "depth": entry["depth"], "seed": 0, "measured": True,
                    "status": str(Status.SOLVED if solved else Status.UNSOLVED), "reason": entry["where"],
                    "final_accuracy": acc, "sustained_accuracy": acc, "converged": 1.0,
                    "paper_gflops": float("nan"), "exact_gflops": float("nan"), "solve_pflops": float("nan"),
                    "eval_samples": 5000,
                }
            )  # fmt: skip
    return pd.DataFrame(rows)
