"""The forecast of a profile (``python -m pipeline.forecast``): the grid's trials and their training FLOPs at the first
and the extended step budget (3 x the model's exact forward FLOPs at the task's L x sequences, on shape-only
models), their time at a measured ``Throughput``, handed to the cluster's slots in the sweep's order
(``list_schedule``). What a search trains (frontier, predicted widths, halving) is not known before its trials end:
``REPLAYED`` models it by the savings the replay of each strategy measured on synthetic grids of the ``paper`` and
``separations`` shapes, and the forecast says so."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import NamedTuple

from pipeline.common.cell import Cell, CellSpec
from pipeline.common.config import Config, ConfigError, ResourcesSection, SweepConfig
from pipeline.costs.rates import ALONE, ForecastError, Mode, Throughput
from pipeline.costs.schedule import Trial, list_schedule
from pipeline.search.cells import budget_steps, defined_cells, expected_cost, model_costs, unfusable

# grid-over-strategy training FLOPs of each strategy replayed through the sweep's own searcher on a synthetic grid
# of the profile's shape (the papers' reported frontiers, made-up curves, exact FLOPs of the real models), one value
# per draw of that grid: draw 0 is docs/benchmarks/bench_frontier.json's sections "replay paper" and "replay
# separations" (tests.test_forecast holds them equal), draws 1 and 2 (--seed 1, --seed 2) are in docs/benchmarks.md.
# On `paper` (one learning rate) halving changes nothing.
REPLAY_COMMAND = "python -m benchmarks.bench_frontier --synthetic {profile} --slots 64"
REPLAYED: dict[str, dict[str, tuple[float, ...]]] = {
    "paper": {
        "frontier": (4.82,),
        "frontier+predict": (4.22,),
        "frontier+halving": (4.82,),
        "frontier+predict+halving": (4.22,),
    },
    "separations": {
        "frontier": (3.88,),
        "frontier+predict": (3.91,),
        "frontier+halving": (10.21, 10.16, 9.82),
        "frontier+predict+halving": (10.32, 10.14, 9.86),
    },
}
REPLAYED_CELLS = {"paper": 576, "separations": 2392}  # the replayed grids' cells: another count is another shape


def strategy(s: SweepConfig) -> str:
    """The search as the replay benchmark names it: grid or frontier, with predicted widths and halving."""
    return (
        s.search.strategy
        + ("+predict" if s.search.predict else "")
        + ("+halving" if s.search.lr_search == "halving" else "")
    )


@dataclass(frozen=True)
class Cluster:
    """The cluster a profile is planned for: ``nodes`` alike, each with ``gpus`` GPUs of kind ``gpu`` (None: not
    said) and ``cpus`` CPUs (None: not limiting)."""

    nodes: int
    gpus: int
    gpu: str | None
    cpus: int | None

    def slots(self, resources: ResourcesSection) -> int:
        """Trials at once: what a node holds of the trial's GPUs (on a GPU profile) and CPUs, times the nodes,
        at most ``sweep.resources.max_concurrent_trials``."""
        need = resources.trial_resources()
        if not need["gpu"] and self.cpus is None:
            raise ForecastError("a CPU profile's slots are CPUs: give the CPUs a node has (--cpus-per-node)")
        limits = [math.floor(self.gpus / need["gpu"])] if need["gpu"] else []
        if self.cpus is not None:
            limits.append(math.floor(self.cpus / need["cpu"]))
        per_node = min(limits)
        if per_node < 1:
            raise ForecastError(
                f"a trial needs {need['gpu']:g} GPU(s) and {need['cpu']:g} CPU(s) (sweep.resources.gpus_per_trial, "
                f"cpus_per_trial, workers_per_trial): a node of {self.gpus} GPUs (--gpus-per-node) and "
                f"{self.cpus} CPUs (--cpus-per-node) holds none"
            )
        return min(self.nodes * per_node, resources.max_concurrent_trials or 1 << 30)


@dataclass(frozen=True)
class Row:
    """What a set of trials costs: training FLOPs, device-hours (GPU-hours on a GPU profile, CPU core-hours on a CPU
    one) and hours of wall time on the cluster's slots."""

    pflops: float
    device_hours: float
    wall_hours: float

    def times(self, factor: float) -> Row:
        return Row(self.pflops * factor, self.device_hours * factor, self.wall_hours * factor)


