"""The training settings every trial of a sweep shares: one record, made of the sections a trial reads.

``TrainSettings.of(cfg)`` takes the validated config's ``model``, ``optim``, ``verdict`` and ``evaluation`` sections
whole and the trial's view of ``resources`` (``ResourcesSection.in_trial``: threads, GPU use and share, workers), so
the defaults live in one place (``pipeline/common/config.py``). Two fields say what the sweep decides from other
keys: the solving threshold (``report.accuracy_threshold``) and each task's training target (the highest threshold a
claim on it reads, given by the sweep stage). What only the sweep reads sits in sections no trial holds: the
learning rates in ``search`` (a trial's own rides on its spec), the architecture options in ``grid`` (a cell carries
its architecture's), the resources a trial asks Ray for in ``resources``.

A trial receives the record flat (``params``: each setting by its name, as MLflow logs it, ``train.<name>``, and as
the reuse key hashes it) and rebuilds it (``from_params``): every key of the rebuilt record is the profile's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from pipeline.common.config import (
    Config,
    EvaluationSection,
    ModelSection,
    OptimSection,
    ReportConfig,
    Section,
    TrialResources,
    VerdictSection,
)


@dataclass(kw_only=True)
class TrainSettings:
    model: ModelSection = field(default_factory=ModelSection)
    optim: OptimSection = field(default_factory=OptimSection)
    verdict: VerdictSection = field(default_factory=VerdictSection)
    evaluation: EvaluationSection = field(default_factory=EvaluationSection)
    resources: TrialResources = field(default_factory=TrialResources)
    # derived by the sweep
    threshold: float = ReportConfig.model_fields["accuracy_threshold"].default  # validation accuracy: solved
    targets: dict[str, float] = field(default_factory=dict)  # task -> accuracy a solved trial trains on to

    @classmethod
    def of(cls, cfg: Config, targets: dict[str, float] | None = None) -> TrainSettings:
        s = cfg.sweep
        return cls(
            model=s.model,
            optim=s.optim,
            verdict=s.verdict,
            evaluation=s.evaluation,
            resources=s.resources.in_trial(),
            threshold=cfg.report.accuracy_threshold,
            targets=targets or {},
        )

    def params(self) -> dict[str, Any]:
        """The settings flat, by name, as a trial receives them (``TrialSpec.for_cell``) and MLflow logs them
        (``train.<name>``): each section's keys, and the derived fields."""
        flat = {key: value for name in SECTIONS for key, value in getattr(self, name).model_dump().items()}
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
            if key in SECTIONS:
                raise TypeError(f"TrainSettings.from_params: {key!r} is not a trial's setting")
            if key in SECTION_OF:
                grouped[SECTION_OF[key]][key] = value
            else:
                derived[key] = value  # a name no field has: the dataclass's TypeError names it
        built: dict[str, Any] = {name: SECTIONS[name].model_validate(values) for name, values in grouped.items()}
        return cls(**built, **derived)


# the fields of TrainSettings that are sections, and their models
SECTIONS: dict[str, type[Section]] = {
    "model": ModelSection,
    "optim": OptimSection,
    "verdict": VerdictSection,
    "evaluation": EvaluationSection,
    "resources": TrialResources,
}
# each flat key -> its section (no key is in two: tests/test_records.py)
SECTION_OF = {key: name for name, model in SECTIONS.items() for key in model.model_fields}
