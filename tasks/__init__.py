"""Datasets of the two papers, one module per task; importing this package registers them all."""

from tasks import (  # noqa: F401  (registration side effect)
    arithmetic,
    dyck,
    ed,
    ed_local,
    eq_ncp,
    eq_one,
    eq_random,
    index_lookup,
    lis,
)
from tasks.base import EOS_ID, PAD_ID, SPLITS, Packed, Sample, Task, TaskError
from tasks.registry import TASKS, get_task

__all__ = ["EOS_ID", "PAD_ID", "SPLITS", "Packed", "Sample", "Task", "TaskError", "TASKS", "get_task"]