@dataclass(frozen=True)
class SearchForecast:
    """A search strategy's training, modelled: the grid's over ``ratios``, its replayed savings (one per draw). Its
    wall time is perfect packing of its device-hours on the slots, a lower bound."""

    strategy: str
    ratios: tuple[float, ...]
    first: Row  # the grid at its first budget over the best ratio
    extended: Row  # the grid at its extended budget over the worst ratio


@dataclass(frozen=True)
class Priced:
    """The grid's first budget trained one way (``mode``): its cost, and how its trials' rates were had."""

    mode: Mode
    slots: int
    per_slot: float  # devices a slot holds: a share of a GPU, the GPUs of a data-parallel trial, a trial's CPUs
    row: Row
    sources: dict[str, int]  # how a trial's rate was had (rates.SOURCES) -> trials
    alone: list[str]  # architectures the mode has no rate for: their trials priced alone, sharing their slot
    validating: float  # the share of the trials' seconds spent validating
    unvalidated: int  # trials whose validations were not priced (none measured for their architecture)


@dataclass(frozen=True)
class Forecast:
    """Everything the plan prints, in one record: the grid, the budget, the slots, the costs."""

    profile: str
    cells: int
    trials: int
    lrs: dict[str, list[float]]  # arch -> its learning rates
    steps: list[int]  # the first step budgets, distinct (one per training-set size when budgeted in epochs)
    factor: int  # the extended budget over the first (1 when trials are never extended)
    slots: int
    unit: str  # "GPU" or "CPU core": what a device-hour counts
    per_trial: float  # devices one trial trains on
    configured: Priced  # the profile's own way: sweep.resources.gpus_per_trial's packing, sweep.resources.step
    modes: list[Priced]  # on a GPU profile, every way the throughput measured, the configured one included
    grid: Row  # every trial at its first budget (the configured way), its wall a list schedule in the sweep's order
    extended: Row  # every trial at its extended budget: the most the grid trains
    search: str  # the configured strategy
    searches: list[SearchForecast]  # the strategies replayed on this profile's shape
    shape_differs: bool  # the grid is not the shape the replay was measured on


def configured_mode(s: SweepConfig) -> Mode:
    """How the profile trains: 1 / sweep.resources.gpus_per_trial processes a GPU (below 1), each step
    sweep.resources.step, and with sweep.resources.fuse a cell's learning rates fused in one step (as many as an
    architecture's most: a cell with fewer trains a smaller fused trial, charged at this rate)."""
    share = s.resources.gpus_per_trial
    fused = 1
    if s.resources.fuse == "learning_rates":
        fused = max(len(s.search.learning_rates(arch)) for arch in s.grid.architectures)
    return Mode(models=fused, processes=round(1 / share) if 0 < share < 1 else 1, step=s.resources.step)


def priced(
    s: SweepConfig,
    cells: dict[Cell, CellSpec],
    throughput: Throughput,
    mode: Mode,
    slots: int,
    per_slot: float,
    speed: float,
) -> Priced:
    """The grid's first budget trained under ``mode`` on ``slots`` slots of ``per_slot`` devices each (a share of a
    GPU, a data-parallel trial's GPUs, a CPU trial's cores), each trial ``speed`` times as fast as one alone (a share
    of a GPU; a trial on k workers is taken to train k times as fast as on one). An architecture ``mode`` has a rate
    for trains ``mode.models`` of a cell's learning rates in one job at that rate (the sharing of its GPU measured
    in it); any other trains alone at its rate alone times ``speed``: a share of a GPU no faster in all than one
    trial alone. So does one the sweep cannot fuse (``unfusable``), whatever a fused step of it measured. Each job
    also validates ``validations`` times, each of ``sweep.evaluation.val_samples`` sequences, at the cost its
    architecture's validation measured (``Throughput.validation_seconds``)."""
    cannot = unfusable(cells, s.model.heads) if mode.models > 1 else {}
    jobs: list[Trial] = []
    sources: dict[str, int] = {}
    alone: list[str] = []
    validating = unvalidated = 0.0
    for cell in cells.values():
        gflops = expected_cost(cell, s.optim)  # a trial run to its first budget, the order the searcher starts it in
        job, lrs = job_price(s, cell, throughput, mode, speed, cannot, budget_steps(cell, s.optim)), len(cell.lrs)
        if job.mode != mode and cell.arch not in alone:
            alone.append(cell.arch)
        sources[job.source] = sources.get(job.source, 0) + lrs
        unvalidated += lrs * (job.validation is None)
        for first in range(0, lrs, job.mode.models):  # a cell's learning rates, ``job.mode.models`` a job
            k = min(job.mode.models, lrs - first)
            jobs.append(Trial(gflops * k, job.seconds, gflops * k / 1e6))
            validating += job.validation or 0.0
    schedule = list_schedule(jobs, slots)
    row = Row(schedule.pflops, schedule.busy * per_slot / 3600, schedule.wall / 3600)
    share = validating / sum(job.seconds for job in jobs) if jobs else 0.0
    return Priced(mode, slots, per_slot, row, sources, alone, share, int(unvalidated))


