"""Typed, validated configuration: ``params.yaml`` picks a profile in ``conf/`` and may override any key.

Effective config = the model defaults below  <-  ``conf/<profile>.yaml``  <-  the sections of ``params.yaml``.
Sections mirror the stages of ``dvc.yaml``: ``generate``, ``sweep``, ``report``; ``cluster`` says where Ray
and MLflow run (not tracked by DVC: moving to another server does not invalidate results).
Every check that can fail runs here, before any data is generated or Ray starts.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal, cast

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    FiniteFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

import tasks
from pipeline.common import locks

ROOT = Path(__file__).resolve().parents[2]  # the checkout whose code runs
CONF_DIR = ROOT / "conf"
# DVC runs `dvc exp run --temp` and queued experiments (`dvc queue start`) in a copy of the checkout, deleted once
# it has collected the experiment's outputs: <project>/.dvc/tmp/exps/tmpXXXX (standalone/tmpXXXX for --temp)
DVC_COPY = (".dvc", "tmp", "exps")


def project_root(code: Path) -> Path:
    """The checkout whose stores a sweep keeps its results in (MLflow's SQLite store and artifacts, the storage
    path's checkpoints and published datasets, and so what later sweeps reuse): ``code`` itself, or the project a
    DVC experiment's temporary copy was made from, which outlives the copy. Read from the copy's path, which DVC
    always places there (its $DVC_ROOT says the same, but only in the processes DVC starts)."""
    parts = code.parts
    for i in range(len(parts) - len(DVC_COPY)):
        if parts[i : i + len(DVC_COPY)] == DVC_COPY:
            return Path(*parts[:i])
    return code


PROJECT = project_root(ROOT)
# held by the sweep that trains against the project's stores: DVC's parallel queue workers (`dvc queue start -j N`)
# take turns, so that each trains on every core, never both at once, and the second reuses what the first trained
STORES_LOCK = PROJECT / locks.STORES_LOCK
# set to 1 in a sweep's environment (``pipeline.nightly --force``): that sweep reuses no finished run and continues
# no checkpoint, whatever ``sweep.runs.reuse`` says. Reuse decides what trains, never what a result is, so a one-off
# rerun from scratch need not change params.yaml (and leave it changed for the nights after)
RETRAIN_ENV = "CAPACITY_ATLAS_RETRAIN"


class ConfigError(ValueError):
    """A profile or parameter that cannot work; the message names the key and the allowed values."""


def one_of(key: str, value: Any, allowed) -> ConfigError:
    return ConfigError(f"{key}: {value!r} is not allowed; allowed values: {', '.join(map(str, sorted(allowed)))}")


def distinct(key: str, values: list[Any]) -> None:
    """A repeat names one trial (or dataset) twice: it runs once, and the grid is smaller than it reads."""
    if len(set(values)) != len(values):
        raise ConfigError(f"{key}: {values} has repeats; allowed: distinct values")


class Section(BaseModel):
    # strict: YAML's `heads: true` or `epochs: "5"` is a mistake, not 1 or 5 (ints still pass for floats);
    # finite: an .inf or .nan passes every bound check (ge=0) and breaks the arithmetic after it
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


def not_blank(value: str) -> str:
    if not value.strip():
        raise PydanticCustomError("blank", "Input should be a non-blank string")
    return value


NonBlank = Annotated[str, AfterValidator(not_blank)]
# the generator and checker processes: the files are byte-identical for any number, so more than a machine's cores
# only costs memory and start-up (and a typo such as 1000 would start 1000 processes)
MAX_WORKERS = 64
# Lightning's seed_everything takes a uint32: a larger seed would fail in every trial, after the data is made
MAX_SEED = 2**32 - 1
# Lightning's names of the precisions a trial may train in
Precision = Literal["32-true", "bf16-mixed", "16-mixed"]
StepMode = Literal["eager", "compiled", "graphed"]  # how a training step runs (sweep.resources.step)


class TaskGenerate(Section):
    """Per-task exceptions to the generate section (the DP and separations papers use different scales)."""

    train_samples: PositiveInt | None = None
    test_samples: PositiveInt | None = None
    val_samples: PositiveInt | None = None
    unique: bool | None = None


class GenerateConfig(Section):
    seed: NonNegativeInt = Field(2023, description="numpy's SeedSequence takes non-negative seeds")
    train_samples: PositiveInt
    test_samples: PositiveInt
    val_samples: PositiveInt = Field(
        1024,
        description="validation samples, drawn as the test samples are (the verdicts are reached on them): at least "
        "sweep.evaluation.val_samples",
    )
    datasets: dict[str, list[PositiveInt]] = Field(description="task name -> sizes to generate")
    task_params: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="task name -> generator parameters"
    )
    row_group_size: PositiveInt = 65_536
    unique: bool = Field(
        True,
        description="every sample distinct, and test, validation and train disjoint; false: i.i.d. draws "
        "with repeats, as the separations paper samples online",
    )
    chunk_size: PositiveInt = Field(
        4096,
        le=1 << 20,  # a chunk is held in memory whole
        description="samples per seeded generator chunk: part of the seed, changing it changes the data",
    )
    workers: PositiveInt = Field(
        1,
        description="generator and checker processes (1: in the stage's own process); "
        "the files are byte-identical for any value",
    )
    validate_samples: PositiveInt | None = Field(
        None, description="samples per file checked by the task's checker as it is written; None = every sample"
    )
    per_task: dict[str, TaskGenerate] = Field(
        default_factory=dict,
        description="task name -> train_samples, test_samples, val_samples or unique for that task only",
    )

    @field_validator("datasets")
    @classmethod
    def distinct_sizes(cls, datasets: dict[str, list[int]]) -> dict[str, list[int]]:
        """Each task's sizes named once."""
        for task, sizes in datasets.items():
            distinct(f"generate.datasets.{task}", sizes)
        return datasets

    @model_validator(mode="after")
    def few_enough_workers(self) -> GenerateConfig:
        """At most MAX_WORKERS processes: more only cost memory and start-up."""
        if self.workers > MAX_WORKERS:
            raise ConfigError(
                f"generate.workers: {self.workers} is more than {MAX_WORKERS} processes; allowed: 1 to "
                f"{MAX_WORKERS} (the files are byte-identical for any number, so more processes than "
                "cores only cost memory and start-up)"
            )
        return self

    def for_task(self, task: str) -> GenerateConfig:
        """This section as it applies to ``task``: its per_task entry, if any, wins."""
        over = self.per_task.get(task)
        return self if over is None else self.model_copy(update=over.model_dump(exclude_none=True))


def check_widths(key: str, widths: list[int], heads: int, search: str) -> None:
    """One list of widths: some, multiples of the heads, increasing, and two or more for the frontier search."""
    if not widths:
        raise ConfigError(f"{key} is empty: the grid would have no trials")
    for width in widths:
        if width % heads:
            raise ConfigError(
                f"{key}: {width} is not divisible by sweep.model.heads = {heads}; allowed widths are multiples of "
                f"{heads}"
            )
    if widths != sorted(set(widths)):
        raise ConfigError(
            f"{key}: {widths} must be strictly increasing (sorted, no repeats): the frontier and the "
            "heatmaps read widths in order"
        )
    if search == "frontier" and len(widths) < 2:
        raise ConfigError(
            f"{key}: {widths} is a single width; sweep.search.strategy: frontier needs at least two widths "
            "to search (use sweep.search.strategy: grid)"
        )


class CellPattern(Section):
    """Cells a profile leaves out of its grid: those matching every coordinate given (each a list of values)."""

    tasks: list[str] | None = None
    sizes: list[PositiveInt] | None = None
    architectures: list[str] | None = None
    widths: list[PositiveInt] | None = None
    depths: list[PositiveInt] | None = None

    def matches(self, task: str, size: int, arch: str, width: int, depth: int) -> bool:
        lists = (self.tasks, self.sizes, self.architectures, self.widths, self.depths)
        return all(values is None or value in values for values, value in zip(lists, (task, size, arch, width, depth)))

    def __str__(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.model_dump(exclude_none=True).items()) or "(every cell)"


class GridSection(Section):
    """What the sweep trains: the axes whose every combination is a cell, and the cells a profile leaves out."""

    architectures: list[str]
    widths: list[PositiveInt]
    depths: list[PositiveInt]
    seeds: list[Annotated[NonNegativeInt, Field(le=MAX_SEED)]] = [0]
    datasets: dict[str, list[PositiveInt]] | None = Field(None, description="subset of generate.datasets; None = all")
    task_architectures: dict[str, list[str]] = Field(
        default_factory=dict,
        description="task -> the architectures trained on it instead of sweep.grid.architectures (one profile, "
        "each paper's models on its own tasks)",
    )
    arch_depths: dict[str, list[PositiveInt]] = Field(
        default_factory=dict,
        description="architecture -> its own depths instead of sweep.grid.depths (the separations paper's LSTM "
        "stops at 3 layers)",
    )
    arch_widths: dict[str, list[PositiveInt]] = Field(
        default_factory=dict,
        description="architecture -> its own widths instead of sweep.grid.widths (a 1-layer Transformer at 64 "
        "beside an LSTM at 64..256)",
    )
    arch_options: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="architecture -> its options (models.ARCHITECTURES: a sparse pattern's window, Mamba's state "
        "size); a cell carries its architecture's",
    )
    exclude: list[CellPattern] = Field(
        default_factory=list,
        description="cells left out of the grid: each entry matches the cells whose coordinates are all among its "
        "lists (tasks, sizes, architectures, widths, depths); the cells a paper's figures did not run",
    )

    @field_validator("architectures", "widths", "depths", "seeds")
    @classmethod
    def axis_not_empty(cls, values: list[Any], info: ValidationInfo) -> list[Any]:
        """An axis of the grid with no value leaves it with no trials."""
        if not values:
            raise ConfigError(f"sweep.grid.{info.field_name} is empty: the grid would have no trials")
        return values

    @field_validator("architectures", "depths", "seeds")
    @classmethod
    def axis_distinct(cls, values: list[Any], info: ValidationInfo) -> list[Any]:
        """Each value of an axis named once (the widths: in SweepConfig.widths_fit)."""
        distinct(f"sweep.grid.{info.field_name}", values)
        return values

    @field_validator("datasets")
    @classmethod
    def distinct_sizes(cls, datasets: dict[str, list[int]] | None) -> dict[str, list[int]] | None:
        """Each task's sizes named once."""
        for task, sizes in (datasets or {}).items():
            distinct(f"sweep.grid.datasets.{task}", sizes)
        return datasets

    @field_validator("arch_depths")
    @classmethod
    def own_depths(cls, arch_depths: dict[str, list[int]]) -> dict[str, list[int]]:
        """An architecture's own depths: at least one, each once."""
        for arch, depths in arch_depths.items():
            if not depths:
                raise ConfigError(f"sweep.grid.arch_depths.{arch} is empty: {arch} would have no trials")
            distinct(f"sweep.grid.arch_depths.{arch}", depths)
        return arch_depths

    @model_validator(mode="after")
    def task_architectures_swept(self) -> GridSection:
        """A task's own architectures: at least one, each of the grid's architectures, each once."""
        for task, archs in self.task_architectures.items():
            key = f"sweep.grid.task_architectures.{task}"
            if not archs:
                raise ConfigError(f"{key} is empty: {task} would have no trials")
            for arch in archs:
                if arch not in self.architectures:
                    raise one_of(key, arch, self.architectures)
            distinct(key, archs)
        return self

    def architectures_for(self, task: str) -> list[str]:
        return self.task_architectures.get(task, self.architectures)

    def depths_for(self, arch: str) -> list[int]:
        return self.arch_depths.get(arch, self.depths)

    def widths_for(self, arch: str) -> list[int]:
        return self.arch_widths.get(arch, self.widths)

    def excluded(self, task: str, size: int, arch: str, width: int, depth: int) -> bool:
        return any(p.matches(task, size, arch, width, depth) for p in self.exclude)

    def cells(self, datasets: list[tuple[str, int]]) -> list[tuple[str, int, str, int, int]]:
        """(task, size, arch, width, depth) of every cell the grid trains on ``datasets``, seeds aside."""
        return [
            (task, size, arch, width, depth)
            for task, size in datasets
            for arch in self.architectures_for(task)
            for width in self.widths_for(arch)
            for depth in self.depths_for(arch)
            if not self.excluded(task, size, arch, width, depth)
        ]


