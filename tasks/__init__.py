"""Datasets of the two papers, one module per task; importing this package registers them all."""

from tasks import arithmetic, lis  # noqa: F401  (registration side effect)
from tasks.base import EOS_ID, PAD_ID, Sample, Task, TaskError
from tasks.registry import TASKS, get_task

__all__ = ["EOS_ID", "PAD_ID", "Sample", "Task", "TaskError", "TASKS", "get_task"]
