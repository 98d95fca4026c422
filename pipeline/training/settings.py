"""The training settings every trial of a sweep shares: one record, its fields named as in the ``sweep`` section.

``TrainSettings.of(cfg)`` reads them from the validated config; a field's default is ``SweepConfig``'s own, so the
defaults live in one place (``pipeline/common/config.py``). The six derived fields say what the sweep decides
from other keys: the solving threshold (``report.accuracy_threshold``) and each task's training target (the
highest threshold a claim on it reads, given by the sweep stage), the CPU threads and GPU use of a worker,
the share of a GPU, and the data-parallel workers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from pydantic import BaseModel

from pipeline.common.config import Config, Precision, ReportConfig, StepMode, SweepConfig


def default(name: str, section: type[BaseModel] = SweepConfig) -> Any:
    return field(default=section.model_fields[name].default)


@dataclass(kw_only=True)
class TrainSettings:
    heads: int = default("heads")
    dropout: float = default("dropout")
    optimizer: str = default("optimizer")
    batch_size: int = default("batch_size")
    epochs: int = default("epochs")
    max_steps: int = default("max_steps")
    weight_decay: float = default("weight_decay")
    warmup_fraction: float = default("warmup_fraction")
    grad_clip: float | None = default("grad_clip")
    precision: Precision = default("precision")
    patience: int = default("patience")
    convergence_window: float = default("convergence_window")
    convergence_tolerance: float = default("convergence_tolerance")
    convergence_min_steps: int = default("convergence_min_steps")
    min_delta: float = default("min_delta")
    max_budget_factor: int = default("max_budget_factor")
    stop_when_solved: bool = default("stop_when_solved")
    val_samples: int = default("val_samples")
    val_every_steps: int | None = default("val_every_steps")
    eval_samples: int | None = default("eval_samples")
    eval_batch_size: int = default("eval_batch_size")
    memory_gb_per_trial: float | None = default("memory_gb_per_trial")
    micro_batches: int | None = default("micro_batches")
    loader_workers: int = default("loader_workers")
    step: StepMode = default("step")
    # derived by the sweep
    threshold: float = default("accuracy_threshold", ReportConfig)  # validation accuracy that counts as solved
    targets: dict[str, float] = field(default_factory=dict)  # task -> accuracy a solved trial trains on to
    threads: int = default("cpus_per_trial")
    use_gpu: bool = False
    gpu_share: float = 1.0  # of one GPU, per worker: gpus_per_trial below 1
    workers: int = 1  # data-parallel processes (pipeline/training/distributed.py), sharing each global batch

    @classmethod
    def of(cls, cfg: Config, targets: dict[str, float] | None = None) -> TrainSettings:
        s = cfg.sweep
        derived: dict[str, Any] = {
            "threshold": cfg.report.accuracy_threshold,
            "targets": targets or {},
            "threads": s.cpus_per_trial,
            "use_gpu": s.gpus_per_trial > 0,
            "gpu_share": min(1.0, s.gpus_per_trial) or 1.0,
            "workers": s.workers(),
        }
        return cls(**{f.name: getattr(s, f.name) for f in fields(cls) if f.name not in derived}, **derived)

    def params(self) -> dict[str, Any]:
        """The settings as a trial receives them (``TrialSpec.for_cell``) and MLflow logs them (``train.<name>``)."""
        return asdict(self)