class ModelSection(Section):
    """The models' shape beyond the grid's width and depth."""

    heads: PositiveInt = 4
    dropout: float = Field(0.1, ge=0, lt=1)


class SearchSection(Section):
    """Which cells and learning rates train: every cell of the grid, or per (task, architecture, depth, seed) the
    smallest solved width; every learning rate to its verdict, or successive halving (pipeline.search)."""

    strategy: Literal["grid", "frontier"] = "grid"
    lr: FiniteFloat = Field(1e-4, gt=0, description="the learning rate, when sweep.search.lrs is not set")
    lrs: list[FiniteFloat] | None = Field(
        None, description="learning rates tried per cell; a cell's result is its best run (by validation accuracy)"
    )
    arch_lrs: dict[str, list[FiniteFloat]] = Field(
        default_factory=dict,
        description="architecture -> its own learning rates instead of sweep.search.lr / sweep.search.lrs",
    )
    predict: list[Literal["sizes", "seeds", "neighbours"]] = Field(
        default_factory=list,
        description="what the frontier search predicts a size's minimum width from, before training it "
        "(pipeline.search.frontier): sizes (the chain's earlier sizes, log-log), seeds (other seeds' answer at "
        "this size), neighbours (the other depths and architectures' answers at this size); empty: start from "
        "the last size's answer",
    )
    lr_search: Literal["all", "halving"] = Field(
        "all",
        description="all: every learning rate of a cell trains to its verdict; halving: they train to "
        "halving_rungs[0] steps, the best halving_keep of them go on to the next rung, and so on; the others are "
        "dropped (recorded as dropped, not unsolved)",
    )
    halving_rungs: list[PositiveInt] = Field(
        default_factory=list,
        description="successive halving: the steps at which a cell's learning rates are compared, increasing, "
        "each a multiple of sweep.evaluation.val_every_steps and below sweep.optim.max_steps",
    )
    halving_keep: float = Field(
        0.5, gt=0, lt=1, description="successive halving: the fraction of a rung's learning rates that go on"
    )
    halving_unguided: Literal["keep", "rank"] = Field(
        "keep",
        description="successive halving in a cell of a chain (task, architecture, depth) with no solved cell yet: "
        "keep: every learning rate goes on (an early leader may plateau while a later one jumps, and nothing tells "
        "them apart yet); rank: drop by rank as in the cells after",
    )

    @model_validator(mode="after")
    def one_lr_form(self) -> SearchSection:
        """One file gives sweep.search.lr or sweep.search.lrs, not both."""
        if {"lr", "lrs"} <= self.model_fields_set:
            raise ConfigError(
                "sweep.search.lr and sweep.search.lrs are both set in one file: give one learning rate as "
                "sweep.search.lr or a list as sweep.search.lrs (an override of either in params.yaml replaces the "
                "profile's)"
            )
        return self

    def learning_rates(self, arch: str | None = None) -> list[float]:
        if arch in self.arch_lrs:
            return list(self.arch_lrs[arch])
        return list(self.lrs) if self.lrs is not None else [self.lr]

    @model_validator(mode="after")
    def predict_fits(self) -> SearchSection:
        """The sources a width is predicted from: for the frontier search only, each once."""
        if self.predict and self.strategy != "frontier":
            raise ConfigError(
                f"sweep.search.predict: {self.predict} needs sweep.search.strategy: frontier (a grid trains every "
                "width)"
            )
        distinct("sweep.search.predict", self.predict)
        return self


