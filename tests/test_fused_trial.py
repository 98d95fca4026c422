"""A fused trial (pipeline/training/fused_trial.py): a cell's learning rates trained as one model, each member ending
as its separate trial ends, frozen once it stops, and checkpointed as its separate trial is."""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from pathlib import Path

import lightning as L
import pytest
import torch

from models.fused import FusionError
from pipeline.training.checkpoints import FILE
from pipeline.training.fused_trial import run_fused
from pipeline.training.train import run_trial
from tests.helpers.training import Copies, MemberCopies, with_settings

# solved at step 10 (two rates), undecided at the budget, diverged at step 3: each member stops at its own step
LRS = (3e-2, 3e-3, 1e-5, 1e6)
NAMES = [f"m{k}" for k in range(len(LRS))]
SAME = ("status", "reason", "train_steps", "budget_steps", "solve_step", "train_pflops", "final_accuracy",
        "val_accuracy", "token_accuracy")
VERDICT = SAME[:-2]  # a diverged member is not validated at its last step (its separate trial validates once more)


@pytest.fixture
def specs(spec):
    """The tiny trial's learning rates, without dropout (a fused member draws its own masks), solved at 0.4."""
    solved = with_settings(spec, dropout=0.0, threshold=0.4, patience=1, targets={"lis": 0.4})
    return [dataclasses.replace(solved, lr=lr) for lr in LRS]


def same(a: dict, b: dict, keys=SAME) -> list[str]:
    """The keys whose values differ (NaN equals NaN)."""
    return [k for k in keys if not (a[k] == b[k] or (a[k] != a[k] and b[k] != b[k]))]


def test_each_member_ends_as_its_separate_trial_ends(specs):
    fused = run_fused(specs, NAMES)
    separate = [run_trial(spec) for spec in specs]
    assert [r["status"] for r in fused] == ["solved", "solved", "undecided", "diverged"]
    for lr, a, b in zip(LRS, fused, separate):
        differ = same(a, b, VERDICT if a["status"] == "diverged" else SAME)
        assert not differ, f"lr {lr}: {differ}"
        assert a["fused_members"] == len(LRS) and b["fused_members"] == 1
    assert math.isnan(fused[3]["val_accuracy"]) and separate[3]["val_accuracy"] == 0.0



class FitSizes(L.Callback):
    """The members of each fit, as it starts."""

    def __init__(self):
        self.seen = []

    def on_fit_start(self, trainer, module):
        self.seen.append(len(module.specs))


def test_frozen_members_leave_the_stack_and_the_one_still_training_ends_as_it_would_in_it(specs, tmp_path):
    """Restacked as soon as at most half the stack trains (``restack`` 0: whatever it costs): at step 10, two members
    solved and one diverged, the undecided one goes on alone from its checkpoint there. Every member's record is the
    whole stack's, its checkpoints of both fits counted; nothing is reported twice; each later save holds every
    member's checkpoint, the frozen ones' as they last trained."""
    fits, told = FitSizes(), []
    whole = run_fused(specs, NAMES, checkpoints=functools.partial(MemberCopies, folder=tmp_path / "whole"),
                      callbacks=[fits], restack=None)
    assert fits.seen == [4]
    restacked = run_fused(specs, NAMES, callbacks=[fits], restack=0.0,
                          checkpoints=functools.partial(MemberCopies, folder=tmp_path / "restacked", told=told))
    assert fits.seen == [4, 4, 1] and told == []
    keys = (*SAME, "checkpoints", "fused_members", "resumed_step")
    for lr, a, b in zip(LRS, restacked, whole):
        assert not same(a, b, keys), f"lr {lr}: {same(a, b, keys)}"
    assert restacked[2]["checkpoints"] == 8 and "continues" not in restacked[2]
    for step in (15, 40):
        assert sorted(p.name for p in (tmp_path / "restacked" / f"step-{step}").iterdir()) == NAMES


