"""The frontier search against synthetic accuracy oracles: it must give the full grid's minimum-width table while
training fewer cells, say when the oracle breaks its monotonicity assumptions, and settle what it saw."""

from __future__ import annotations

import itertools
import random

import pytest

from pipeline.common.cell import Cell
from pipeline.common.status import Status
from pipeline.search.frontier import FrontierPlan, GridPlan, MinWidth, min_widths
from tests.helpers import make_cell

WIDTHS = [16, 32, 64, 128, 256]
SIZES = [4, 8, 12, 16, 20]


def grid(archs=("standard", "linear"), seeds=(0,), depths=(2,), tasks=("lis",)) -> list[Cell]:
    return [Cell(t, s, a, w, d, seed) for t, s, a, w, d, seed in itertools.product(tasks, SIZES, archs, WIDTHS,
                                                                                   depths, seeds)]


def run(plan, solved, slots: int = 3, rng: random.Random | None = None):
    """Drive a plan as Ray would: up to ``slots`` cells in flight, finishing in a random order."""
    rng = rng or random.Random(0)
    queue, flight, trained = [], [], []
    while True:
        queue += plan.propose()
        while queue and len(flight) < slots:
            flight.append(queue.pop(0))
        if not flight:
            break
        cell = flight.pop(rng.randrange(len(flight)))
        trained.append(cell)
        plan.record(cell, verdict_of(solved(cell)))
    assert plan.done() and not queue
    return trained


def verdict_of(outcome: bool | Status) -> Status:
    """An oracle answers solved or not (a bool), or with a verdict (undecided, say)."""
    if isinstance(outcome, Status):
        return outcome
    return Status.SOLVED if outcome else Status.UNSOLVED


def compare(solved, cells=None, **kw):
    cells = cells or grid()
    full, frontier = GridPlan(cells), FrontierPlan(cells)
    full_trained = run(full, solved, **kw)
    trained = run(frontier, solved, **kw)
    assert len(set(trained)) == len(trained), "a cell was trained twice"
    outcomes = frontier.outcomes()
    assert set(outcomes) == set(cells)
    for cell in trained:
        assert outcomes[cell].measured and outcomes[cell].status == verdict_of(solved(cell))
    assert all(not o.measured for c, o in outcomes.items() if c not in trained)
    return min_widths(full.outcomes()), min_widths(outcomes), len(full_trained), trained, frontier


def threshold_oracle(need: dict):
    """Solved iff width >= need(task, size, arch, seed) (None: never)."""
    def solved(c: Cell) -> bool:
        w = need(c)
        return w is not None and c.width >= w
    return solved


def test_monotone_oracle_gives_the_grids_table_with_far_fewer_trials():
    # linear needs twice standard's width and one size more; sizes above 16 unsolvable for linear
    def need(c):
        base = {4: 16, 8: 32, 12: 32, 16: 64, 20: 128}[c.size]
        if c.arch == "linear":
            return None if c.size >= 20 else base * 2
        return base
    table, got, n_grid, trained, plan = compare(threshold_oracle(need))
    assert got == table and not plan.contradictions
    assert table["lis", 8, "standard", 2] == MinWidth(32) and table["lis", 20, "linear", 2] == MinWidth(None)
    # training cost grows with width (about width^2 per token): the grid pays for the widest cells it did not need
    cost = sum(c.width ** 2 for c in trained)
    assert sum(c.width ** 2 for c in grid()) >= 3 * cost and len(trained) < 0.6 * n_grid


@pytest.mark.parametrize("seed", range(20))
def test_random_monotone_frontiers_and_noisy_seeds_match_the_grid(seed):
    """Random non-decreasing frontiers, a different one per training seed (noise between seeds)."""
    rng = random.Random(seed)
    frontier = {}
    for arch, s in itertools.product(("standard", "linear"), (0, 1)):
        level = rng.randrange(len(WIDTHS))
        for size in SIZES:
            level += rng.choice([0, 0, 1])
            frontier[arch, s, size] = WIDTHS[level] if level < len(WIDTHS) else None
    cells = grid(seeds=(0, 1))
    table, got, n_grid, trained, plan = compare(threshold_oracle(lambda c: frontier[c.arch, c.seed, c.size]),
                                                cells, rng=rng)
    assert got == table and not plan.contradictions
    assert len(trained) < n_grid