class JobPrice(NamedTuple):
    """What one job of a cell (``mode.models`` of its learning rates, fused; one trial where it trains alone)
    costs: ``seconds`` in all, ``validation`` of them validating (None: unpriced, none measured), its rate's
    ``source`` (rates.SOURCES), and the ``mode`` it is priced in."""

    seconds: float
    validation: float | None
    source: str
    mode: Mode


def job_price(
    s: SweepConfig, cell: CellSpec, throughput: Throughput, mode: Mode, speed: float, cannot: dict, steps: int
) -> JobPrice:
    """A job of ``cell`` trained ``steps`` steps under ``mode`` (``priced``'s rules: alone where ``mode`` has no
    rate for its architecture or the sweep ``cannot`` fuse it), validating as the sweep's evaluation says."""
    flops = 3 * (cell.exact_gflops or 0.0) * 1e9 * steps * s.optim.batch_size
    shape = (cell.width, cell.depth, cell.max_len, s.optim.batch_size)
    ran = mode if cell.arch not in cannot and throughput.basis(cell.arch, mode, s.grid.widths_for(cell.arch)) else ALONE
    price = throughput.price(cell.arch, ran, shape, steps, flops)
    seconds = price.seconds / (max(speed, 1) if ran == mode else speed)  # a share of a GPU: in a mode's rate
    per_sample = throughput.validation_seconds(cell.arch, ran, shape, seconds / steps)
    validation = None if per_sample is None else validations(cell, s, steps) * s.evaluation.val_samples * per_sample
    return JobPrice(seconds + (validation or 0.0), validation, price.source, ran)