class OptimSection(Section):
    """How a model trains: linear warm-up, then a constant rate (so that a budget extension continues the same
    schedule)."""

    optimizer: Literal["adamw", "adam"] = Field(
        "adamw",
        description="adamw: decoupled weight decay on matrices "
        "(the DP paper); adam: plain Adam, no decay (the separations paper)",
    )
    batch_size: PositiveInt = 512
    epochs: PositiveInt = 100
    max_steps: int = Field(-1, description="step budget; -1: run all epochs")
    weight_decay: float = Field(0.01, ge=0)
    warmup_fraction: float = Field(
        0.05, ge=0, le=1, description="linear warm-up over this fraction of the first step budget, then constant"
    )
    grad_clip: FiniteFloat | None = Field(1.0, gt=0, description="gradient-norm clip; null: none")
    precision: Precision = "32-true"

    @field_validator("max_steps")
    @classmethod
    def trains_something(cls, steps: int) -> int:
        """A step budget that trains: positive, or -1 for all epochs."""
        if steps == 0 or steps < -1:
            raise ConfigError(
                f"sweep.optim.max_steps: {steps} trains nothing; allowed: a positive step budget, or -1 for all epochs"
            )
        return steps


class VerdictSection(Section):
    """How a trial ends: solved, converged below the threshold (unsolved), diverged, or undecided when its budget,
    doubled while it still improves, runs out (pipeline.training.verdict)."""

    patience: PositiveInt = Field(
        2, description="consecutive validations at or above report.accuracy_threshold that make a trial solved"
    )
    convergence_window: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="the last fraction of the steps trained over which a trial must gain nothing (validation "
        "loss and accuracy) to have converged",
    )
    convergence_tolerance: float = Field(
        0.01, gt=0, lt=1, description="relative fall of the validation loss over the window that counts as a gain"
    )
    convergence_min_steps: PositiveInt = Field(
        1000, description="no trial is called converged (unsolved) before this many steps"
    )
    min_delta: float = Field(
        0.01, ge=0, lt=1, description="rise of the validation accuracy over the window that counts as a gain"
    )
    max_budget_factor: int = Field(
        8,
        ge=1,
        le=1024,
        description="a trial still improving at its budget (sweep.optim.max_steps / epochs) goes on with the "
        "budget doubled, up to this many times the first, before it is called undecided; 1: never extended",
    )
    stop_when_solved: bool = Field(
        True,
        description="false: every trial runs its whole budget (a fixed-budget "
        "grid); the verdict still says whether it was solved",
    )


