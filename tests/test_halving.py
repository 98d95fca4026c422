"""Successive halving of a cell's learning rates (pipeline/search/halving.py), as the searcher drives it."""

from __future__ import annotations

import pytest
from ray.tune.search import Searcher

from pipeline.common.cell import Cell
from pipeline.common.status import Status
from pipeline.search.frontier import GridPlan
from pipeline.search.halving import Halving
from pipeline.search.searcher import CellSearcher
from tests.helpers import make_cell, write_params

LRS = (1e-2, 3e-3, 1e-3, 3e-4)


def paused(accuracy: float, rung: int) -> dict:
    return {"status": Status.PAUSED, "val_accuracy": accuracy, "rung": rung}


def test_a_rung_keeps_the_leading_fraction_and_names_why_the_rest_are_dropped():
    halving = Halving((100, 200), keep=0.5)
    runs = {1e-2: {"status": Status.DIVERGED, "val_accuracy": float("nan"), "rung": 0},
            3e-3: paused(0.6, 0), 1e-3: paused(0.4, 0), 3e-4: paused(0.2, 0)}
    go_on, dropped = halving.decide(runs, 0)
    assert go_on == [3e-3, 1e-3]  # the diverged run ranks last, the best two paused ones go on
    assert set(dropped) == {3e-4}
    assert dropped[3e-4].startswith("dropped at rung 1 of 2 (step 100): validation accuracy 0.200, 2 of 4")
    runs |= {3e-3: {"status": Status.SOLVED, "val_accuracy": 0.95, "rung": 1}, 1e-3: paused(0.7, 1)}
    assert halving.decide(runs, 1) == ([], {1e-3: "dropped at step 200: learning rate 0.003 solved the cell"})
    assert Halving().pause_at(0) is None and halving.pause_at(1) == 200 and halving.pause_at(2) is None


def test_the_searcher_pauses_every_rate_continues_the_leaders_and_drops_the_rest():
    """Tune's side without Ray: every learning rate starts with a pause at the first rung; once all have paused,
    the leaders are suggested again from their checkpoints, the rest dropped (and the sweep hears of it); the
    cell's verdict reaches the plan only when the last leader ends."""
    cell = Cell("lis", 4, "standard", 16, 1, 0)
    cells = {cell: make_cell(*cell, lrs=LRS)}
    dropped: list[dict] = []
    searcher = CellSearcher(GridPlan(cells), cells, {}, lambda c, lr: None, cost=lambda c: 1.0,
                            halving=Halving((100, 200), keep=0.5, unguided="rank"), dropped=dropped.append)
    first = [searcher.suggest(f"a{i}") for i in range(4)]
    assert [c["pause_at"] for c in first] == [100] * 4 and searcher.suggest("a4") is None
    for i, config in enumerate(first):
        searcher.rung_checkpoints[f"a{i}"] = f"/store/a{i}/checkpoint_000001"
        accuracy = {1e-2: 0.1, 3e-3: 0.5, 1e-3: 0.6, 3e-4: 0.3}[config["train"]["lr"]]
        searcher.on_trial_complete(f"a{i}", {"final": True, "step": 100, **paused(accuracy, 0)})
    assert sorted(r["lr"] for r in dropped) == [3e-4, 1e-2]
    assert all(r["status"] == Status.DROPPED and "rung 1 of 2" in r["reason"] for r in dropped)
    second = [searcher.suggest(f"b{i}") for i in range(2)]
    assert sorted(c["train"]["lr"] for c in second) == [1e-3, 3e-3]
    assert all(c["resume_step"] == 100 and c["resume"].endswith("checkpoint_000001") and c["pause_at"] == 200
               and c["rung"] == 1 for c in second)
    assert not searcher.plan.done()
    for i, config in enumerate(second):  # the last rung: 1e-3 solves, 3e-3 pauses and is dropped
        if config["train"]["lr"] == 1e-3:
            searcher.on_trial_complete(f"b{i}", {"final": True, "status": Status.SOLVED, "val_accuracy": 0.95,
                                                 "step": 150})
        else:
            searcher.rung_checkpoints[f"b{i}"] = "/store/b/checkpoint_000002"
            searcher.on_trial_complete(f"b{i}", {"final": True, "step": 200, **paused(0.7, 1)})
    assert searcher.suggest("c0") == Searcher.FINISHED and searcher.plan.done()
    assert searcher.best(cell)["lr"] == 1e-3 and searcher.plan.outcomes()[cell].status == Status.SOLVED
    assert {r["lr"]: r["status"] for r in searcher.runs[cell].values()} == {
        1e-2: Status.DROPPED, 3e-3: Status.DROPPED, 1e-3: Status.SOLVED, 3e-4: Status.DROPPED}