def test_a_restack_pays_when_the_frozen_members_steps_left_cost_more_than_a_start():
    """``Members.pays_to_restack``: at most half the stack training, and the frozen members' share of the steps left
    (at the measured time a step) over ``restack`` times the fit's start."""
    from types import SimpleNamespace

    from pipeline.training.fused_trial import Members

    def members(limits, stopped, restack=2.0):
        m = Members([SimpleNamespace(limit=limit) for limit in limits], restack)
        m.stopped = stopped
        now = time.perf_counter()
        m.created, m.first_step = now - 11.0, (1, now - 10.0)  # started in 1 s; 100 steps in 10 s since
        return m

    assert members([1000] * 4, [10, 10, 10, None]).pays_to_restack(101)  # 899 steps x 0.1 s x 3/4 > 2 x 1 s
    assert not members([120] * 4, [10, 10, 10, None]).pays_to_restack(101)  # 19 steps: 1.4 s < 2 s
    assert not members([1000] * 4, [10, 10, None, None], restack=None).pays_to_restack(101)  # never asked
    assert not members([1000] * 3, [10, None, None]).pays_to_restack(101)  # two of three still train
    assert members([1000] * 2, [10, None]).pays_to_restack(101)


@pytest.fixture(scope="module")
def one_pass_data(tmp_path_factory) -> Path:
    """Tiny index lookup (a classification) and eq_ncp (next-character prediction) datasets: the families whose
    members are scored in one batched pass at a validation."""
    from pipeline.common.config import load_config
    from pipeline.generate import generate_task
    from tests.helpers import write_params

    tmp = tmp_path_factory.mktemp("one_pass")
    params = "profile: tiny\ntasks: [index_lookup, eq_ncp]\ngenerate: {datasets: {index_lookup: [10], eq_ncp: [8]}}\n"
    cfg = load_config(write_params(tmp / "params.yaml", params))
    for task in ("index_lookup", "eq_ncp"):
        generate_task(cfg, task, tmp / "data", check=True)
    return tmp / "data"


@pytest.mark.parametrize("task, size", [("index_lookup", 10), ("eq_ncp", 8)])
def test_members_scored_in_one_pass_score_as_their_separate_trials(specs, one_pass_data, task, size):
    """Where a validation scores the active members in one batched pass (``FusedSequenceModel.member_accuracies``:
    a classification's greedy answer, ncp's every-prefix score), each member's accuracies, verdict and steps are its
    separate trial's."""
    from tests.helpers import dataset_fields, make_cell

    cell = make_cell(task, size, "standard", 16, 1, 3, **dataset_fields(one_pass_data, task, size))
    settings = {"targets": {task: 0.4}, "max_steps": 300, "val_every_steps": 50}
    lrs = (1e-2, 3e-3, 1e6)  # 0.03 would amplify fusion's float rounding over 300 steps into another model
    on_task = [dataclasses.replace(specs[0], cell=cell, lr=lr, settings=specs[0].settings.replaced(**settings))
               for lr in lrs]  # fmt: skip
    fused = run_fused(on_task, NAMES[: len(lrs)])
    separate = [run_trial(spec) for spec in on_task]
    for lr, a, b in zip(lrs, fused, separate):
        differ = same(a, b, VERDICT)
        assert not differ, f"{task} lr {lr}: {differ} {[(a[k], b[k]) for k in differ]}"
        # a member's float rounding is not its separate model's (batched matmuls): over 300 steps at 1e-2 it can
        # flip a token of the tiny validation set (eq_ncp on an AMD EPYC with AVX-512: 25 of 48 tokens against 26)
        for key in SAME[len(VERDICT) :] if a["status"] != "diverged" else ():
            assert a[key] == pytest.approx(b[key], abs=0.05), f"{task} lr {lr}: {key} {a[key]} {b[key]}"
    assert fused[-1]["status"] == "diverged"  # frozen at step 1: every later validation scores a subset