def test_a_size_easier_than_the_last_is_reported_and_settled():
    need = {4: 64, 8: 64, 12: 16, 16: 128, 20: 128}  # size 12 needs less than size 8: not monotone in size
    table, got, _, trained, plan = compare(threshold_oracle(lambda c: need[c.size]), grid(archs=("standard",)))
    assert got == table and table["lis", 12, "standard", 2].width == 16
    assert any("not monotone in size" in note and "size 12" in note for note in plan.contradictions)


def test_a_dip_just_below_the_answer_is_reported_and_settled():
    def solved(c):  # at size 12, width 32 solves but the wider 64 does not: not monotone in width
        if c.size == 12:
            return c.width in (32, 128, 256)
        return c.width >= 64
    table, got, _, trained, plan = compare(solved, grid(archs=("standard",)))
    assert got == table and table["lis", 12, "standard", 2].width == 32
    assert any("not monotone in width" in n for n in plan.contradictions)
    assert any("not monotone in size" in n for n in plan.contradictions)


def test_nothing_solved_at_a_size_means_nothing_larger_is_trained():
    table, got, _, trained, plan = compare(threshold_oracle(lambda c: 256 if c.size == 4 else None),
                                           grid(archs=("standard",)))
    assert got == table and all(c.size <= 8 for c in trained)
    inferred = [o for c, o in plan.outcomes().items() if c.size > 8]
    assert inferred and all(not o.measured and not o.passed and "inferred" in o.reason for o in inferred)


def test_an_undecided_cell_bounds_nothing_and_its_width_stays_an_upper_bound():
    """Width 64 solves every size; width 32 is undecided at size 4 (still improving when its budget ran out). The
    search must not take 32 as unsolved: size 4's answer is 64 with 32 named undecided, and size 8 (which may need
    no more than size 4) measures 32 itself instead of inferring it from the undecided cell."""
    def solved(c):
        if c.size == 4 and c.width == 32:
            return Status.UNDECIDED
        return c.width >= 64
    table, got, _, trained, plan = compare(solved, grid(archs=("standard",)))
    assert got == table == {**table, ("lis", 4, "standard", 2): MinWidth(64, ("seed 0 D=32",))}
    assert not table["lis", 4, "standard", 2].decided and table["lis", 8, "standard", 2] == MinWidth(64)
    assert Cell("lis", 8, "standard", 32, 2, 0) in trained
    assert not plan.contradictions


def test_an_undecided_size_does_not_make_the_larger_sizes_unsolved():
    """Nothing solves size 8, but width 256 is undecided there: size 12 is still searched, not inferred."""
    def solved(c):
        if c.size == 8:
            return Status.UNDECIDED if c.width == 256 else False
        return c.size == 4 and c.width >= 128 or c.size > 8 and c.width >= 256
    table, got, _, trained, plan = compare(solved, grid(archs=("standard",)))
    assert got == table and table["lis", 8, "standard", 2] == MinWidth(None, ("seed 0 D=256",))
    assert table["lis", 12, "standard", 2] == MinWidth(256) and Cell("lis", 12, "standard", 256, 2, 0) in trained
    outcomes = plan.outcomes()
    assert outcomes[Cell("lis", 8, "standard", 256, 2, 0)].status == Status.UNDECIDED


@pytest.mark.parametrize("seed", range(10))
def test_random_frontiers_with_undecided_cells_just_below_them_match_the_grid(seed):
    """Random monotone frontiers whose width just below the answer is sometimes undecided (as a trial still
    rising at its budget is): the frontier's table, undecided cells included, is the grid's."""
    rng = random.Random(seed)
    need, undecided = {}, set()
    for arch in ("standard", "linear"):
        level = rng.randrange(len(WIDTHS))
        for size in SIZES:
            level += rng.choice([0, 0, 1])
            need[arch, size] = WIDTHS[level] if level < len(WIDTHS) else None
            if 0 < level < len(WIDTHS) and rng.random() < 0.5:
                undecided.add((arch, size, WIDTHS[level - 1]))

    def solved(c):
        if (c.arch, c.size, c.width) in undecided:
            return Status.UNDECIDED
        return need[c.arch, c.size] is not None and c.width >= need[c.arch, c.size]
    table, got, n_grid, trained, plan = compare(solved, rng=rng)
    assert got == table
    assert any(not m.decided for m in table.values()) == bool(undecided)


