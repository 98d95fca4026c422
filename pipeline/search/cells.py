"""The cells of a sweep's grid: their ids, what makes a finished run reusable, and what each costs.

A cell is (task, size, architecture, width, depth, seed) on one dataset; ``build_cells`` opens and hashes every
dataset first, so a missing or corrupt file is named before anything starts; ``defined_cells`` is the same grid
from the tasks' definitions, for a forecast before any data exists. Every cell's model sizes and FLOPs are known
without training (``model_costs``), so cells the frontier search infers have them too.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

import models
import tasks
from pipeline.common.cell import DATA_FILES, Cell, CellSpec, cell_id
from pipeline.common.config import Config, ConfigError, OptimSection, one_of
from pipeline.common.provenance import code_hash, library_versions
from pipeline.data.datasets import DatasetError, dataset_path, file_hash, read_metadata

TRAINABLE = "pipeline.scheduling.trainable"  # the module a trial runs: its imports are the training code


def check_architectures(cfg: Config) -> None:
    """Architecture names and options exist in the model registry (``load_config`` checks everything else): the
    sweep stage checks them before any compute; the stages that never build a model do not import the registry."""
    for arch in cfg.sweep.grid.architectures:
        if arch not in models.ARCHITECTURES:
            raise one_of("sweep.grid.architectures", arch, models.ARCHITECTURES)
    for key in ("grid.arch_depths", "grid.arch_widths", "search.arch_lrs", "grid.arch_options"):
        section, name = key.split(".")
        for arch in getattr(getattr(cfg.sweep, section), name):
            if arch not in models.ARCHITECTURES:
                raise one_of(f"sweep.{key}", arch, models.ARCHITECTURES)
    for i, pattern in enumerate(cfg.sweep.grid.exclude):
        for arch in pattern.architectures or ():
            if arch not in models.ARCHITECTURES:
                raise one_of(f"sweep.grid.exclude[{i}].architectures", arch, models.ARCHITECTURES)
    for arch, options in cfg.sweep.grid.arch_options.items():
        try:
            models.ARCHITECTURES[arch].check_options(options, key=f"sweep.grid.arch_options.{arch}")
        except models.ArchitectureError as err:
            raise ConfigError(str(err)) from None


def check_precision(archs: list[str], precision: str, key: str = "sweep.optim.precision") -> None:
    """bf16-mixed trials on this machine's CPU: every architecture in ``archs`` must train in bf16 here
    (``models.bf16_on_cpu``); one that cannot is named, with the CPU's instruction set, before any compute."""
    if precision != "bf16-mixed":
        return
    problems = [problem for arch in archs if (problem := models.bf16_on_cpu(arch))]
    if problems:
        raise ConfigError(
            f"{key}: bf16-mixed: {'; '.join(problems)}. Train in 32-true ({key}), on GPUs "
            "(sweep.resources.gpus_per_trial), or without it (sweep.grid.architectures)"
        )


def run_key(train: dict) -> str:
    """What, beyond the cell and learning rate, decides a trial's result: the training settings, the code that
    trains (every project module the trainable imports) and the installed versions of the libraries it trains with
    (``library_versions``: a bump of torch, Lightning, Ray, NumPy, Numba or Triton retrains). A finished run with the
    same trial key and run key is reused instead of trained (``sweep.runs.reuse``)."""
    h = hashlib.sha256(json.dumps(train, sort_keys=True).encode())
    h.update(code_hash(TRAINABLE).encode())
    h.update(json.dumps(library_versions(), sort_keys=True).encode())
    return h.hexdigest()[:16]


def build_cells(cfg: Config, data_dir: Path) -> dict[Cell, CellSpec]:
    """Every cell of the grid, with its dataset checked and hashed (raises DatasetError first)."""
    datasets = {}
    for task, size in cfg.sweep_datasets():
        paths = {key: dataset_path(data_dir, task, size, key.removesuffix("_path")) for key in DATA_FILES}
        meta = [read_metadata(path) for path in paths.values()]  # train's first
        held = meta[DATA_FILES.index("val_path")]["stats"]["samples"]
        if held < cfg.sweep.evaluation.val_samples:  # a file from another config: judged on fewer samples than asked
            raise DatasetError(
                f"{paths['val_path']} holds {held} validation samples, but sweep.evaluation.val_samples scores "
                f"{cfg.sweep.evaluation.val_samples}: regenerate it (`dvc repro generate`) with generate.val_samples "
                "at least that"
            )
        sha = {key: file_hash(path) for key, path in paths.items()}  # the files' bytes, read once
        datasets[task, size] = {
            **{key: str(path) for key, path in paths.items()},
            "vocab_size": len(meta[0]["vocab"]),
            "family": meta[0]["family"],
            "vocab": tuple(meta[0]["vocab"]),
            "train_samples": meta[0]["stats"]["samples"],
            "max_len": max(m["stats"]["max_length"] for m in meta),
            "sha256": sha,
            # train's, test's and validation's hashes: a cell's id and reuse key change only when its data does
            "data_hash": hashlib.sha256("".join(sha.values()).encode()).hexdigest()[:16],
        }
    return grid_cells(cfg, datasets)


