"""The training settings every trial of a sweep shares: one record, made of the ``sweep`` sections a trial reads.

``TrainSettings.of(cfg)`` takes the validated config's sections whole (``model``, ``optim``, ``verdict``,
``evaluation``, ``resources``), so the defaults live in one place (``pipeline/common/config.py``). The six derived
fields say what the sweep decides from other keys: the solving threshold (``report.accuracy_threshold``) and each
task's training target (the highest threshold a claim on it reads, given by the sweep stage), the CPU threads and
GPU use of a worker, the share of a GPU, and the data-parallel workers.

A trial receives the record flat (``params``: each setting by its name, as MLflow logs it, ``train.<name>``, and as
the reuse key hashes it) and rebuilds it (``from_params``). The keys of those sections that are the sweep's, not a
trial's (``SWEEP_ONLY``), are left out of the flat form, so the record a trial rebuilds has them at their defaults:
its learning rate and architecture options ride on its cell, its CPUs, GPUs and workers are the derived fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, cast

from pipeline.common.config import (
    MOVED,
    Config,
    EvaluationSection,
    ModelSection,
    OptimSection,
    ReportConfig,
    ResourcesSection,
    Section,
    SweepConfig,
    VerdictSection,
)

# keys of a trial's sections that the sweep reads and a trial does not: none is a trial's setting, logged or hashed as
# one (the reuse key hashes the architecture options beside them, sweep.reuse_settings)
SWEEP_ONLY = {
    "arch_options",
    "lr",
    "lrs",
    "arch_lrs",
    "cpus_per_trial",
    "gpus_per_trial",
    "workers_per_trial",
    "fuse",
    "max_concurrent_trials",
}


@dataclass(kw_only=True)
class TrainSettings:
    model: ModelSection = field(default_factory=ModelSection)
    optim: OptimSection = field(default_factory=OptimSection)
    verdict: VerdictSection = field(default_factory=VerdictSection)
    evaluation: EvaluationSection = field(default_factory=EvaluationSection)
    resources: ResourcesSection = field(default_factory=ResourcesSection)
    # derived by the sweep
    threshold: float = ReportConfig.model_fields["accuracy_threshold"].default  # validation accuracy: solved
    targets: dict[str, float] = field(default_factory=dict)  # task -> accuracy a solved trial trains on to
    threads: int = ResourcesSection.model_fields["cpus_per_trial"].default
    use_gpu: bool = False
    gpu_share: float = 1.0  # of one GPU, per worker: gpus_per_trial below 1
    workers: int = 1  # data-parallel processes (pipeline/training/distributed.py), sharing each global batch

    @classmethod
    def of(cls, cfg: Config, targets: dict[str, float] | None = None) -> TrainSettings:
        s = cfg.sweep
        return cls(
            model=s.model,
            optim=s.optim,
            verdict=s.verdict,
            evaluation=s.evaluation,
            resources=s.resources,
            threshold=cfg.report.accuracy_threshold,
            targets=targets or {},
            threads=s.resources.cpus_per_trial,
            use_gpu=s.resources.gpus_per_trial > 0,
            gpu_share=min(1.0, s.resources.gpus_per_trial) or 1.0,
            workers=s.resources.workers(),
        )

    def params(self) -> dict[str, Any]:
        """The settings flat, by name, as a trial receives them (``TrialSpec.for_cell``) and MLflow logs them
        (``train.<name>``): each section's keys but ``SWEEP_ONLY``, and the derived fields."""
        flat = {
            key: value
            for name in SECTIONS
            for key, value in getattr(self, name).model_dump().items()
            if key not in SWEEP_ONLY
        }
        return flat | {f.name: getattr(self, f.name) for f in fields(self) if f.name not in SECTIONS}

    def replaced(self, **changes: Any) -> TrainSettings:
        """A trial's record with the settings ``changes`` names (flat, as in ``params``) changed."""
        return self.from_params(self.params() | changes)

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> TrainSettings:
        """The record ``params`` flattened; a key it does not know is an error, not dropped."""
        grouped: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
        derived: dict[str, Any] = {}
        for key, value in params.items():
            if key in SECTIONS or key in SWEEP_ONLY:
                raise TypeError(f"TrainSettings.from_params: {key!r} is not a trial's setting")
            if MOVED.get(key) in grouped:
                grouped[MOVED[key]][key] = value
            else:
                derived[key] = value  # a name no field has: the dataclass's TypeError names it
        built: dict[str, Any] = {name: SECTIONS[name].model_validate(values) for name, values in grouped.items()}
        return cls(**built, **derived)


# the fields of TrainSettings that are sections of the sweep, and their models
SECTIONS: dict[str, type[Section]] = {
    f.name: cast(type[Section], SweepConfig.model_fields[f.name].annotation)
    for f in fields(TrainSettings)
    if f.name in SweepConfig.model_fields
}
