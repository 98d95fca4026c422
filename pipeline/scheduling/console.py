"""How far a sweep is, in one line a person reads, and the same counts in the MLflow parent run as it goes.

    sweep: 12/30 trials (at most 48) | 5 solved | 2 running | 0 failed | 3m12s elapsed | ~4m left

``finished/planned``: trials ended (reused runs included) over those the search has planned so far (ended,
running and queued); a frontier search plans more as results come in, up to ``at most`` (every cell with every
learning rate). The time left is the planned trials left at the rate trained trials have ended so far (running
trials count as not begun: the estimate errs long). On a terminal the line rewrites itself; in a log (CI,
``dvc repro > file``) it is printed every ``every`` seconds and when the sweep ends. Ray Tune's own table of
trials comes only with ``sweep.runs.console: table``.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import TextIO

from ray import tune
from ray.tune import CLIReporter

from pipeline.common.status import Status
from pipeline.search.searcher import CellSearcher
from pipeline.tracking.writer import RunWriter
from pipeline.training.members import members


@dataclass(frozen=True)
class Counts:
    finished: int
    planned: int
    at_most: int
    solved: int
    running: int
    failed: int
    trained: int  # finished by training now, not reused

    @classmethod
    def of(cls, searcher: CellSearcher) -> Counts:
        runs = [run for by_lr in searcher.runs.values() for run in by_lr.values()]
        running, queued = searcher.running, searcher.queued
        return cls(
            finished=len(runs),
            planned=len(runs) + running + queued,
            at_most=sum(len(cell.lrs) for cell in searcher.cells.values()),
            solved=sum(run["status"] == Status.SOLVED for run in runs),
            running=running,
            failed=sum(run["status"] == Status.FAILED for run in runs),
            trained=sum(not run.get("reused_from") for run in runs),
        )


def duration(seconds: float) -> str:
    minutes, s = divmod(int(round(seconds)), 60)
    hours, m = divmod(minutes, 60)
    return f"{hours}h{m:02d}m" if hours else f"{m}m{s:02d}s" if m else f"{s}s"


def line(c: Counts, elapsed: float) -> str:
    """The progress line; the time left once a trial has been trained: the planned trials left at the rate the
    sweep has ended trained trials so far (all slots together)."""
    left = "time left unknown yet"
    if c.trained:
        left = f"~{duration(elapsed / c.trained * (c.planned - c.finished))} left"
    planned = f"{c.finished}/{c.planned} trials" + (f" (at most {c.at_most})" if c.at_most > c.planned else "")
    return (
        f"sweep: {planned} | {c.solved} solved | {c.running} running | {c.failed} failed | "
        f"{duration(elapsed)} elapsed | {left}"
    )


class SweepProgress(tune.Callback):
    """Tune callback: prints the progress line (see the module docstring) and logs its counts to the parent run
    (``trials_finished``, ``trials_solved``, ``trials_running``, ``trials_failed``, at step = trials finished)."""

    def __init__(
        self,
        searcher: CellSearcher,
        writer: RunWriter,
        parent: str,
        every: float = 30.0,
        out: TextIO | None = None,
    ):
        self.searcher, self.writer, self.parent = searcher, writer, parent
        self.out = out  # None: sys.stderr, looked up when written (Tune pickles its callbacks; a stream may not pickle)
        self.live = self.stream.isatty()
        self.every = 1.0 if self.live else every
        self.started = time.monotonic()
        self.printed = float("-inf")
        self.logged: Counts | None = None

    @property
    def stream(self) -> TextIO:
        return self.out or sys.stderr

    def on_step_begin(self, iteration, trials, **info):
        self.update()

    def on_experiment_end(self, trials, **info):
        self.update(final=True)

    def update(self, final: bool = False) -> None:
        counts = Counts.of(self.searcher)
        if counts != self.logged:  # the parent run follows every change
            self.logged = counts
            values = {
                "trials_finished": counts.finished,
                "trials_solved": counts.solved,
                "trials_running": counts.running,
                "trials_failed": counts.failed,
            }
            self.writer.log(self.parent, values, step=counts.finished)
        now = time.monotonic()
        if final or now - self.printed >= self.every:
            self.printed = now
            text = line(counts, now - self.started)
            if self.live:
                self.stream.write("\r" + text.ljust(110) + ("\n" if final else ""))
            else:
                self.stream.write(text + "\n")
            self.stream.flush()


def trial_name(trial) -> str:
    """The cell and its learning rate (a fused trial's, joined by +)."""
    lrs = "+".join(f"{m['lr']:g}" for m in members(trial.config))
    return f"{trial.config['cell']['name']}-lr{lrs}"


def reporter() -> CLIReporter:
    """Ray's trial table, with ``sweep.runs.console: table`` (the progress line of ``pipeline.scheduling.console``
    comes either way), compact: a row per cell (named task-arch-width-depth-seed) with its cell id, step and
    accuracies; refreshed every 30 s in logs."""
    return CLIReporter(
        parameter_columns={"cell/cell_id": "cell id"},
        metric_columns={"step": "step", "val_token_accuracy": "token acc", "final_accuracy": "answer acc"},
        max_report_frequency=10 if sys.stdout.isatty() else 30,
        max_progress_rows=40,
    )