class EvaluationSection(Section):
    """What a validation and the final test score."""

    val_samples: PositiveInt = Field(
        1024,
        description="samples of the validation file (drawn as the test set is) each validation scores: the "
        "file's first ones, at most generate.val_samples",
    )
    val_every_steps: PositiveInt | None = Field(None, description="validate every N steps; None = every epoch")
    eval_samples: PositiveInt | None = Field(None, description="test samples decoded greedily at the end; None = all")
    eval_batch_size: PositiveInt = 256


class ResourcesSection(Section):
    """What a trial takes from a Ray node and how it runs its steps there."""

    cpus_per_trial: PositiveInt = Field(1, le=1024)
    gpus_per_trial: float = Field(0, ge=0)
    workers_per_trial: PositiveInt = Field(
        1,
        description="data-parallel workers per trial on one node (DDP: gloo on "
        "CPU, nccl on GPU), each with cpus_per_trial CPUs, at the same global "
        "batch (sweep.optim.batch_size split across them); gpus_per_trial above 1 sets it",
    )
    memory_gb_per_trial: PositiveFloat | None = Field(
        None,
        description="memory one worker of a trial may fill (weights, optimiser state, activations): its batch is "
        "split into as many micro-batches as that needs; None: its share of its GPU, no limit on a CPU",
    )
    micro_batches: PositiveInt | None = Field(
        None, description="micro-batches per batch and worker (gradients accumulated); None: as the memory needs"
    )
    loader_workers: NonNegativeInt = Field(
        0,
        description="processes that build each worker's batches ahead of its steps (0: built in the step's own "
        "process); they use the trial's CPUs, so on a CPU trial they compete with its threads",
    )
    step: StepMode = Field(
        "eager",
        description="how a training step runs: eager (PyTorch's own, the fallback of the others); compiled "
        "(torch.compile of the model: fused kernels); graphed (on a GPU, CUDA graphs: a trial's forward under "
        "torch.compile's reduce-overhead mode, a fused trial's whole step, optimizer included, as one graph; each "
        "batch padded to the dataset's longest sequence so that every step has one shape; on a CPU it trains eager "
        "and says so). A narrow model's GPU step is bound by kernel "
        "launches, which graphs remove (pipeline.training.steps, docs/gpu.md)",
    )
    fuse: Literal["off", "learning_rates"] = Field(
        "off",
        description="learning_rates: a cell's learning rates train as one trial of K models with stacked weights, "
        "each with its own rate, optimizer state, verdict, MLflow run, checkpoint and reuse key, as its separate "
        "trial would have them (pipeline.training.fused_trial); an architecture PyTorch cannot batch (lstm) trains "
        "them as separate trials, and the sweep says so. off: a trial per learning rate. Off by default: on a CPU "
        "a fused step is slower than K separate ones (bench_fused); on a GPU, where a narrow step is bound by "
        "kernel launches, bench_pack measures what it gains (docs/gpu.md)",
    )
    max_concurrent_trials: PositiveInt | None = Field(
        None,
        description="trials at once; None: as many as the Ray nodes up at the start hold, each node by its "
        "scarcest resource. A local Ray takes it as a cap; a cluster as given, for nodes that join mid-sweep: on an "
        "autoscaling cluster, set it to the trials its node groups hold at their largest",
    )

    @field_validator("fuse", mode="before")
    @classmethod
    def fuse_off(cls, value: Any) -> Any:
        """YAML reads a bare ``off`` as false."""
        return "off" if value is False else value

    @model_validator(mode="after")
    def one_gpu_per_worker(self) -> ResourcesSection:
        """GPUs and data-parallel workers agree."""
        g, w = self.gpus_per_trial, self.workers_per_trial
        if g > 1 and g != int(g):
            raise ConfigError(
                f"sweep.resources.gpus_per_trial: {g} -- above 1 it counts whole GPUs (one data-parallel worker "
                "each); below 1 it is a share of one GPU"
            )
        if g > 1 and w not in (1, int(g)):
            raise ConfigError(
                f"sweep.resources.workers_per_trial: {w} with sweep.resources.gpus_per_trial {g:g}: each "
                f"data-parallel worker takes one GPU, so workers_per_trial is {int(g)} (or leave it at 1)"
            )
        if 0 < g < 1 and w > 1:
            raise ConfigError(
                f"sweep.resources.workers_per_trial: {w} with a share of one GPU (gpus_per_trial {g:g}): "
                "data-parallel workers need a GPU each"
            )
        return self

    def workers(self) -> int:
        """Data-parallel workers per trial: gpus_per_trial above 1 means one per GPU."""
        return int(self.gpus_per_trial) if self.gpus_per_trial > 1 else self.workers_per_trial

    def in_trial(self) -> TrialResources:
        """The trial's view: its threads, GPU and workers as it runs them, and the settings it reads as they are."""
        return TrialResources(
            threads=self.cpus_per_trial,
            use_gpu=self.gpus_per_trial > 0,
            gpu_share=min(1.0, self.gpus_per_trial) or 1.0,
            workers=self.workers(),
            **self.model_dump(include=set(TrialResources.model_fields) & set(ResourcesSection.model_fields)),
        )

    def trial_resources(self) -> dict[str, float]:
        """What one trial takes from one Ray node: every worker's CPUs and GPUs."""
        w = self.workers()
        return {
            "cpu": self.cpus_per_trial * w,
            "gpu": self.gpus_per_trial if self.gpus_per_trial > 1 else self.gpus_per_trial * w,
        }


