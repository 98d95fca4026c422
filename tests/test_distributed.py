"""The data-parallel path on CPU (DDP over gloo): two workers train as one does, at the same global batch."""

import math
import sys

import pandas as pd
import pytest

from pipeline.training.checkpoints import FILE
from pipeline.training.train import run_trial
from tests.helpers.training import Copies, Curve, with_settings

pytestmark = pytest.mark.slow


def test_two_workers_follow_one_workers_loss_curve(spec):  # noqa: F811
    one = with_settings(spec, dropout=0.0, max_steps=30)
    curves = {}
    results = {}
    for workers in (1, 2):
        curves[workers] = Curve()
        results[workers] = run_trial(with_settings(one, workers=workers), callbacks=[curves[workers]])
    assert [p[0] for p in curves[2].points] == [p[0] for p in curves[1].points]
    for (_, loss1, _), (_, loss2, _) in zip(curves[1].points, curves[2].points):
        # same global batch, same mean loss (each worker's share weighted by its tokens): only the order of
        # floating-point sums differs
        assert math.isclose(loss1, loss2, rel_tol=1e-3), (curves[1].points, curves[2].points)
    for key in ("train_steps", "train_pflops"):  # every worker's compute counted, once
        assert results[2][key] == results[1][key], key
    assert results[2]["val_accuracy"] == pytest.approx(results[1]["val_accuracy"], abs=0.07)


def test_a_two_worker_trial_resumes_exactly(spec, tmp_path):
    two = with_settings(spec, workers=2, max_steps=30)
    whole, kept = Curve(), Copies(folder=tmp_path)
    full = run_trial(two, callbacks=[whole], checkpoints=kept)
    saved = kept.saved
    step = sorted(saved)[len(saved) // 2]
    tail = Curve()
    resumed = run_trial(two, callbacks=[tail], checkpoints=Copies(saved[step] / FILE))
    assert tail.points == [p for p in whole.points if p[0] > step]
    assert resumed["train_pflops"] == full["train_pflops"] and resumed["final_accuracy"] == full["final_accuracy"]


@pytest.mark.integration
def test_a_sweep_trains_each_trial_on_two_workers_and_names_what_the_cluster_lacks(generated, tmp_path):
    from tests.helpers.repo import copy_generated, run

    repo = copy_generated(generated, tmp_path, """sweep:
  grid:
    architectures: [standard]
    widths: [16]
    datasets: {lis: [3]}
  resources:
    workers_per_trial: 2""")
    greedy = run([sys.executable, "-m", "pipeline.sweep", "--params", str(write(repo, "cpus_per_trial: 8"))], repo)
    assert greedy.returncode == 2 and "a trial needs 16 CPUs and 0 GPUs on one node" in greedy.stderr
    assert not (repo / "results" / "trials.csv").exists()
    result = run(["dvc", "repro", "sweep"], repo)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    trials = pd.read_csv(repo / "results" / "trials.csv")
    assert len(trials) == 1 and trials.status.iloc[0] in ("unsolved", "undecided") and trials.train_pflops.iloc[0] > 0


def write(repo, line: str):
    """params.yaml of ``repo`` with one more setting of its sweep's resources section, as another file."""
    path = repo / "params-more.yaml"
    path.write_text((repo / "params.yaml").read_text().replace("  resources:\n", f"  resources:\n    {line}\n", 1))
    return path
