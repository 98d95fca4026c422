"""A trial resumed from any of its checkpoints ends exactly as the trial that never stopped."""


from pipeline.training.checkpoint_store import drop_trial, latest, write_meta
from pipeline.training.checkpoints import FILE
from pipeline.training.train import run_trial
from tests.helpers.training import Copies, Curve, with_settings


def test_resume_from_each_checkpoint_gives_the_uninterrupted_result(spec, tmp_path):
    whole, kept = Curve(), Copies(folder=tmp_path)
    # a budget of 20 steps, extended (the trial is not judged converged before step 30): checkpoints before and
    # after the extension must both resume into the extended budget
    spec = with_settings(spec, max_steps=20, max_budget_factor=4, convergence_min_steps=30)
    full = run_trial(spec, callbacks=[whole], checkpoints=kept)
    saved = kept.saved
    assert full["checkpoints"] == len(saved) >= 3 and full["checkpoint_bytes"] > 0
    assert len({p[0] for p in whole.points}) == len(whole.points)  # no validation ran twice
    assert full["budget_steps"] > 20 and full["train_steps"] > 20 and full["status"] in ("unsolved", "undecided")
    for step in sorted(saved):  # the last one too: killed while scoring the test set
        tail, resuming = Curve(), Copies(saved[step] / FILE)
        resumed = run_trial(spec, callbacks=[tail], checkpoints=resuming)
        heard = resuming.told
        assert resumed["resumed_step"] == step
        assert heard == [p for p in whole.points if p[0] == step]  # the checkpoint's own validation
        assert tail.points == [p for p in whole.points if p[0] > step], f"resumed at step {step}"
        for key in ("status", "reason", "final_accuracy", "val_accuracy", "train_steps", "budget_steps",
                    "train_pflops", "solve_step"):
            assert resumed[key] == full[key] or (resumed[key] != resumed[key] and full[key] != full[key]), key


def test_latest_finds_the_newest_checkpoint_of_the_same_run_key(tmp_path):
    for sweep, trial, n, key, step in [("a", "t1", 1, "k", 5), ("a", "t1", 2, "k", 10), ("b", "t1", 1, "k", 7),
                                       ("b", "t2", 1, "other", 20)]:
        directory = tmp_path / sweep / trial / f"checkpoint_{n:06d}"
        directory.mkdir(parents=True)
        write_meta(directory, trial_key=trial, run_key=key, step=step)
    (tmp_path / "a" / "t1" / "checkpoint_000003").mkdir()  # being copied: no meta yet
    assert latest(str(tmp_path), "k") == {"t1": {"path": str(tmp_path / "a" / "t1" / "checkpoint_000002"),
                                                 "step": 10}}
    assert latest(str(tmp_path / "missing"), "k") == {}
    uri = latest(tmp_path.as_uri(), "k")["t1"]["path"]  # s3:// and gs:// take the same way
    assert uri == (tmp_path / "a" / "t1" / "checkpoint_000002").as_uri()


def test_a_fused_trials_members_are_found_and_dropped_one_by_one(tmp_path):
    """A fused trial's checkpoint holds a directory per member, each a separate trial's checkpoint: ``latest`` finds
    each member under its own trial key, and dropping one member deletes its directories only, then a checkpoint
    once no member is left in it."""
    trial = tmp_path / "sweep" / "fused"
    for n, step in ((1, 5), (2, 10)):
        for member in ("t1", "t2"):
            directory = trial / f"checkpoint_{n:06d}" / member
            directory.mkdir(parents=True)
            write_meta(directory, trial_key=member, run_key="k", step=step)
    found = latest(str(tmp_path), "k")
    assert found == {m: {"path": str(trial / "checkpoint_000002" / m), "step": 10} for m in ("t1", "t2")}
    drop_trial(found["t1"]["path"])
    assert sorted(p.relative_to(trial).as_posix() for p in trial.glob("*/*")) == [
        "checkpoint_000001/t2", "checkpoint_000002/t2"]
    drop_trial(found["t2"]["path"])
    assert not list(trial.iterdir())


def test_a_trial_resumes_from_a_checkpoint_saved_after_it_solved(spec, tmp_path):
    """Solved at a low threshold, it trains on toward its target: the checkpoints saved after it solved hold its
    verdict's status as a plain value (it once held the Status class, which a weights-only load refuses) and resume
    to the uninterrupted result."""
    spec = with_settings(spec, max_steps=20, threshold=0.05, patience=1, targets={"lis": 0.99})
    kept = Copies(folder=tmp_path)
    full = run_trial(spec, checkpoints=kept)
    assert full["status"] == "solved" and full["solve_step"] < max(kept.saved)
    last = kept.saved[max(kept.saved)]
    resumed = run_trial(spec, checkpoints=Copies(last / FILE))
    assert resumed["resumed_step"] == max(kept.saved)
    for key in ("status", "reason", "final_accuracy", "solve_step", "train_steps"):
        assert resumed[key] == full[key], key