def test_fused_the_rates_pause_as_one_trial_and_the_leaders_go_on_as_a_smaller_one():
    """``fuse``: a cell's learning rates are one trial (its config lists them as members), each reported and decided
    apart; the leaders go on as one trial of two, each from its own directory of the first trial's checkpoint."""
    cell = Cell("lis", 4, "standard", 16, 1, 0)
    cells = {cell: make_cell(*cell, lrs=LRS)}
    searcher = CellSearcher(GridPlan(cells), cells, {"dropout": 0.0}, lambda c, lr: None, cost=lambda c: 1.0,
                            halving=Halving((100, 200), keep=0.5, unguided="rank"), fuse=lambda c: True)
    first = searcher.suggest("a")
    assert searcher.suggest("b") is None and searcher.queued == 0 and searcher.running == 4
    assert [m["lr"] for m in first["members"]] == list(LRS) and first["train"] == {"dropout": 0.0}
    searcher.rung_checkpoints["a"] = "/store/a/checkpoint_000001"
    accuracy = {1e-2: 0.1, 3e-3: 0.5, 1e-3: 0.6, 3e-4: 0.3}
    members = [{"trial_key": m["trial_key"], **paused(accuracy[m["lr"]], 0)} for m in first["members"]]
    searcher.on_trial_complete("a", {"final": True, "step": 100, "node": "n", "members": members})
    second = searcher.suggest("b")
    assert [m["lr"] for m in second["members"]] == [1e-3, 3e-3] and second["pause_at"] == 200
    assert all(m["resume"] == f"/store/a/checkpoint_000001/{m['trial_key']}" and m["resume_step"] == 100
               for m in second["members"])
    assert {lr: r["status"] for lr, r in searcher.runs[cell].items()} == {1e-2: Status.DROPPED, 3e-4: Status.DROPPED}


def test_a_neighbours_winner_goes_on_whatever_its_rank():
    """A rate that plateaus early leads one that jumps later; the rate that solved the nearest solved cell of the
    chain (same task, architecture, depth) is kept beside the leaders, and the reason of a dropped rate says so."""
    halving = Halving((100,), keep=0.25)
    runs = {3e-3: paused(0.6, 0), 1e-3: paused(0.1, 0), 3e-4: paused(0.3, 0), 1e-4: paused(0.2, 0)}
    assert halving.decide(runs, 0)[0] == [3e-3]
    assert halving.decide(runs, 0, favoured=None) == ([3e-3, 3e-4, 1e-4, 1e-3], {})  # no solved neighbour yet
    assert Halving((100,), keep=0.25, unguided="rank").decide(runs, 0, favoured=None)[0] == [3e-3]
    go_on, dropped = halving.decide(runs, 0, favoured=frozenset({1e-3, 5.0}))
    assert go_on == [3e-3, 1e-3] and set(dropped) == {3e-4, 1e-4}
    assert dropped[1e-4].endswith("1 of 4 learning rates kept by rank (the last at 0.600) and 1 that solved a "
                                  "neighbouring cell")

    cells = {c: make_cell(*c, lrs=LRS) for c in (
        Cell("lis", 4, "standard", w, 1, 0) for w in (16, 32, 64))} | {
        c: make_cell(*c, lrs=LRS) for c in (Cell("lis", 4, "linear", 16, 1, 0), Cell("lis", 5, "standard", 16, 1, 0))}
    searcher = CellSearcher(GridPlan(cells), cells, {}, lambda c, lr: None, cost=lambda c: 1.0)

    def ended(cell: Cell, winner: float, status: Status = Status.SOLVED) -> None:
        searcher.runs[cell] = {lr: {"lr": lr, "status": status if lr == winner else Status.UNSOLVED,
                                    "val_accuracy": 0.95 if lr == winner else 0.3} for lr in LRS}

    target = Cell("lis", 4, "standard", 16, 1, 0)
    assert searcher.favoured(target) is None
    ended(Cell("lis", 4, "linear", 16, 1, 0), 1e-2)  # another architecture teaches nothing
    ended(Cell("lis", 4, "standard", 64, 1, 0), 3e-4)  # two doublings away
    ended(Cell("lis", 4, "standard", 32, 1, 0), 3e-3, Status.UNSOLVED)  # not solved
    assert searcher.favoured(target) == frozenset({3e-4})
    ended(Cell("lis", 5, "standard", 16, 1, 0), 1e-3)  # one size step away (log2 5/4 < 1)
    assert searcher.favoured(target) == frozenset({1e-3})