def defined_cells(cfg: Config) -> dict[Cell, CellSpec]:
    """Every cell of the grid as its task defines its dataset, before any file exists (``pipeline.forecast``
    forecasts a profile whose data is not generated): its vocabulary, family and sample count, and as L the task's
    longest sequence, which is the files' L for every task but arithmetic (a bound there). No paths or hashes."""
    datasets = {}
    for task, size in cfg.sweep_datasets():
        gen = cfg.generate.for_task(task)
        built = tasks.get_task(task, size, **gen.task_params.get(task, {}))
        datasets[task, size] = {
            "train_path": "",
            "test_path": "",
            "val_path": "",
            "vocab_size": built.vocab_size,
            "family": built.family,
            "vocab": tuple(built.tokens),
            "train_samples": gen.train_samples,
            "max_len": built.max_length(),
            "sha256": {},
            "data_hash": "",
        }
    return grid_cells(cfg, datasets)


def grid_cells(cfg: Config, datasets: dict[tuple[str, int], dict[str, Any]]) -> dict[Cell, CellSpec]:
    """The grid over ``datasets`` ((task, size) -> its dataset's fields of ``CellSpec``): every architecture, width,
    depth and seed the profile trains on each, but the cells ``sweep.grid.exclude`` leaves out."""
    s = cfg.sweep
    cells = {}
    for task, size, arch, width, depth in s.grid.cells(list(datasets)):
        data = datasets[task, size]
        for seed in s.grid.seeds:
            at = Cell(task, size, arch, width, depth, seed)
            cells[at] = CellSpec(
                cell=at,
                arch_options=s.grid.arch_options.get(arch, {}),
                lrs=tuple(s.search.learning_rates(arch)),
                cell_id=cell_id(*at, data_hash=data["data_hash"]),
                name=f"{task}{size}-{arch}-w{width}-d{depth}-s{seed}",
                **data,
            )
    return cells


def shape_model(cell: CellSpec, heads: int) -> models.LanguageModel:
    """The cell's model as a shape-only copy on the meta device: its sizes and costs without weights."""
    with torch.device("meta"):
        return models.build_model(
            cell.arch,
            vocab_size=cell.vocab_size,
            width=cell.width,
            depth=cell.depth,
            heads=heads,
            max_len=cell.max_len,
            **cell.arch_options,
        )


def unfusable(cells: dict[Cell, CellSpec], heads: int) -> dict[str, str]:
    """architecture -> why its learning rates cannot train as one fused model (``LanguageModel.unbatched``: PyTorch
    has no batching rule for it), for the architectures of ``cells`` that cannot (``sweep.resources.fuse``)."""
    first = {cell.arch: spec for cell, spec in cells.items()}
    why = {arch: shape_model(spec, heads).unbatched for arch, spec in first.items()}
    return {arch: reason for arch, reason in why.items() if reason is not None}


def model_costs(cell: CellSpec, heads: int) -> dict[str, Any]:
    """A cell's model sizes and FLOPs, known without training (a shape-only copy on the meta device): every
    cell has them, trained or inferred."""
    model = shape_model(cell, heads)
    L = cell.max_len
    return {
        "params": model.num_params(),
        "paper_gflops": model.paper_flops(L) / 1e9,
        "exact_gflops": model.exact_flops(L) / 1e9,
        "state_bytes": model.state_size(L),
    }


def budget_steps(cell: CellSpec, optim: OptimSection) -> int:
    """A trial's first step budget: ``max_steps``, or ``epochs`` passes over its training samples."""
    return optim.max_steps if optim.max_steps > 0 else optim.epochs * -(-cell.train_samples // optim.batch_size)


def expected_cost(cell: CellSpec, optim: OptimSection) -> float:
    """Training GFLOPs if the trial runs its whole first budget: 3 x exact forward FLOPs at L x sequences."""
    assert cell.exact_gflops is not None, "model_costs first"
    return 3 * cell.exact_gflops * budget_steps(cell, optim) * optim.batch_size