def _resources(name: str) -> Any:
    """A field of ResourcesSection that a trial keeps as it is: its type's bounds, default and description."""
    return ResourcesSection.model_fields[name]


class TrialResources(Section):
    """A trial's resources as they are inside it (``ResourcesSection.in_trial``): what the sweep asks Ray for, in
    the terms a worker runs by."""

    threads: PositiveInt = Field(
        _resources("cpus_per_trial").default, description="CPU threads of each worker (sweep.resources.cpus_per_trial)"
    )
    use_gpu: bool = Field(False, description="each worker on a GPU (sweep.resources.gpus_per_trial above 0)")
    gpu_share: float = Field(1.0, gt=0, le=1, description="the share of one GPU each worker may fill")
    workers: PositiveInt = Field(1, description="data-parallel processes sharing each global batch")
    memory_gb_per_trial: PositiveFloat | None = _resources("memory_gb_per_trial")
    micro_batches: PositiveInt | None = _resources("micro_batches")
    loader_workers: NonNegativeInt = _resources("loader_workers")
    step: StepMode = _resources("step")


class RunsSection(Section):
    """Where the sweep records its runs, what it reuses and keeps of them, and what it prints."""

    experiment: NonBlank = "capacity-atlas"
    reuse: bool = Field(
        True,
        description="reuse runs this MLflow experiment already finished with the same data, "
        "training settings, training code and training libraries, instead of training them again "
        "($CAPACITY_ATLAS_RETRAIN=1 turns it off for one run: pipeline.nightly --force)",
    )
    max_failures: int = Field(
        2,
        ge=0,
        description="retries of a trial whose worker died or raised, in a row without progress: each retry "
        "continues from the trial's last checkpoint, and one that saved a newer checkpoint than it started from "
        "gets its retries back",
    )
    checkpoints_to_keep: PositiveInt = Field(
        2,
        description="a trial's newest checkpoints kept in "
        "cluster.storage_path (one per validation); older ones are deleted",
    )
    keep_checkpoints: bool = Field(
        False,
        description="keep a trial's checkpoints (weights and optimiser state) "
        "after it ends; by default they are deleted once its result is recorded",
    )
    console: Literal["progress", "table"] = Field(
        "progress",
        description="progress: one line that says how far the sweep is (pipeline.scheduling.console); "
        "table: that line and Ray Tune's table of trials every 30 s",
    )