def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes: NaN equals NaN bit for bit (a diverged member's weights)."""
    return t.detach().contiguous().view(torch.uint8)


class Watch(L.Callback):
    """Each member's weights and Adam moments after every training step, as bytes."""

    def __init__(self):
        self.steps = {}

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        optimizer = trainer.optimizers[0]
        state = [optimizer.state[p] for p in module.fused.parameters()]
        self.steps[trainer.global_step] = [
            [bits(p[k]).clone() for p in module.fused.parameters()]
            + [bits(s[m][k]).clone() for s in state for m in ("exp_avg", "exp_avg_sq")]
            for k in range(len(LRS))
        ]


class Books(L.Callback):
    """The whole step's books at the fit's end."""

    def on_train_end(self, trainer, module):
        self.whole = module.whole


def graphed(specs: list) -> list:
    return [with_settings(spec, step="graphed") for spec in specs]


def test_the_whole_step_as_one_program_trains_every_member_bit_for_bit_as_lightnings_step(specs, caplog):
    """A graphed fused trial runs its step whole (``GraphedStep``: forward, backward, each member's clip and the
    update as one program, under Lightning's manual optimization; on a GPU one CUDA graph a shape). On a CPU its twin
    runs that program eagerly with the same books, and says so: every member's weights and moments after every step,
    and every record, are the automatic step's bit for bit, through each member's stop (a freeze: a new program,
    recorded anew)."""
    automatic, whole, books = Watch(), Watch(), Books()
    expected = run_fused(specs, NAMES, callbacks=[automatic])
    with caplog.at_level("INFO", logger="pipeline.training.fused_trial"):
        got = run_fused(graphed(specs), NAMES, callbacks=[whole, books])
    assert "fused fit: a whole step graphed needs a GPU; on cpu it runs eager" in caplog.text
    for lr, a, b in zip(LRS, got, expected):
        assert not same(a, b), f"lr {lr}: {same(a, b)}"
    assert automatic.steps.keys() == whole.steps.keys()
    for step, members in automatic.steps.items():
        assert all(torch.equal(a, b) for k in range(len(LRS)) for a, b in zip(members[k], whole.steps[step][k])), step
    run = books.whole
    assert (run.eager, run.replays, run.mode) == (40, 0, "eager") and "needs a GPU" in run.why
    stops = {r["train_steps"] for r in got} - {40}  # each stop before the last step froze a member: a new program
    assert len({program for _, program in run.warmed}) == 1 + len(stops), (run.warmed, stops)


@pytest.mark.slow
def test_a_whole_steps_checkpoints_resume_as_automatic_ones_and_automatic_ones_in_it(specs, tmp_path):
    """A fit whose step runs whole counts its steps as Lightning's manual optimization does: its members' checkpoints
    still resume, alone as separate trials or fused with the whole step again, at their step and to the same end;
    and a separate trial's checkpoint (automatic optimization's) resumes in a whole step's fit."""
    specs, names = specs[1:3], NAMES[1:3]  # solved at 10, undecided at 40
    automatic = run_fused(specs, names)
    run_trial(specs[1], checkpoints=Copies(folder=tmp_path / "alone"))
    whole = run_fused(graphed(specs), names, checkpoints=functools.partial(MemberCopies, folder=tmp_path / "whole"))
    assert all(not same(a, b) for a, b in zip(whole, automatic))
    saved = tmp_path / "whole" / "step-20" / names[1]
    again = run_fused(graphed(specs[1:]), names[1:], resumes=[saved])
    assert again[0]["resumed_step"] == 20 and not same(again[0], automatic[1])
    again = run_fused(graphed(specs[1:]), names[1:], resumes=[tmp_path / "alone" / "step-5"])
    assert again[0]["resumed_step"] == 5 and not same(again[0], automatic[1])
    alone = run_trial(specs[1], checkpoints=Copies(saved / FILE))
    assert alone["resumed_step"] == 20 and not same(alone, automatic[1])


def test_a_member_that_stopped_stays_bit_identical_while_the_others_train(specs):
    watch = Watch()
    fused = run_fused(specs, NAMES, callbacks=[watch])
    for k, result in enumerate(fused):
        stopped = result["train_steps"]
        later = [s for s in watch.steps if s >= stopped]
        assert later or stopped == max(watch.steps), k
        for step in later:
            assert all(torch.equal(a, b) for a, b in zip(watch.steps[stopped][k], watch.steps[step][k])), (k, step)
    assert max(watch.steps) == 40  # the undecided member trained on to its budget
    assert not all(torch.equal(a, b) for a, b in zip(watch.steps[10][2], watch.steps[40][2]))  # it moved


def test_a_members_checkpoint_resumes_alone_or_in_a_smaller_group_to_the_same_end(specs, tmp_path):
    specs = specs[1:3]  # solved at 10, undecided at 40: checkpoints at 5, 10 (both), 15 to 40 (the second)
    names = NAMES[1:3]
    whole = run_fused(specs, names, checkpoints=functools.partial(MemberCopies, folder=tmp_path))
    assert whole[0]["checkpoints"] == 2 and whole[1]["checkpoints"] == 8
    saved = tmp_path / "step-5"
    assert sorted(p.name for p in saved.iterdir()) == names
    # a member's directory is a separate trial's checkpoint: it continues alone to its separate end
    alone = run_trial(specs[1], checkpoints=Copies(saved / names[1] / FILE))
    assert alone["resumed_step"] == 5 and not same(alone, whole[1])
    # both members again from step 5, and from a later save, where the solved member keeps its checkpoint of step 10;
    # with dropout on, which the resumed fit must draw as the uninterrupted one did
    specs = [with_settings(spec, dropout=0.1) for spec in specs]
    whole = run_fused(specs, names, checkpoints=functools.partial(MemberCopies, folder=tmp_path / "dropout"))
    assert [r["train_steps"] for r in whole] == [10, 40]
    for step in (5, 20):
        group = [tmp_path / "dropout" / f"step-{step}" / name for name in names]
        again = run_fused(specs, names, resumes=group)
        assert all(not same(a, b) for a, b in zip(again, whole)), step
        assert [r["resumed_step"] for r in again] == ([5, 5] if step == 5 else [10, 20])


def test_members_of_different_cells_or_repeated_rates_are_refused(specs):
    cell = specs[1].cell
    other = dataclasses.replace(specs[1], cell=dataclasses.replace(cell, cell=cell.cell._replace(width=32)))
    with pytest.raises(FusionError, match="members 0 and 1 of a fused trial differ in their cell"):
        run_fused([specs[0], other], NAMES[:2])
    with pytest.raises(FusionError, match="learning rates .* repeat"):
        run_fused([specs[0], specs[0]], NAMES[:2])


@pytest.mark.integration
def test_the_tiny_sweep_gives_the_same_verdicts_with_fusion_on_and_off(tmp_path, tiny_data, capsys):
    """Ray Tune, Lightning and MLflow on the tiny profile (every architecture, at one width and dataset), with three
    learning rates a cell, fused (one Tune trial a cell; lstm, which cannot fuse, trains them apart and the sweep
    says so) and not: every learning-rate run ends with the same verdict, reason, steps and scores (some stop at
    the first budget while the others of their trial go on), with the same curve (every validation's step, accuracy
    and training FLOPs; its loss within float32's rounding), in an MLflow run of its own, and no checkpoint is
    left."""
    import pandas as pd
    from mlflow.tracking import MlflowClient

    from pipeline.common.config import load_config
    from pipeline.scheduling.driver import sweep
    from tests.helpers import write_params

    def params(fuse: str, stores: str) -> Path:
        store, db = tmp_path / stores / "store", tmp_path / stores / "mlflow.db"
        return write_params(tmp_path / f"{fuse}-{stores}.yaml", f"""
profile: tiny
tasks: [arithmetic, lis]
sweep: {{grid: {{widths: [8], datasets: {{lis: [3]}}}}, search: {{lrs: [0.03, 0.003, 0.0003]}},
         resources: {{fuse: {fuse}}}}}
cluster: {{mlflow_tracking_uri: "sqlite:///{db}", storage_path: "{store}"}}
""")

    tables, curves = {}, {}
    for fuse in ("off", "learning_rates"):
        (tmp_path / fuse).mkdir()
        store, db = tmp_path / fuse / "store", tmp_path / fuse / "mlflow.db"
        p = params(fuse, fuse)
        sweep(load_config(p), tiny_data, tmp_path / fuse / "results")
        trials = pd.read_csv(tmp_path / fuse / "results" / "trials.csv").sort_values(["arch", "lr"])
        tables[fuse] = trials.reset_index(drop=True)
        curves[fuse] = pd.read_csv(tmp_path / fuse / "results" / "curves.csv").reset_index(drop=True)
        client = MlflowClient(f"sqlite:///{db}")
        runs = client.search_runs([client.get_experiment_by_name("capacity-atlas").experiment_id],
                                  "tags.trial_key != ''")
        assert sorted(r.info.run_id for r in runs) == sorted(trials.mlflow_run_id)  # one run each
        for run in runs:
            assert run.info.status == "FINISHED" and run.data.tags["status"] in set(trials.status)
            assert client.get_metric_history(run.info.run_id, "val_accuracy"), run.data.tags["trial_key"]
        assert not list(store.rglob("checkpoint_*")), "a finished trial left its checkpoints"
    off, on = tables["off"], tables["learning_rates"]
    assert len(on) == 3 * len(load_config(p).sweep.grid.architectures) and (off.fused_members == 1).all()
    assert list(on.fused_members) == [3 if arch != "lstm" else 1 for arch in on.arch]
    assert "sweep: sweep.resources.fuse: learning_rates: lstm cannot fuse" in capsys.readouterr().out
    for key in ("arch", "lr", "status", "reason", "train_steps", "budget_steps", "solve_step", "final_accuracy"):
        assert off[key].equals(on[key]), (key, off[key].tolist(), on[key].tolist())
    apart, fused = curves["off"], curves["learning_rates"]
    assert len(apart) > len(off) and apart.drop(columns="val_loss").equals(fused.drop(columns="val_loss"))
    assert fused.val_loss.to_numpy() == pytest.approx(apart.val_loss.to_numpy(), rel=1e-4)
    # one reuse key, fused or not: the fused sweep over the unfused one's stores trains nothing
    sweep(load_config(params("learning_rates", "off")), tiny_data, tmp_path / "again")
    again = pd.read_csv(tmp_path / "again" / "trials.csv")
    assert again.reused_from.notna().all() and set(again.reused_from) == set(off.mlflow_run_id)


def test_members_that_do_not_fit_together_train_apart_and_one_that_cannot_fit_alone_is_failed(specs, caplog):
    """The memory plan measures the fused model before it trains: with room for one member's sample and not two's,
    the two train as fits of one, said in the log, each ending as its separate trial under that budget; with room
    for none, each is recorded failed with what it needs, as a separate trial is."""
    import contextlib

    from models.fused import Fused
    from pipeline.data.datasets import read_dataset
    from pipeline.training.memory import GB, fit_memory
    from pipeline.training.train import SequenceModel

    specs = specs[1:3]
    model = SequenceModel(specs[0]).model
    length = int(read_dataset(Path(specs[0].cell.train_path)).lengths.max())
    need = [fit_memory(m, length, 16, None, torch.device("cpu"), contextlib.nullcontext).needed(1)
            for m in (model, Fused([model] * 2))]
    assert need[1] > 1.5 * need[0]
    specs = [with_settings(spec, memory_gb_per_trial=1.25 * need[0] / GB) for spec in specs]
    with caplog.at_level("WARNING", logger="pipeline.training.fused_trial"):
        apart = run_fused(specs, NAMES[:2])
    assert "2 members do not fit together" in caplog.text and "trained as fits of 1 and 1" in caplog.text
    for a, b in zip(apart, [run_trial(spec) for spec in specs]):
        assert not same(a, b) and a["fused_members"] == 1, same(a, b)
    none = run_fused([with_settings(spec, memory_gb_per_trial=0.5 * need[0] / GB) for spec in specs], NAMES[:2])
    assert [r["status"] for r in none] == ["failed", "failed"]
    assert all(r["reason"].startswith("does not fit: needs ") for r in none)
