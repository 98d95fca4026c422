"""The reuse key's settings are pinned: a change of how the config is spelled or grouped leaves the key of the same
settings as it was, so that a sweep still reuses the runs that earlier sweeps finished (``sweep.runs.reuse``), and the
names a trial's settings are logged under in MLflow (``train.<name>``) stay those the reports and nightly read."""

import hashlib
import json

from pipeline.common.config import load_config
from pipeline.scheduling.driver import reuse_settings
from pipeline.training.settings import TrainSettings
from tasks.registry import training_targets
from tests.helpers import write_params

# the tiny profile with a value off its default in every section a trial's settings come from, and halving rungs
OVERRIDES = """profile: tiny
tasks: [arithmetic, lis]
sweep:
  grid:
    arch_options: {mamba: {d_state: 8}}
  search:
    lr_search: halving
    halving_rungs: [4]
    halving_keep: 0.4
    lrs: [1.0e-3, 3.0e-3]
  optim:
    optimizer: adam
    weight_decay: 0.0
    grad_clip: 0.5
    precision: bf16-mixed
    warmup_fraction: 0.2
  verdict:
    patience: 3
    min_delta: 0.02
  evaluation:
    eval_batch_size: 64
  resources:
    memory_gb_per_trial: 2.0
    loader_workers: 1
    step: compiled
    cpus_per_trial: 2
"""
NAMES = ["batch_size", "convergence_min_steps", "convergence_tolerance", "convergence_window", "dropout", "epochs",
         "eval_batch_size", "eval_samples", "gpu_share", "grad_clip", "heads", "loader_workers", "max_budget_factor",
         "max_steps", "memory_gb_per_trial", "micro_batches", "min_delta", "optimizer", "patience", "precision",
         "step", "stop_when_solved", "targets", "threads", "threshold", "use_gpu", "val_every_steps", "val_samples",
         "warmup_fraction", "weight_decay", "workers"]
PINNED = "d6e0f5c1604401c2ac268742c6c35d18478a996db75e99ac3958d459d096b49f"


def test_the_reuse_key_hashes_the_same_settings_under_the_same_names(tmp_path):
    cfg = load_config(write_params(tmp_path / "params.yaml", OVERRIDES))
    train = TrainSettings.of(cfg, training_targets(["arithmetic", "lis"], cfg.report.accuracy_threshold)).params()
    assert sorted(train) == NAMES  # logged as MLflow params train.<name>
    hashed = json.dumps(reuse_settings(cfg, train), sort_keys=True)
    assert hashlib.sha256(hashed.encode()).hexdigest() == PINNED, hashed