class SweepConfig(Section):
    """The sweep stage, in sections by concern; the checks here are those that span sections."""

    grid: GridSection
    model: ModelSection = Field(default_factory=ModelSection)
    search: SearchSection = Field(default_factory=SearchSection)
    optim: OptimSection = Field(default_factory=OptimSection)
    verdict: VerdictSection = Field(default_factory=VerdictSection)
    evaluation: EvaluationSection = Field(default_factory=EvaluationSection)
    resources: ResourcesSection = Field(default_factory=ResourcesSection)
    runs: RunsSection = Field(default_factory=RunsSection)

    @model_validator(mode="before")
    @classmethod
    def no_flat_keys(cls, data: Any) -> Any:
        """A key of the sweep section before it was grouped names the section it moved to."""
        if not isinstance(data, dict):
            return data
        if "search" in data and not isinstance(data["search"], dict | SearchSection | None):
            raise ConfigError(f"sweep.search: {data['search']!r} moved to sweep.search.strategy")
        for key in data:
            if key in MOVED:
                raise ConfigError(f"sweep.{key} moved to sweep.{MOVED[key]}.{key}")
        for (section, key), to in MOVED_BETWEEN.items():
            if isinstance(data.get(section), dict) and key in data[section]:
                raise ConfigError(f"sweep.{section}.{key} moved to sweep.{to}.{key}")
        return data

    @model_validator(mode="after")
    def batch_splits(self) -> SweepConfig:
        """The batch splits over the data-parallel workers, and into the micro-batches."""
        batch, workers, micro = self.optim.batch_size, self.resources.workers(), self.resources.micro_batches
        if batch % workers != 0:
            raise ConfigError(
                f"sweep.optim.batch_size: {batch} does not split evenly over {workers} data-parallel workers"
            )
        if micro is not None and micro > batch // workers:
            raise ConfigError(
                f"sweep.resources.micro_batches: {micro} is more than the {batch // workers} samples of a worker's "
                "batch (sweep.optim.batch_size over its data-parallel workers)"
            )
        return self

    @model_validator(mode="after")
    def widths_fit(self) -> SweepConfig:
        """Every architecture's widths fit the heads and the search."""
        grid = self.grid
        for arch in dict.fromkeys([*grid.architectures, *grid.arch_widths]):
            key = f"sweep.grid.arch_widths.{arch}" if arch in grid.arch_widths else "sweep.grid.widths"
            check_widths(key, grid.widths_for(arch), self.model.heads, self.search.strategy)
        return self

    @model_validator(mode="after")
    def learning_rates_valid(self) -> SweepConfig:
        """Every architecture has learning rates, positive and distinct."""
        for arch in dict.fromkeys([*self.grid.architectures, *self.search.arch_lrs]):
            key = f"sweep.search.arch_lrs.{arch}" if arch in self.search.arch_lrs else "sweep.search.lrs"
            lrs = self.search.learning_rates(arch)
            if not lrs:
                raise ConfigError(f"{key} is empty: every cell needs at least one learning rate")
            if any(lr <= 0 for lr in lrs) or len(set(lrs)) != len(lrs):
                raise ConfigError(f"{key}: {lrs} must be positive and distinct")
        return self

    @model_validator(mode="after")
    def validates_within_budget(self) -> SweepConfig:
        """A trial validates before its step budget runs out."""
        every, budget = self.evaluation.val_every_steps, self.optim.max_steps
        if every is not None and budget > 0 and every > budget:
            raise ConfigError(
                f"sweep.evaluation.val_every_steps: {every} is more than sweep.optim.max_steps = {budget}: a trial "
                f"would never validate (no early stop, no checkpoint); allowed: 1 to {budget}, or null for every "
                "epoch"
            )
        return self

    @model_validator(mode="after")
    def halving_fits(self) -> SweepConfig:
        """Successive halving's rungs fit the validations and the step budget."""
        search = self.search
        if search.lr_search == "all":  # the rungs are left unused: one profile compares both with `-S ...lr_search=`
            return self
        rungs, every, budget = search.halving_rungs, self.evaluation.val_every_steps, self.optim.max_steps
        if not rungs:
            raise ConfigError(
                "sweep.search.halving_rungs is empty: sweep.search.lr_search: halving needs the steps to compare at"
            )
        if any(b <= a for a, b in zip(rungs, rungs[1:])):
            raise ConfigError(f"sweep.search.halving_rungs: {rungs} must increase")
        if every is None:
            raise ConfigError(
                "sweep.search.lr_search: halving compares at validations: set sweep.evaluation.val_every_steps"
            )
        if any(r % every for r in rungs):
            raise ConfigError(
                f"sweep.search.halving_rungs: {rungs} must be multiples of sweep.evaluation.val_every_steps = {every}"
            )
        if budget <= 0 or rungs[-1] >= budget:
            raise ConfigError(
                f"sweep.search.halving_rungs: {rungs} must end below the first step budget sweep.optim.max_steps = "
                f"{budget} (a rung at or past it compares finished runs)"
            )
        if self.verdict.stop_when_solved is False:
            raise ConfigError(
                "sweep.search.lr_search: halving stops runs early: it needs sweep.verdict.stop_when_solved: true"
            )
        return self

    @model_validator(mode="after")
    def fusion_fits(self) -> SweepConfig:
        """Fused members train in one process, each stepping on its own."""
        fuse = self.resources.fuse
        if fuse == "off":
            return self
        if self.resources.workers() > 1:
            raise ConfigError(
                f"sweep.resources.fuse: {fuse} trains a cell's learning rates in one process; with "
                f"{self.resources.workers()} data-parallel workers per trial (sweep.resources.workers_per_trial, "
                "gpus_per_trial) set sweep.resources.fuse: off"
            )
        if self.optim.precision == "16-mixed":
            raise ConfigError(
                f"sweep.resources.fuse: {fuse} with sweep.optim.precision: 16-mixed: the gradient scaler skips a "
                "step for every member when one member's gradients overflow; use bf16-mixed (or "
                "sweep.resources.fuse: off)"
            )
        return self

    @model_validator(mode="after")
    def precision_fits_device(self) -> SweepConfig:
        """16-mixed precision only on GPUs."""
        if self.resources.gpus_per_trial == 0 and self.optim.precision == "16-mixed":
            raise ConfigError("sweep.optim.precision: '16-mixed' needs GPUs; allowed on CPU: 32-true, bf16-mixed")
        return self


# keys that moved from one section to another -> their section now: a trial's sections hold only what a trial reads
MOVED_BETWEEN = {
    ("optim", "lr"): "search",
    ("optim", "lrs"): "search",
    ("optim", "arch_lrs"): "search",
    ("model", "arch_options"): "grid",
}

# every key of the sweep section before it was grouped -> the section it now lives in (sweep.search: <strategy>
# aside, whose name is now its section's)
MOVED = {
    key: section
    for section, field in SweepConfig.model_fields.items()
    for key in cast(type[Section], field.annotation).model_fields
}


class ReportConfig(Section):
    accuracy_threshold: float = Field(
        0.9,
        gt=0,
        lt=1,
        description="test accuracy at or above which a cell "
        "passes; a trial stops once validation reaches it (sweep.verdict.patience)",
    )


class NightlyConfig(Section):
    """`python -m pipeline.nightly`: what counts as a regression against the previous night's run of a cell."""

    history: NonBlank = Field("nightly", description="directory (relative to the repo) of the nights' snapshots")
    accuracy_drop: float = Field(
        0.05,
        ge=0,
        le=1,
        description="a cell's test accuracy falling by more than this is a regression (rising by more: an improvement)",
    )
    throughput_drop: float = Field(
        0.3,
        ge=0,
        le=1,
        description="training throughput (PFLOP/s) falling by more "
        "than this fraction is a regression (a shared CPU is noisy: keep it loose)",
    )