def test_plans_keep_every_slot_busy_while_chains_are_open():
    plan = FrontierPlan(grid(archs=("standard", "linear", "sparse"), seeds=(0, 1)))
    assert len(plan.propose()) == 6  # one bisection probe per chain at once


@pytest.mark.slow
@pytest.mark.integration
def test_the_real_frontier_sweeps_give_the_grids_table_for_less(tmp_path):
    """bench_frontier's quick grid through Ray Tune, Lightning and MLflow, the frontier alone and with every other
    saving at once (halving without prediction: tests/test_halving.py): each (cell, learning rate) run a frontier mode
    trained to its verdict ends as its grid twin did (training is deterministic, and a run continued past a rung
    follows the steps of one never paused), so the min-width table is the grid's, for less."""
    import pandas as pd

    from benchmarks.bench_frontier import QUICK, run_modes

    modes = run_modes(QUICK, tmp_path, ("grid", "frontier", "frontier+predict+halving"))
    keys = ["task", "size", "arch", "width", "depth", "seed", "lr"]
    grid = pd.read_csv(modes["grid"]["out"] / "trials.csv")
    solved = grid.groupby(["size", "width"]).status.apply(lambda s: (s == "solved").any())
    assert solved.any() and not solved.all()  # a real frontier: something solved, something not
    for name in ("frontier", "frontier+predict+halving"):
        trials = pd.read_csv(modes[name]["out"] / "trials.csv")
        ended = trials[trials.status != "dropped"]
        twins = ended.merge(grid, on=keys, suffixes=("", "_grid"))
        assert len(twins) == len(ended) and (twins.status == twins.status_grid).all(), name
        assert (twins.val_accuracy == twins.val_accuracy_grid).all(), name
        assert modes[name]["table"].equals(modes["grid"]["table"]), name
        assert modes[name]["pflops"] < modes["grid"]["pflops"], name


def test_the_searcher_turns_cells_into_learning_rate_trials_and_reuses_finished_runs():
    """CellSearcher as Tune drives it, without Ray: reused runs never become trials, and a cell's verdict (its
    best learning rate) reaches the plan once all its learning rates ended."""
    from ray.tune.search import Searcher

    from pipeline.search.searcher import CellSearcher, trial_key

    cells = {c: make_cell(*c, cell_id=f"id{c.width}-{c.size}", lrs=(0.1, 0.01)) for c in grid(archs=("standard",))}
    reused = {trial_key(v, 0.1): {"status": "solved", "val_accuracy": 0.95} for c, v in cells.items() if c.size == 4}
    searcher = CellSearcher(FrontierPlan(cells), cells, {"steps": 1}, lambda cell, lr: reused.get(trial_key(cell, lr)),
                            cost=lambda cell: cell.width)
    assert searcher.needs_training()
    first = searcher.suggest("t0")
    assert first["train"]["lr"] == 0.01 and first["cell"]["cell_id"] == "id64-4"  # lr 0.1 of it was reused
    searcher.on_trial_complete("t0", {"final": True, "status": "unsolved", "val_accuracy": 0.5})
    best = searcher.best(Cell("lis", 4, "standard", 64, 2, 0))
    assert best["lr"] == 0.1 and best["status"] == "solved"
    suggested = []
    while (config := searcher.suggest(f"t{len(suggested) + 1}")) not in (None, Searcher.FINISHED):
        suggested.append(config)
        searcher.on_trial_complete(f"t{len(suggested)}", {"final": True, "status": "unsolved", "val_accuracy": 0.1})
    assert config == Searcher.FINISHED and searcher.plan.done()
    assert all(c["train"]["lr"] == 0.01 for c in suggested if c["cell"]["cell_id"].endswith("-4"))  # 0.1: reused
