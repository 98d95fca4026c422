"""Search strategies replayed on recorded trials (pipeline/search/replay.py): a made-up grid whose outcomes are
known, replayed with the grid and the frontier plans on 1 and on many slots."""

from __future__ import annotations

import pandas as pd
import pytest

from pipeline.common.cell import Cell
from pipeline.common.status import Status
from pipeline.search.frontier import FrontierPlan, GridPlan, MinWidth
from pipeline.search.halving import Halving
from pipeline.search.replay import ReplayError, load_trials, replay, verified
from tests.helpers.tables import RECORDED_LRS, RECORDED_NEEDED, RECORDED_SIZES, RECORDED_WIDTHS, recorded_grid

SIZES, WIDTHS, LRS, NEEDED = RECORDED_SIZES, RECORDED_WIDTHS, RECORDED_LRS, RECORDED_NEEDED


@pytest.fixture
def trials(tmp_path):
    return recorded_grid(tmp_path)


def test_the_grid_replayed_trains_everything_and_the_frontier_less_for_the_same_table(trials):
    recorded = load_trials(trials)
    cells = list(recorded)
    expected = {("lis", s, "standard", 2): MinWidth(NEEDED[s]) for s in SIZES}
    grid = replay(GridPlan(cells), recorded, slots=1)
    assert grid.trials == len(SIZES) * len(WIDTHS) * len(LRS) and grid.table == expected
    assert grid.pflops == pytest.approx(sum(w * s for s in SIZES for w in WIDTHS) * len(LRS))
    assert grid.wall == pytest.approx(sum(w / 8 for w in WIDTHS) * len(SIZES) * len(LRS))  # one slot: in turn
    assert replay(GridPlan(cells), recorded, slots=100).wall == pytest.approx(max(WIDTHS) / 8)  # all at once
    frontier = replay(FrontierPlan(cells), recorded, slots=2)
    assert frontier.table == expected
    assert frontier.trials < grid.trials and frontier.pflops < grid.pflops / 2


def test_the_verify_only_oracle_trains_each_answer_and_the_width_below(trials):
    """Per size: the answer's one solving run (width x size PFLOPs) and both runs of the width below; a size no
    width solves costs its widest width's runs and ends the chain."""
    recorded = load_trials(trials)
    assert verified(recorded) == pytest.approx(sum(NEEDED[s] * s + 2 * NEEDED[s] // 2 * s for s in SIZES))
    assert replay(FrontierPlan(list(recorded)), recorded, slots=1).pflops >= verified(recorded)
    for cell in [c for c in recorded if c.size >= 5]:
        for run in recorded[cell].values():
            run.status = Status.UNSOLVED
    assert verified(recorded) == pytest.approx(16 * 4 + 2 * 8 * 4 + 2 * 64 * 5)  # size 6 is inferred


def test_a_replay_names_what_it_cannot_do(trials, tmp_path):
    recorded = load_trials(trials)
    del recorded[Cell("lis", 5, "standard", 16, 2, 0)]
    with pytest.raises(ReplayError, match="Cell\\(task='lis', size=5, arch='standard', width=16"):
        replay(GridPlan([*recorded, Cell("lis", 5, "standard", 16, 2, 0)]), recorded, slots=2)
    with pytest.raises(ReplayError, match="slots must be at least 1"):
        replay(GridPlan(list(recorded)), recorded, slots=0)
    pd.DataFrame({"task": ["lis"]}).to_csv(tmp_path / "other.csv", index=False)
    with pytest.raises(ReplayError, match="not a sweep's trials.csv \\(no column arch, depth, lr"):
        load_trials(tmp_path / "other.csv")


def test_bench_frontier_replays_every_strategy_over_a_recorded_grid(trials, tmp_path, capsys):
    import json

    from benchmarks import bench_frontier

    assert bench_frontier.main(["--replay", str(trials), "--slots", "2", "--out", str(tmp_path / "f.json")]) == 0
    lines = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert lines["grid"][1] == "24" and lines["grid"][-1] == "True"
    assert int(lines["frontier"][1]) < 24 and lines["frontier"][-1] == "True"
    section = json.loads((tmp_path / "f.json").read_text())["sections"]["replay recorded"]
    assert section["figures"]["frontier"]["grid_over_strategy"]["median"] > 2
    assert section["figures"]["oracle (verify only)"]["train_pflops"]["median"] == pytest.approx(
        verified(load_trials(trials)))


def test_halving_replayed_on_recorded_curves_trains_less_for_the_same_table(tmp_path):
    """With curves (lr 1e-2 flat at 0.01, lr 1e-3 rising), halving drops 1e-2 at the first rung: fewer FLOPs, same
    table; a rung past a run's end changes nothing for it. By default (unguided: keep) a cell whose chain has no
    solved cell yet drops nothing."""
    recorded = load_trials(recorded_grid(tmp_path, curves=True))
    cells = list(recorded)
    everything = replay(GridPlan(cells), recorded, slots=2)
    halved = replay(GridPlan(cells), recorded, slots=2, halving=Halving((20,), keep=0.5, unguided="rank"))
    assert halved.table == everything.table and halved.dropped == len(cells)
    dropped_flops = 0.8 * sum(r[1e-2].train_pflops for r in recorded.values())
    assert halved.pflops == pytest.approx(everything.pflops - dropped_flops)
    assert halved.attempts == 3 * len(cells)  # two first attempts and one continuation per cell
    guarded = replay(GridPlan(cells), recorded, slots=2, halving=Halving((20,), keep=0.5))
    assert guarded.table == everything.table and 0 < guarded.dropped < len(cells)


def test_a_predicted_frontier_replayed_finds_the_same_table(trials):
    recorded = load_trials(trials)
    plain = replay(FrontierPlan(list(recorded)), recorded, slots=1)
    predicted = replay(FrontierPlan(list(recorded), ["sizes"]), recorded, slots=1)
    assert predicted.table == plain.table