class ClusterConfig(Section):
    ray_address: NonBlank | None = Field(
        None, description="Ray head to join; None: $RAY_ADDRESS, else a local ray.init"
    )
    mlflow_tracking_uri: NonBlank | None = Field(
        None, description="None: $MLFLOW_TRACKING_URI, else SQLite in the project"
    )
    storage_path: NonBlank | None = Field(
        None,
        description="where trials keep checkpoints and read their datasets: a "
        "path every Ray node sees, or a URI pyarrow understands (s3://, gs://); None: "
        "$CAPACITY_ATLAS_STORAGE, else ray_results/ in the project (one machine)",
    )
    mlflow_ui_url: NonBlank | None = Field(
        None,
        description="where a reader's browser opens the MLflow UI (a public address, a port-forward): the links the "
        "sweep prints and the report shows use it; None: $CAPACITY_ATLAS_MLFLOW_UI, else the tracking URI (an "
        "in-cluster address no browser outside opens)",
    )
    node_wait_s: PositiveFloat = Field(
        300,
        description="seconds a sweep on a cluster waits for a Ray node that can hold a trial: before the first "
        "trial (nodes still joining, or an autoscaler's group scaling up, asked for one), and once lost nodes left "
        "none, before it stops with an error naming them (a local Ray stops at once)",
    )

    heartbeat_s: PositiveFloat = Field(
        30,
        description="seconds between a sweep's heartbeats (a tag of its MLflow parent run): a sweep on any host "
        "takes one that missed 3 of its beats for dead, closes its runs and continues its trials",
    )
    stop_timeout_s: PositiveFloat = Field(
        30,
        description="seconds a sweep asked to stop (SIGTERM, SIGINT) takes at most to close its MLflow runs and "
        "leave Ray; as long again, and the process ends as it is",
    )

    def ray(self) -> str | None:
        return self.ray_address or os.environ.get("RAY_ADDRESS") or None

    def storage(self) -> str:
        return self.storage_path or os.environ.get("CAPACITY_ATLAS_STORAGE") or str(PROJECT / "ray_results")

    def mlflow(self) -> str:
        return self.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{PROJECT / 'mlflow.db'}"

    def mlflow_ui(self) -> str:
        """Where a browser opens the MLflow UI: the public address if one is set, else the tracking URI."""
        return self.mlflow_ui_url or os.environ.get("CAPACITY_ATLAS_MLFLOW_UI") or self.mlflow()


class DecidesConfig(Section):
    """A profile made to decide one claim whole (``cpu-claims``): the claim, the task and model it names (a test holds
    them to the claim's own, ``pipeline.reporting.claims``), and the wall time the profile states it finishes in. A
    grid that runs a length of the task that is not the paper's, misses one, or runs the claim's model at another
    width is refused when the settings load; a budget the forecast says will not finish in ``hours`` is refused by
    the sweep stage before training (``pipeline.costs.prediction.check_decides``). ``decides: null`` in a params file
    runs the profile's recipe for something else (a control at one length) without it."""

    claim: str = Field(description="the claim's id (report.json's claims.<id>)")
    task: str
    arch: str
    depth: PositiveInt
    width: PositiveInt
    hours: float = Field(gt=0, description="the wall time the whole grid, every budget extended, must fit")


class Config(Section):
    profile: str
    tasks: list[str] = Field(description="tasks with a generate stage in dvc.yaml's matrix")
    generate: GenerateConfig
    sweep: SweepConfig
    report: ReportConfig = ReportConfig()
    nightly: NightlyConfig = NightlyConfig()
    cluster: ClusterConfig = ClusterConfig()
    decides: DecidesConfig | None = Field(None, description="the one claim this profile is made to decide whole")

    @field_validator("tasks")
    @classmethod
    def registered_tasks(cls, names: list[str]) -> list[str]:
        """Every task is registered, and named once."""
        for name in names:
            if name not in tasks.TASKS:
                raise one_of("tasks", name, tasks.TASKS)
        distinct("tasks", names)
        return names

    @model_validator(mode="after")
    def check_across_sections(self) -> Config:
        """What spans sections: each task a section names is in tasks, at sizes it allows; the grid is not empty;
        each validation file holds the samples a validation scores."""
        # each section checks its own keys; the sweep stage checks the architectures against the model registry
        # (search/cells.check_architectures): the other stages never import torch or the models
        self.check_generated()
        for task, sizes in (self.sweep.grid.datasets or {}).items():
            for size in sizes:
                if size not in self.generate.datasets.get(task, []):
                    raise one_of(
                        f"sweep.grid.datasets.{task}",
                        size,
                        [f"{t}={s}" for t, ss in self.generate.datasets.items() for s in ss],
                    )
        for task, _ in self.sweep_datasets():
            # a validation scores the file's first sweep.evaluation.val_samples: fewer would quietly judge on fewer
            # samples than the profile says
            have = self.generate.for_task(task).val_samples
            if self.sweep.evaluation.val_samples > have:
                raise ConfigError(
                    f"sweep.evaluation.val_samples: {self.sweep.evaluation.val_samples} is more than the {have} "
                    f"validation samples generate.val_samples makes for {task}: raise generate.val_samples (or its "
                    "per_task entry) or lower sweep.evaluation.val_samples"
                )
        for task in self.sweep.grid.task_architectures:
            if task not in self.tasks:
                raise one_of("sweep.grid.task_architectures", task, self.tasks)
        if not self.sweep_datasets():
            raise ConfigError(
                "generate.datasets / sweep.grid.datasets name no (task, size): the grid would have no trials"
            )
        # an exclusion names registered tasks (architectures: search/cells.check_architectures); it may match nothing
        # once an override narrows the grid
        for i, pattern in enumerate(self.sweep.grid.exclude):
            for task in pattern.tasks or ():
                if task not in self.tasks:
                    raise one_of(f"sweep.grid.exclude[{i}].tasks", task, self.tasks)
        if not self.sweep.grid.cells(self.sweep_datasets()):
            raise ConfigError("sweep.grid.exclude leaves no cell of the grid: nothing would train")
        return self

    def check_generated(self) -> None:
        """Each dataset's task is in tasks and allows its size (and, unique, that many distinct samples); each task
        that generate's settings name is in tasks."""
        for task, sizes in self.generate.datasets.items():
            if task not in self.tasks:
                raise one_of("generate.datasets", task, self.tasks)
            gen = self.generate.for_task(task)
            for size in sizes:
                try:
                    built = tasks.get_task(task, size, **gen.task_params.get(task, {}))
                    if gen.unique:
                        built.check_space(gen.test_samples, gen.train_samples, gen.val_samples)
                except tasks.TaskError as err:
                    raise ConfigError(f"generate.datasets.{task}: {err}") from None
        # settings keyed by task or architecture need only name a registered one: an override that narrows what to
        # run (generate.datasets, sweep.grid.datasets, sweep.grid.architectures) leaves the profile's settings of the
        # rest unused
        for key in ("task_params", "per_task"):
            for task in getattr(self.generate, key):
                if task not in self.tasks:
                    raise one_of(f"generate.{key}", task, self.tasks)

    @model_validator(mode="after")
    def decides_whole(self) -> Config:
        """A profile that decides a claim whole runs its task at every length of the paper's and no other, and its
        model at the claim's width only."""
        d = self.decides
        if d is None:
            return self
        if d.task not in self.tasks:
            raise one_of("decides.task", d.task, self.tasks)
        paper = tasks.TASKS[d.task].paper_sizes
        sizes = sorted(s for t, s in self.sweep_datasets() if t == d.task)
        strays, missing = [s for s in sizes if s not in paper], [s for s in paper if s not in sizes]
        if strays or missing:
            raise ConfigError(
                f"decides: {d.claim} is made at {d.task} sizes {list(paper)}, the paper's; the grid runs {sizes}"
                + (f": {strays} not the paper's" if strays else "")
                + (f": {missing} missing, so it cannot be decided whole" if missing else "")
                + " (generate.datasets, sweep.grid.datasets)"
            )
        cells = [c for c in self.sweep.grid.cells(self.sweep_datasets()) if c[0] == d.task and c[2] == d.arch]
        widths = sorted({w for _, _, _, w, depth in cells if depth == d.depth})
        if widths != [d.width]:
            raise ConfigError(
                f"decides: {d.claim}'s model is a {d.depth}-layer {d.arch} of width {d.width}; the grid runs it on "
                f"{d.task} at widths {widths or 'none'} (sweep.grid.widths, arch_widths, arch_depths): another width "
                "is another model"
            )
        return self

    def sweep_datasets(self) -> list[tuple[str, int]]:
        chosen = self.sweep.grid.datasets if self.sweep.grid.datasets is not None else self.generate.datasets
        return [(task, size) for task, sizes in chosen.items() for size in sizes]


