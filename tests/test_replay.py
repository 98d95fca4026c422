"""Search strategies replayed on recorded trials (pipeline/search/replay.py): a made-up grid whose outcomes are
known, replayed with the grid and the frontier plans on 1 and on many slots."""

from __future__ import annotations

import pandas as pd
import pytest

from pipeline.search.frontier import Cell, FrontierPlan, GridPlan, MinWidth
from pipeline.search.halving import Halving
from pipeline.search.replay import ReplayError, load_trials, replay

SIZES, WIDTHS, LRS = (4, 5, 6), (8, 16, 32, 64), (1e-3, 1e-2)
NEEDED = {4: 16, 5: 16, 6: 32}  # the smallest width that solves each size, at lr 1e-3; lr 1e-2 never solves


@pytest.fixture
def trials(tmp_path):
    rows = []
    for size in SIZES:
        for width in WIDTHS:
            for lr in LRS:
                solved = lr == 1e-3 and width >= NEEDED[size]
                rows.append({"task": "lis", "size": size, "arch": "standard", "width": width, "depth": 2, "seed": 0,
                             "lr": lr, "status": "solved" if solved else "unsolved",
                             "val_accuracy": 0.95 if solved else 0.3 + width / 1000, "train_pflops": width * size,
                             "train_seconds": width / 8, "eval_seconds": 0.0, "exact_gflops": width * size,
                             "train_steps": 100})
    path = tmp_path / "trials.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


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


def test_halving_replayed_on_recorded_curves_trains_less_for_the_same_table(trials):
    """With curves (lr 1e-2 flat at 0.01, lr 1e-3 rising), halving drops 1e-2 at the first rung: fewer FLOPs, same
    table; a rung past a run's end changes nothing for it. By default (unguided: keep) a cell whose chain has no
    solved cell yet drops nothing."""
    recorded = load_trials(trials)
    for runs in recorded.values():
        for lr, run in runs.items():
            run.curve = [(t, 0.01 if lr == 1e-2 else t / 100 * run.val_accuracy, run.train_pflops * t / 100)
                         for t in range(10, 101, 10)]
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