def validations(cell: CellSpec, s: SweepConfig, steps: int) -> int:
    """How often a trial of ``cell`` validates in ``steps`` steps: every ``sweep.evaluation.val_every_steps``, else
    at the end of each pass over its training samples."""
    every = s.evaluation.val_every_steps or -(-cell.train_samples // s.optim.batch_size)
    return steps // every


def own_way(s: SweepConfig) -> tuple[Mode, float]:
    """How the profile trains its trials: their mode (``configured_mode`` on a GPU profile; one trial alone on a CPU
    one), and how many times as fast as one trial alone each is taken to train (a trial on k devices, k times)."""
    gpus = s.resources.trial_resources()["gpu"]
    return (configured_mode(s) if gpus else ALONE), gpus or s.resources.workers()


def forecast(cfg: Config, cells: dict[Cell, CellSpec], throughput: Throughput, cluster: Cluster) -> Forecast:
    """The forecast of ``cells`` (with their model costs) on ``cluster`` at ``throughput``: as the profile trains
    them, and on a GPU profile under every way of training many trials a GPU that ``throughput`` measured."""
    s = cfg.sweep
    need = s.resources.trial_resources()
    mine, per_trial = own_way(s)
    unit, per_hour = ("GPU", need["gpu"]) if need["gpu"] else ("CPU core", need["cpu"])
    slots = cluster.slots(s.resources)
    configured = priced(s, cells, throughput, mine, slots, per_hour, per_trial)
    modes = []
    if unit == "GPU":
        for mode in dict.fromkeys([*throughput.modes(), mine]):
            if mode == mine:
                modes.append(configured)
                continue
            shared = s.resources.model_copy(update={"gpus_per_trial": 1 / mode.processes, "workers_per_trial": 1})
            share = 1 / mode.processes
            modes.append(priced(s, cells, throughput, mode, cluster.slots(shared), share, share))
    factor = s.verdict.max_budget_factor if s.verdict.stop_when_solved else 1
    grid = configured.row
    extended = grid.times(factor)  # every trial factor x as long: the same order, so the same schedule, stretched
    searches = []
    for name, ratios in REPLAYED.get(cfg.profile, {}).items():
        first, most = grid.times(1 / max(ratios)), extended.times(1 / min(ratios))
        packed = [replace(r, wall_hours=r.device_hours / per_hour / slots) for r in (first, most)]
        searches.append(SearchForecast(name, ratios, *packed))
    return Forecast(
        profile=cfg.profile,
        cells=len(cells),
        trials=sum(len(c.lrs) for c in cells.values()),
        lrs={arch: s.search.learning_rates(arch) for arch in dict.fromkeys(c.arch for c in cells)},
        steps=sorted({budget_steps(c, s.optim) for c in cells.values()}),
        factor=factor,
        slots=slots,
        unit=unit,
        per_trial=per_trial,
        configured=configured,
        modes=modes,
        grid=grid,
        extended=extended,
        search=strategy(s),
        searches=searches,
        shape_differs=len(cells) != REPLAYED_CELLS.get(cfg.profile, len(cells)),
    )


def check_decides(cfg: Config) -> Forecast:
    """A profile that decides a claim (``decides``) fits the wall time it states: the forecast of its grid on this
    machine, every trial at its extended budget (the most it trains), at the rate measured here now at every length
    it trains (on a CPU with every trial slot busy); a ``ConfigError`` naming both times if not. Returns the
    forecast."""
    import os

    import torch

    from pipeline.costs.throughput import measure_all  # Lightning's seconds of imports, only here

    d = cfg.decides
    assert d is not None
    s = cfg.sweep
    cells = {at: replace(cell, **model_costs(cell, s.model.heads)) for at, cell in defined_cells(cfg).items()}
    gpus = s.resources.gpus_per_trial > 0
    device = torch.device("cuda" if gpus else "cpu")
    where = Cluster(1, torch.cuda.device_count() if gpus else 0, None, os.cpu_count() or 1)
    throughput = measure_all(
        cfg, cells, widths=None, depths=None, length=None, batch=None, steps=3, warmup=1, device=device,
        precision=s.optim.precision, step=s.resources.step, every_length=True,
        side_by_side=1 if gpus else where.slots(s.resources),
    )  # fmt: skip
    plan = forecast(cfg, cells, throughput, where)
    if plan.extended.wall_hours > d.hours:
        raise ConfigError(
            f"decides.hours: {d.hours:g} h for {d.claim}, but the forecast on this machine gives up to "
            f"{plan.extended.wall_hours:.2f} h for its grid, every budget extended ({plan.grid.wall_hours:.2f} h at "
            "the first budgets; `python -m pipeline.forecast` prints the whole plan): shorten the budget "
            "(sweep.optim.max_steps, sweep.verdict.max_budget_factor) or state a longer time"
        )
    return plan


class Hindsight(NamedTuple):
    """One trial a sweep trained, beside what the forecast gives for it."""

    trial: str  # its cell and learning rate
    steps: int  # the steps it trained
    forecast: float  # seconds, priced as the forecast prices a trial, at those steps
    took: float  # seconds it trained (its train_seconds)
    cost: float  # its cell's expected cost: the order the sweep's searcher started it in


def hindsight(cfg: Config, cells: dict[Cell, CellSpec], throughput: Throughput, rows: list[dict]) -> list[Hindsight]:
    """Each trial of a sweep's ``rows`` (its results/trials.csv; those reused from earlier sweeps and those that
    trained no step left out) priced at ``throughput`` as the forecast prices it (``job_price``, the profile's own
    way), at the steps it trained, beside the seconds it took: how far the forecast is from a run, trial by trial,
    where the forecast itself cannot know how early a trial stops."""
    s = cfg.sweep
    mode, speed = own_way(s)
    cannot = unfusable(cells, s.model.heads) if mode.models > 1 else {}
    seen = []
    for row in rows:
        steps = int(float(row["train_steps"] or 0))
        if row.get("reused_from") or steps < 1:
            continue
        at = Cell(row["task"], int(row["size"]), row["arch"], int(row["width"]), int(row["depth"]), int(row["seed"]))
        if at not in cells:
            raise ForecastError(f"--against: trial {at} is not a cell of profile {cfg.profile} with these overrides")
        job = job_price(s, cells[at], throughput, mode, speed, cannot, steps)
        label = f"{at.task} {at.size} {at.arch} D={at.width} depth {at.depth} seed {at.seed} lr {float(row['lr']):g}"
        took, cost = float(row["train_seconds"]), expected_cost(cells[at], s.optim)
        seen.append(Hindsight(label, steps, job.seconds / job.mode.models, took, cost))
    return seen


def hindsight_wall(seen: list[Hindsight], slots: int) -> float:
    """The wall seconds of ``seen`` at their forecast seconds on ``slots`` slots, handed out as the sweep hands
    trials out (``list_schedule``): the run's wall as the forecast prices it, once it is known how long each trained."""
    return list_schedule([Trial(h.cost, h.forecast, 0.0) for h in seen], slots).wall
