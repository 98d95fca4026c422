"""What Ray Tune calls during a sweep, kept apart from the logic it drives so that the forecast, the replay and a
trial outside Tune import no Ray: the cell searcher with Tune's ``Searcher`` as its base, and the callbacks that
learn where a paused trial left its checkpoint and delete a finished trial's."""

from __future__ import annotations

from pathlib import Path

from ray import tune
from ray.tune.search import Searcher

from pipeline.data.storage import location_of
from pipeline.search.searcher import CellSearcher
from pipeline.training.checkpoints import drop_checkpoints, drop_trial
from pipeline.training.status import Status

RESUME = (
    "a sweep resumes with `dvc repro` (or python -m pipeline.sweep), not Tuner.restore: its state is the runs "
    "MLflow holds (a finished one is reused) and the trials' checkpoints (an unfinished one continues from its "
    "newest); see docs/cluster.md, 'Surviving failures'"
)


# Ray's annotation of ``suggest`` leaves out Searcher.FINISHED, which its docstring and SearchGenerator accept
class TuneSearcher(CellSearcher, Searcher):  # type: ignore[misc]
    """``CellSearcher`` as Tune's ``search_alg`` (its ``suggest``, ``on_trial_result``, ``on_trial_complete``
    override Tune's; the rest is Tune's own)."""

    def save(self, checkpoint_path: str) -> None:
        """Tune saves a searcher with its experiment; this one's state is not Tune's to keep (``RESUME``), so the
        file says where it is."""
        Path(checkpoint_path).write_text(RESUME + "\n")

    def restore(self, checkpoint_path: str) -> None:
        raise RuntimeError(f"Tuner.restore cannot continue this sweep: {RESUME}")


class RungCheckpoints(tune.Callback):
    """Where a trial that paused at a rung left its checkpoint (the last one it reported, at the rung's
    validation), for the searcher to continue it from; ``storage``: the sweep's storage path."""

    def __init__(self, searcher: CellSearcher, storage: str):
        self.searcher, self.storage = searcher, storage

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if result.get("final") and result.get("status") == Status.PAUSED and trial.checkpoint is not None:
            self.searcher.rung_checkpoints[trial.trial_id] = location_of(trial.checkpoint.path, self.storage)


class DropFinished(tune.Callback):
    """Listed after ``ChildRuns`` (which has then set the trial's MLflow run FINISHED, with its verdict): a trial
    that ended deletes its checkpoints, and those of the dead sweep's trial it continued from. A trial that failed
    keeps them (``on_trial_error``, not ``on_trial_complete``), one paused at a rung of successive halving too: it
    may go on from them (the sweep deletes a dropped one's, ``drop_trial``)."""

    def on_trial_complete(self, iteration, trials, trial, **info):
        if trial.last_result.get("status") != Status.PAUSED:
            drop_checkpoints(trial.storage.storage_filesystem, trial.path)
        if trial.config.get("resume"):  # <storage>/<dead sweep or the paused attempt>/<trial>/checkpoint_NNNNNN
            drop_trial(trial.config["resume"])
