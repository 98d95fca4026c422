"""`flaky`, a Ray Tune trainable that dies after each checkpoint, or before any: in a module of its own, which imports
neither Lightning nor torch, since each of its Ray workers imports it anew (5 s of imports a worker, 8 workers)."""

import tempfile
from pathlib import Path

from ray import tune


def flaky(config: dict) -> None:
    """A trial that saves a checkpoint one step further than it started and dies, five times (``progress``), or dies
    before saving any (not ``progress``); then, where it gets there, finishes."""
    checkpoint = tune.get_checkpoint()
    step = 0
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            step = int((Path(directory) / "step").read_text())
    if config["progress"] and step < 5:
        with tempfile.TemporaryDirectory() as directory:
            (Path(directory) / "step").write_text(str(step + 1))
            tune.report({"step": step + 1}, checkpoint=tune.Checkpoint.from_directory(directory))
        raise RuntimeError(f"killed after step {step + 1}")
    if not config["progress"]:
        raise RuntimeError("killed before any checkpoint")
    tune.report({"step": step, "done": True})
