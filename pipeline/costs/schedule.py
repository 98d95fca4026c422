"""Trials on a cluster's slots, as the sweep's searcher hands them out: longest expected cost first (ties in the
order given), each on the first slot free (a list schedule)."""

from __future__ import annotations

import heapq
from dataclasses import dataclass


@dataclass(frozen=True)
class Trial:
    cost: float  # the searcher's order: expected cost (exact forward GFLOPs of the whole budget)
    seconds: float  # how long it trains on one slot
    pflops: float  # its training PFLOPs


@dataclass(frozen=True)
class Schedule:
    trials: int
    pflops: float  # every trial's training PFLOPs
    busy: float  # slot-seconds: every trial's seconds
    wall: float  # seconds from the first trial's start to the last one's end


def list_schedule(trials: list[Trial], slots: int) -> Schedule:
    """``trials`` longest cost first, each started on the slot that frees first."""
    if slots < 1:
        raise ValueError(f"slots must be at least 1, not {slots}")
    free = [0.0] * slots  # a heap of the times the slots free up
    wall = 0.0
    for trial in sorted(trials, key=lambda t: -t.cost):  # sorted() is stable: ties keep their order
        end = heapq.heappop(free) + trial.seconds
        heapq.heappush(free, end)
        wall = max(wall, end)
    return Schedule(len(trials), sum(t.pflops for t in trials), sum(t.seconds for t in trials), wall)
