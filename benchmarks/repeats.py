"""Repeated measurements, shared by the benchmarks: two things timed side by side, round by round, and the
'median (min..max)' every figure is printed as."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import TypeVar

A = TypeVar("A")
B = TypeVar("B")


def spread(values: list[float], fmt: str = ".2f", unit: str = "") -> str:
    """'median (min..max)' of repeated measurements."""
    v = sorted(values)
    return f"{statistics.median(v):{fmt}}{unit} ({v[0]:{fmt}}..{v[-1]:{fmt}})"


def side_by_side(first: Callable[[], A], second: Callable[[], B], rounds: int,
                 start: int = 0) -> tuple[list[A], list[B]]:
    """``first()`` and ``second()`` once per round, the order swapped every other round, so that a slow spell of
    the machine or a drift in its speed favours neither side; their results, round by round. Rounds are numbered
    from ``start`` (odd rounds run ``second`` first), for a caller that runs its own rounds one at a time."""
    a: list[A] = []
    b: list[B] = []
    for r in range(start, start + rounds):
        if r % 2:
            b.append(second())
            a.append(first())
        else:
            a.append(first())
            b.append(second())
    return a, b


def ratios(a: list[float], b: list[float]) -> list[float]:
    """``a / b`` round by round."""
    return [x / y for x, y in zip(a, b)]