SECTIONS = [
    name
    for name, field in Config.model_fields.items()
    if isinstance(field.annotation, type) and issubclass(field.annotation, Section)
]
# Keys that are two spellings of one setting: a layer that sets one replaces the other from the layers below.
ALTERNATIVES = {"sweep.search": [("lr", "lrs")]}
# Mappings that say *what* to run are replaced whole by an override (params.yaml's
# `generate.datasets: {index_lookup: [20, 50]}` narrows a profile to that); every other mapping (task_params,
# per_task, arch_options, arch_depths, arch_widths, the sections) merges key by key.
REPLACED = {"generate.datasets", "sweep.grid.datasets"}


def merge(base: dict, over: dict, path: str = "") -> dict:
    """Deep merge: ``over`` wins; nested dicts merge key by key, except the ``REPLACED`` ones."""
    out = dict(base)
    for key, value in (over or {}).items():
        where = f"{path}.{key}" if path else key
        nested = isinstance(value, dict) and isinstance(out.get(key), dict) and where not in REPLACED
        out[key] = merge(out[key], value, where) if nested else value
    return out


def at(data: dict, path: str) -> dict:
    """The mapping at the dotted ``path`` of ``data``; an empty one where a level is missing or not a mapping."""
    found: Any = data
    for key in path.split("."):
        found = found.get(key) if isinstance(found, dict) else None
    return found if isinstance(found, dict) else {}


def read_yaml(path: Path) -> dict:
    if not path.exists():
        raise ConfigError(f"{path} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"{path}: not valid YAML{where}: {getattr(err, 'problem', None) or err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of sections, not {type(data).__name__}")
    for section in SECTIONS:
        if data.get(section) is not None and not isinstance(data[section], dict):
            raise ConfigError(
                f"{path}: {section}: {data[section]!r} is not allowed; allowed: a mapping of {section} keys (or null)"
            )
    return data


def profiles() -> list[str]:
    return sorted(p.stem for p in CONF_DIR.glob("*.yaml"))


def load_config(params_path: Path | str = ROOT / "params.yaml", profile: str | None = None) -> Config:
    """The effective, validated config. ``profile`` overrides ``params.yaml``'s choice (used by tests). The
    architecture names and options are checked against the model registry by the sweep stage, which imports it
    (``pipeline.search.cells``): the other stages never load torch or the models."""
    params = read_yaml(Path(params_path))
    name = profile or params.get("profile")
    if name not in profiles():
        raise one_of("profile", name, profiles())
    profile_data = read_yaml(CONF_DIR / f"{name}.yaml")
    for section, pairs in ALTERNATIVES.items():
        over, under = at(params, section), at(profile_data, section)
        for a, b in pairs:
            for mine, other in ((a, b), (b, a)):
                if mine in over:
                    under.pop(other, None)
    data = merge(profile_data, {k: v for k, v in params.items() if v is not None})
    if "decides" in params and params["decides"] is None:  # the profile's grid, run for something else (a control)
        data.pop("decides", None)
    data["profile"] = name
    try:
        return Config.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"profile {name!r} with {params_path}: {'; '.join(map(problem, err.errors()))}") from None


def problem(error: ErrorDetails) -> str:
    """One validation error as ``key: what is wrong (got value)``."""
    if error["type"] == "value_error":  # a check of this module or the model registry: its message names the key
        return str(error["ctx"]["error"])
    got = "" if error["type"] == "missing" else f" (got {error['input']!r})"
    return f"{'.'.join(map(str, error['loc'])) or 'config'}: {error['msg']}{got}"
