"""Tasks by name: the one place a task is registered (``@register`` in its own module)."""

from __future__ import annotations

from tasks.base import Task, TaskError

TASKS: dict[str, type[Task]] = {}


def register(cls: type[Task]) -> type[Task]:
    TASKS[cls.name] = cls
    return cls


def get_task(name: str, size: int, **params) -> Task:
    if name not in TASKS:
        raise TaskError(f"unknown task {name!r}; registered tasks: {', '.join(sorted(TASKS))}")
    return TASKS[name](size, **params)