def test_a_single_learning_rate_never_pauses_and_lr_search_all_never_does():
    cell = Cell("lis", 4, "standard", 16, 1, 0)
    one = {cell: make_cell(*cell, lrs=(1e-3,))}
    searcher = CellSearcher(GridPlan(one), one, {}, lambda c, lr: None, cost=lambda c: 1.0, halving=Halving((100,)))
    assert searcher.suggest("t")["pause_at"] is None
    many = {cell: make_cell(*cell, lrs=LRS)}
    searcher = CellSearcher(GridPlan(many), many, {}, lambda c, lr: None, cost=lambda c: 1.0)
    assert [searcher.suggest(f"t{i}")["pause_at"] for i in range(4)] == [None] * 4


@pytest.mark.integration
@pytest.mark.parametrize("fuse", ["off", "learning_rates"])
def test_a_real_sweep_halves_learning_rates_one_mlflow_run_each(tmp_path, tiny_data, fuse):
    """Ray Tune, Lightning and MLflow: three learning rates pause at step 4, the leader goes on from its checkpoint
    in the same MLflow run to its verdict, the other two are dropped (tagged so, checkpoints deleted). Fused, the
    three pause as one trial and the leader goes on alone (the rung shrinks K to 1), from its member's directory of
    the fused trial's checkpoint."""
    import pandas as pd
    from mlflow.tracking import MlflowClient

    from pipeline.common.config import load_config
    from pipeline.scheduling.driver import sweep

    store, db = tmp_path / "store", tmp_path / "mlflow.db"
    p = write_params(tmp_path / "params.yaml", f"""
profile: tiny
tasks: [arithmetic, lis]
sweep: {{grid: {{architectures: [standard], widths: [8], datasets: {{lis: [3]}}}},
         search: {{lrs: [0.03, 0.003, 0.0003], lr_search: halving, halving_rungs: [4], halving_keep: 0.3,
                   halving_unguided: rank}},
         resources: {{fuse: {fuse}}}}}
cluster: {{mlflow_tracking_uri: "sqlite:///{db}", storage_path: "{store}"}}
""")
    sweep(load_config(p), tiny_data, tmp_path / "results")
    trials = pd.read_csv(tmp_path / "results" / "trials.csv")
    assert sorted(trials.status) [:2] == ["dropped", "dropped"] and len(trials) == 3
    leader = trials[trials.status != "dropped"].iloc[0]
    assert leader.status in ("solved", "unsolved", "undecided") and leader.train_steps > 4
    assert leader.fused_members == 1  # its last attempt: alone after the rung, fused or not
    assert sorted(trials.fused_members) == ([1, 3, 3] if fuse == "learning_rates" else [1, 1, 1])
    assert all(r.startswith("dropped at rung 1 of 1 (step 4)") for r in trials[trials.status == "dropped"].reason)
    client = MlflowClient(f"sqlite:///{db}")
    runs = {r.data.tags["trial_key"]: r for r in client.search_runs(
        [client.get_experiment_by_name("capacity-atlas").experiment_id], "tags.trial_key != ''")}
    assert len(runs) == 3  # one run per learning rate, the continuation included
    steps = [m.step for m in client.get_metric_history(leader.mlflow_run_id, "val_accuracy")]
    assert steps[0] == 4 and steps == sorted(set(steps)) and steps[-1] >= 8  # one curve, across the rung
    assert client.get_run(leader.mlflow_run_id).data.tags["status"] == leader.status
    assert {r.data.tags["status"] for r in runs.values()} == {"dropped", leader.status}
    curves = pd.read_csv(tmp_path / "results" / "curves.csv")
    assert set(curves[curves.lr == leader.lr].step) == set(steps)
    assert not list(store.rglob("checkpoint_*")), "a dropped or finished trial left its checkpoints"
