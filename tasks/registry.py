"""Tasks by name: the one place a task is registered (``@register`` in its own module).

A task is its module plus its line in ``tasks`` (and ``params.yaml``'s ``tasks``, DVC's list of
generate stages, which tests.test_config checks against ``TASKS``): the report reads its paper and the paper's
lengths, and the tests its small sizes, from the class.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tasks.base import Task, TaskError
from tasks.papers import PAPER_THRESHOLD, PAPERS

TASKS: dict[str, type[Task]] = {}


def declaration_errors(cls: type[Task]) -> list[str]:
    """What is missing or malformed among the class attributes every task declares (empty when none is)."""
    errors = [f"no {attr}" for attr in ("name", "paper", "test_sizes") if not hasattr(cls, attr)]
    if hasattr(cls, "paper") and cls.paper not in PAPERS:
        errors.append(f"paper {cls.paper!r} is none of {PAPERS}")
    if hasattr(cls, "test_sizes") and not (
        isinstance(cls.test_sizes, tuple) and cls.test_sizes and all(isinstance(n, int) for n in cls.test_sizes)
    ):
        errors.append(f"test_sizes {cls.test_sizes!r} is not a non-empty tuple of ints")
    lengths = cls.paper_lengths
    if not isinstance(lengths, Mapping) or not all(isinstance(n, int) for pair in lengths.items() for n in pair):
        errors.append(f"paper_lengths {lengths!r} is not a mapping of size -> length (ints)")
    sizes = cls.paper_sizes
    if not (isinstance(sizes, tuple) and all(isinstance(n, int) for n in sizes) and list(sizes) == sorted(set(sizes))):
        errors.append(f"paper_sizes {sizes!r} is not an increasing tuple of ints")
    return errors


def register(cls: type[Task]) -> type[Task]:
    """Register ``cls`` under its name, failing at import when it lacks what the report and the tests read."""
    if errors := declaration_errors(cls):
        raise TaskError(f"task class {cls.__qualname__}: {'; '.join(errors)} (see tasks.base's Task)")
    TASKS[cls.name] = cls
    return cls


def get_task(name: str, size: int, **params) -> Task:
    if name not in TASKS:
        raise TaskError(f"unknown task {name!r}; registered tasks: {', '.join(sorted(TASKS))}")
    return TASKS[name](size, **params)


def training_targets(tasks: Iterable[str], threshold: float) -> dict[str, float]:
    """task -> the accuracy its trials train on to once solved at ``threshold``: its paper's threshold (the one its
    claims read), never below ``threshold``."""
    return {t: max(threshold, PAPER_THRESHOLD[TASKS[t].paper]) for t in tasks}
