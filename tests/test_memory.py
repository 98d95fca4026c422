"""Cells that fit: the measured memory plan, and a sweep whose trial cannot fit records so, once."""

from __future__ import annotations

import contextlib

import pytest
import torch

import models
from pipeline.training.memory import HEADROOM, DoesNotFit, fit_memory
from tests.helpers import write_params


def test_memory_plan_splits_the_batch_to_fit_and_names_what_does_not(spec):
    """Measured bytes of one sample's activations; a budget for 10 samples splits 32 into 4 passes; one below a
    single sample is an error saying how many GB it needs."""
    model = models.build_model("standard", vocab_size=20, width=32, depth=2, heads=2, max_len=60)
    cpu = torch.device("cpu")
    one = fit_memory(model, 60, 32, None, cpu, contextlib.nullcontext)
    assert (
        one.micro_batches == 1 and one.per_sample > 0 and one.static == 16 * sum(p.numel() for p in model.parameters())
    )
    # grows with length
    assert fit_memory(model, 30, 32, None, cpu, contextlib.nullcontext).per_sample < one.per_sample
    fits = fit_memory(model, 60, 32, HEADROOM * (one.static + 10.5 * one.per_sample), cpu, contextlib.nullcontext)
    assert fits.micro_batches == 4
    with pytest.raises(DoesNotFit, match=r"needs [\d.e-]+ GB at one sample per forward pass .* has [\d.e-]+ GB"):
        fit_memory(model, 60, 32, one.static, cpu, contextlib.nullcontext)


@pytest.mark.integration
def test_a_trial_that_cannot_fit_is_recorded_failed_with_what_it_needs_and_not_retried(tmp_path, tiny_data):
    """Ray Tune, Lightning and MLflow: a budget below one sample's needs; the trial's row and its MLflow run say
    failed, "does not fit: needs N GB", with no restart (a retry would not fit either)."""
    import pandas as pd
    from mlflow.tracking import MlflowClient

    from pipeline.common.config import load_config
    from pipeline.scheduling.driver import sweep

    store, db = tmp_path / "store", tmp_path / "mlflow.db"
    p = write_params(
        tmp_path / "params.yaml",
        f"""
profile: tiny
tasks: [arithmetic, lis]
sweep: {{grid: {{architectures: [standard], widths: [8], datasets: {{lis: [3]}}}},
         resources: {{memory_gb_per_trial: 0.00001}}}}
cluster: {{mlflow_tracking_uri: "sqlite:///{db}", storage_path: "{store}"}}
""",
    )
    sweep(load_config(p), tiny_data, tmp_path / "results")
    trials = pd.read_csv(tmp_path / "results" / "trials.csv")
    assert len(trials) == 1 and trials.status[0] == "failed"
    assert trials.reason[0].startswith("does not fit: needs ")
    assert "GB at one sample per forward pass" in trials.reason[0] and trials.reason[0].endswith("GPU share)")
    client = MlflowClient(f"sqlite:///{db}")
    run = client.get_run(trials.mlflow_run_id[0])
    assert run.data.tags["status"] == "failed" and "restarts" not in run.data.tags
