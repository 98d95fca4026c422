"""A trial resumed from any of its checkpoints ends exactly as the trial that never stopped."""

import shutil

import lightning as L
import pytest

from pipeline.training.checkpoints import FILE, latest, write_meta
from pipeline.data.datasets import dataset_path, read_dataset
from pipeline.training.train import TrialSpec, run_trial


class Curve(L.Callback):
    """(step, training loss, validation accuracy) at every validation."""

    def __init__(self):
        self.points = []

    def on_validation_end(self, trainer, module):
        m = trainer.callback_metrics
        self.points.append((trainer.global_step, float(m["train_loss"]), float(m["val_accuracy"])))


@pytest.fixture
def spec(tiny_cfg, tiny_data):
    size = tiny_cfg.generate.datasets["lis"][0]
    train, test = (dataset_path(tiny_data, "lis", size, s) for s in ("train", "test"))
    meta = read_dataset(train).meta
    # dropout on (the RNG must be put back), several epochs, validations mid-epoch and at an epoch's end
    return TrialSpec(arch="standard", width=16, depth=1, seed=3, train_path=str(train), test_path=str(test),
                     max_len=meta["stats"]["max_length"], vocab_size=len(meta["vocab"]), heads=2, dropout=0.1,
                     arch_options={}, batch_size=16, epochs=50, max_steps=40, lr=3e-3, weight_decay=0.01,
                     warmup_fraction=0.1, grad_clip=1.0, precision="32-true", val_samples=16, val_every_steps=5,
                     eval_samples=32, eval_batch_size=16, threads=1, use_gpu=False, threshold=0.99, patience=3,
                     plateau_checks=4, min_delta=0.0)


def test_resume_from_each_checkpoint_gives_the_uninterrupted_result(spec, tmp_path):
    saved = {}

    def keep(trainer, module, directory):
        saved[trainer.global_step] = shutil.copytree(directory, tmp_path / f"step-{trainer.global_step}")

    whole = Curve()
    full = run_trial(spec, callbacks=[whole], checkpoint=keep)
    assert full["checkpoints"] == len(saved) >= 3 and full["checkpoint_bytes"] > 0
    assert len({p[0] for p in whole.points}) == len(whole.points)  # no validation ran twice
    assert full["reason"].startswith("plateau")  # the last checkpoint is the stopping validation's
    for step in sorted(saved):  # the last one too: killed while scoring the test set
        tail, heard = Curve(), []
        resumed = run_trial(spec, callbacks=[tail], resume=saved[step] / FILE, resumed=lambda trainer, module, m:
                            heard.append((trainer.global_step, m["train_loss"], m["val_accuracy"])))
        assert resumed["resumed_step"] == step
        assert heard == [p for p in whole.points if p[0] == step]  # the checkpoint's own validation
        assert tail.points == [p for p in whole.points if p[0] > step], f"resumed at step {step}"
        for key in ("status", "reason", "final_accuracy", "val_accuracy", "train_steps", "train_pflops",
                    "solve_step"):
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
