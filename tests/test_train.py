import dataclasses
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch

import models
import tasks
from pipeline.data.datasets import META_KEY, dataset_path, read_dataset
from pipeline.training.batches import IGNORE, Collate, LengthBuckets, collate, collate_reference, loader
from pipeline.training.evaluation import final_answers, greedy_accuracies, greedy_accuracy
from pipeline.training.metrics import CELL_METRICS, TRIAL_METRICS
from pipeline.training.settings import TrainSettings
from pipeline.training.train import SequenceModel, TrialSpec, run_trial
from tests.helpers import dataset_fields, make_cell, write_params
from tests.helpers.training import with_settings

EOS = tasks.EOS_ID


def test_final_answer_is_the_token_before_the_first_eos():
    out = torch.tensor([[5, 6, 7, 8, EOS, 9, EOS],   # prompt of 2, answer 8
                        [5, 6, 8, EOS, 3, 3, 3],     # answer 8
                        [5, 6, 7, 7, 7, 7, 7],       # never ends: wrong
                        [5, 6, EOS, 1, 1, 1, 1]])    # <eos> right after the prompt: the prompt's last token
    assert final_answers(out, 2).tolist() == [8, 8, -1, 6]


def test_collate_trains_only_after_the_prompt(tiny_data):
    data = read_dataset(dataset_path(tiny_data, "lis", 3, "train"))
    inputs, targets, share, lengths, at = Collate(data)([0, 1])
    assert share == 1 and at is None  # one worker takes the whole batch; lis predicts a whole chain of thought
    assert lengths.tolist() == [len(data.sequence(i)) - 1 for i in (0, 1)] == (inputs != tasks.PAD_ID).sum(1).tolist()
    seq, p = data.sequence(0).astype(np.int64), int(data.prompt_len[0])
    assert torch.equal(inputs[0, :len(seq) - 1], torch.from_numpy(seq[:-1]))
    assert (targets[0, :p - 1] == IGNORE).all()
    assert torch.equal(targets[0, p - 1:len(seq) - 1], torch.from_numpy(seq[p:]))


@pytest.mark.parametrize("task", ["lis", "arithmetic"])
def test_the_vectorised_collate_equals_the_sample_by_sample_one(tiny_data, task):
    """Every batch of a real epoch (length buckets, and shuffled batches of mixed lengths, the last sample of the
    file among them): the same inputs and targets as the loop over samples."""
    size = {"lis": 3, "arithmetic": 2}[task]
    data = read_dataset(dataset_path(tiny_data, task, size, "train"))
    rng = np.random.default_rng(0)
    batches = [np.asarray(b) for b in LengthBuckets(data.lengths, 16, seed=0)]
    batches += [rng.choice(len(data), size=7, replace=False) for _ in range(20)] + [np.array([len(data) - 1, 0])]
    for rows in batches:
        fast, plain = collate(data, rows), collate_reference(data, rows)
        assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(fast, plain)), rows


def test_length_buckets_cover_every_sample_once_per_epoch():
    lengths = np.random.default_rng(0).integers(5, 50, size=1000)
    sampler = LengthBuckets(lengths, 64, seed=1)
    for _ in range(2):
        batches = list(sampler)
        assert sorted(i for b in batches for i in b) == list(range(1000))
        spread = np.mean([np.ptp(lengths[b]) for b in batches])
        assert spread < 0.5 * np.ptp(lengths)  # batches group similar lengths


class Oracle(models.LanguageModel):
    """Predicts each test sequence's next token by looking it up: greedy accuracy must be exactly 1."""

    def __init__(self, data, vocab):
        super().__init__()
        self.seqs = {tuple(data.sequence(i)[:int(data.prompt_len[i])]): data.sequence(i) for i in range(len(data))}
        self.vocab, self.max_len = vocab, 64

    def new_cache(self, batch):
        return models.Cache(1, batch, self.max_len)

    def forward(self, tokens, cache, at=None):
        if cache.pos == 0:
            cache.rows = [self.seqs[tuple(r.tolist())] for r in tokens]
        cache.pos += tokens.shape[1]
        logits = torch.zeros(len(tokens), tokens.shape[1], self.vocab)
        for r, seq in enumerate(cache.rows):
            logits[r, -1, seq[cache.pos]] = 1
        return logits if at is None else logits.gather(1, at[..., None].expand(-1, -1, self.vocab))


def test_greedy_accuracy_is_one_for_an_oracle_and_counts_wrong_answers(tiny_data):
    data = read_dataset(dataset_path(tiny_data, "arithmetic", 2, "test"))
    vocab = len(data.meta["vocab"])
    assert greedy_accuracy(Oracle(data, vocab), data, batch_size=7) == 1.0
    data.answer = data.answer.copy()
    data.answer[:10] = (data.answer[:10] + 1) % vocab  # ten answers no decoding can match
    assert greedy_accuracy(Oracle(data, vocab), data, batch_size=7) == pytest.approx(1 - 10 / len(data))



def test_greedy_accuracies_score_each_of_several_models_decoded_at_once(tiny_data):
    """(M, B, L) sequences, M models decoded in one pass (``Fused.greedy``), give one accuracy each."""
    data = read_dataset(dataset_path(tiny_data, "arithmetic", 2, "test"))
    oracle = Oracle(data, len(data.meta["vocab"]))

    def decode(prompts, stop):  # the oracle, and a model that never stops (no answer)
        right = oracle.greedy(prompts, stop)
        return torch.stack([right, torch.full_like(right, -1)])

    assert greedy_accuracies(decode, data, batch_size=7, device="cpu").tolist() == [1.0, 0.0]

@pytest.mark.parametrize("arch", sorted(models.ARCHITECTURES))
@pytest.mark.parametrize("task", ["arithmetic", "lis"])
def test_every_architecture_trains_on_every_task_and_decodes(tiny_cfg, tiny_data, arch, task):
    size = tiny_cfg.generate.datasets[task][0]
    s = tiny_cfg.sweep
    cell = make_cell(task, size, arch, 16, 1, 0, **dataset_fields(tiny_data, task, size))
    settings = TrainSettings().replaced(heads=s.model.heads, dropout=0.1, batch_size=32, epochs=1, max_steps=6,
                                        weight_decay=0.01, warmup_fraction=0.1, grad_clip=1.0, precision="32-true",
                                        val_samples=16, val_every_steps=3, eval_samples=20, eval_batch_size=8,
                                        threads=1, use_gpu=False, max_budget_factor=1)
    spec = TrialSpec(cell=cell, settings=settings, lr=3e-3)
    result = run_trial(spec)
    assert result["train_steps"] == 6 and result["eval_samples"] == 20
    assert set(result) == {"status", "reason", *CELL_METRICS, *TRIAL_METRICS}  # what the tables and MLflow read
    assert 0 <= result["final_accuracy"] <= 1 and 0 <= result["token_accuracy"] <= 1
    assert result["train_pflops"] > 0 and result["paper_gflops"] > 0 and result["params"] > 0
    again = run_trial(dataclasses.replace(spec))
    assert again["final_accuracy"] == result["final_accuracy"]  # seeded: same spec, same answer


def test_a_trial_validates_on_the_validation_file_and_trains_on_the_whole_train_file(tiny_cfg, tiny_data, tmp_path):
    """The verdicts read the validation file (drawn as the test set is), not a tail cut from the train file: the
    same trial with that file's answers made wrong validates at 0, and trains and scores the test set as before."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.helpers.training import short_trial

    size = tiny_cfg.generate.datasets["lis"][0]
    broken = tmp_path / "data"
    shutil.copytree(tiny_data / "lis", broken / "lis")
    val = dataset_path(broken, "lis", size, "val")
    table = pq.read_table(val)
    wrong = pa.array(np.full(len(table), EOS, np.int32))  # the token before <eos> is never <eos>: no answer matches
    fixed = table.set_column(table.schema.get_field_index("answer"), "answer", wrong)
    meta = {META_KEY: pq.read_metadata(val).metadata[META_KEY]}  # the file's own, as the pipeline wrote it
    pq.write_table(fixed.replace_schema_metadata(meta), val)
    # the whole budget whatever validation says, so both trials train the same steps
    settings = {"stop_when_solved": False, "convergence_min_steps": 10**6, "epochs": 1, "max_steps": 100}
    right, bad = (short_trial(tiny_cfg, data, **settings) for data in (tiny_data, broken))
    assert bad["val_accuracy"] == 0 < right["val_accuracy"]
    assert bad["final_accuracy"] == right["final_accuracy"] and bad["train_steps"] == right["train_steps"]
    train = read_dataset(dataset_path(tiny_data, "lis", size, "train"))
    batch = tiny_cfg.sweep.optim.batch_size
    assert right["train_steps"] == len(loader(train, batch, 0, shuffle=True))  # one epoch, every sample


@pytest.fixture(scope="module")
def separations_data(tiny_cfg, tmp_path_factory):
    from pipeline.generate import generate_task

    out = tmp_path_factory.mktemp("separations")
    cfg = tiny_cfg.model_copy(deep=True)
    cfg.generate.datasets = {"index_lookup": [20], "eq_ncp": [20]}
    for task in cfg.generate.datasets:
        generate_task(cfg, task, out, check=True)
    return out


def test_next_character_targets_follow_the_separator():
    from pipeline.training.train import NextCharacterTargets

    vocab = ("<pad>", "<eos>", "[sep]", "a", "b")
    ncp = NextCharacterTargets(vocab)
    seq = torch.tensor([[3, 4, 2, 3, 4, 1]])  # a b [sep] a b <eos>
    got = ncp.targets(seq[:, :-1], seq[:, 1:])[0].bool().tolist()
    free, only = [False, False, True, True, True], lambda i: [j == i for j in range(5)]
    assert got == [free, free, only(3), only(4), only(1)]  # after 'a': any; after 'b': any (incl. [sep]); then copies


@pytest.mark.parametrize("arch", ["transformer", "lstm"])
def test_a_classification_trains_on_its_answers_logits_alone_with_the_whole_forwards_loss_and_gradients(
    separations_data, arch
):
    """Index lookup's rows each predict their label and <eos>: the batch says where (``Batch.at``, rows of different
    lengths), the forward computes those logits only, and the loss and every gradient are the whole forward's."""
    cell = make_cell("index_lookup", 20, arch, 16, 1, 0, **dataset_fields(separations_data, "index_lookup", 20))
    spec = TrialSpec(cell=cell, settings=TrainSettings().replaced(dropout=0.0, batch_size=16), lr=1e-3)
    module = SequenceModel(spec)
    data = read_dataset(Path(cell.train_path))
    batch = next(iter(loader(data, 16, 0, shuffle=True)))
    assert batch.at is not None and batch.at.shape == (16, 2) and len(set(batch.lengths)) > 1
    assert (batch.targets.gather(1, batch.at) != IGNORE).all() and (batch.targets != IGNORE).sum() == 32
    results = []
    for b in (batch, batch._replace(at=None)):
        module.zero_grad()
        loss = module.training_loss(b)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in module.parameters()]))
    (loss, grads), (whole, whole_grads) = results
    torch.testing.assert_close(loss, whole)
    for g, g_whole in zip(grads, whole_grads, strict=True):
        torch.testing.assert_close(g, g_whole, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("task, size", [("index_lookup", 20), ("eq_ncp", 20)])  # classify, ncp
@pytest.mark.parametrize("arch", sorted(models.ARCHITECTURES))
def test_separations_families_train_and_score(separations_data, task, size, arch):
    cell = make_cell(task, size, arch, 16, 1, 0, **dataset_fields(separations_data, task, size))
    settings = TrainSettings().replaced(heads=2, dropout=0.0, batch_size=16, epochs=1, max_steps=4,
                                        weight_decay=0.01, warmup_fraction=0.1, grad_clip=1.0, precision="32-true",
                                        val_samples=16, val_every_steps=2, eval_samples=16, eval_batch_size=8,
                                        threads=1, use_gpu=False, max_budget_factor=1)
    spec = TrialSpec(cell=cell, settings=settings, lr=3e-3)
    result = run_trial(spec)
    assert 0 <= result["final_accuracy"] <= 1 and result["train_steps"] == 4


def test_micro_batches_add_up_to_the_whole_batch_gradient(spec):
    """A batch in 3 micro-batches (each loss weighted by its share, divided by 3 as Lightning's accumulation does)
    gives the gradient of the batch in one pass: the same pieces of the same batches, every sample once."""
    data = read_dataset(Path(spec.cell.train_path))
    module = SequenceModel(with_settings(spec, dropout=0.0))

    def gradient(batches) -> list[torch.Tensor]:
        module.zero_grad()
        for b in batches:
            (module.training_loss(b) / len(batches)).backward()
        return [p.grad.clone() for p in module.parameters()]

    whole, parts = loader(data, 12, 0, shuffle=True), loader(data, 12, 0, shuffle=True, parts=3)
    assert len(parts) == 3 * len(whole)
    pieces = iter(parts)
    for batch in list(whole)[:4]:
        mine = [next(pieces) for _ in range(3)]
        assert sum(len(p.inputs) for p in mine) == len(batch.inputs) and {len(p.inputs) for p in mine} == {4}
        for g, g_parts in zip(gradient([batch]), gradient(mine)):
            torch.testing.assert_close(g_parts, g, rtol=1e-5, atol=1e-7)


def test_a_micro_batched_trial_steps_and_validates_as_one_pass(spec):
    """``sweep.resources.micro_batches``: the same optimiser steps and validations, and the same FLOPs trained."""
    class Validations(L.Callback):
        def __init__(self):
            self.steps: list[int] = []

        def on_validation_end(self, trainer, module):
            self.steps.append(trainer.global_step)

    seen = Validations(), Validations()
    one = run_trial(with_settings(spec, max_steps=10, val_every_steps=5), callbacks=[seen[0]])
    two = run_trial(with_settings(spec, max_steps=10, val_every_steps=5, micro_batches=2), callbacks=[seen[1]])
    assert one["train_steps"] == two["train_steps"] == 10 and seen[0].steps == seen[1].steps == [5, 10]
    assert one["train_pflops"] == two["train_pflops"]  # the same samples in the same steps


def test_loader_processes_build_the_same_batches_and_train_the_same_trial(spec, tiny_data):
    """``sweep.resources.loader_workers``: batches built in other processes, ahead of the steps, are the same batches in
    the same order (a resumed sampler's position included), so the trial trains to the same numbers."""
    data = read_dataset(dataset_path(tiny_data, "lis", 3, "train"))
    here, there = loader(data, 8, 3, shuffle=True, parts=2), loader(data, 8, 3, shuffle=True, parts=2, processes=2)
    for sampler in (here.batch_sampler, there.batch_sampler):
        sampler.resume(epoch=1, batches_done=5)
    for epoch in range(2):
        pairs = list(zip(here, there, strict=True))
        assert len(pairs) == len(here) - 5 * (epoch == 0)
        assert all(all(np.array_equal(a, b) for a, b in zip(x, y)) for x, y in pairs)
    same = ("final_accuracy", "val_accuracy", "token_accuracy", "train_pflops", "train_steps", "solve_step")
    one = run_trial(with_settings(spec, max_steps=6))
    two = run_trial(with_settings(spec, max_steps=6, loader_workers=1))
    assert [one[k] for k in same] == [two[k] for k in same]


@pytest.mark.integration
def test_a_sweeps_trial_trains_with_its_batches_built_in_a_loader_process(tmp_path, tiny_data):
    """Ray Tune, Lightning and MLflow: a trial's loader process, forked inside its Ray worker, feeds every step."""
    import pandas as pd

    from pipeline.common.config import load_config
    from pipeline.scheduling.driver import sweep

    store, db = tmp_path / "store", tmp_path / "mlflow.db"
    p = write_params(tmp_path / "params.yaml", f"""
profile: tiny
tasks: [arithmetic, lis]
sweep: {{grid: {{architectures: [standard], widths: [8], datasets: {{lis: [3]}}}}, resources: {{loader_workers: 1}}}}
cluster: {{mlflow_tracking_uri: "sqlite:///{db}", storage_path: "{store}"}}
""")
    cfg = load_config(p)
    sweep(cfg, tiny_data, tmp_path / "results")
    trials = pd.read_csv(tmp_path / "results" / "trials.csv")
    assert len(trials) == 1 and trials.status[0] != "failed", trials.reason[0]
    assert trials.train_steps[0] >= cfg.sweep.optim.max_steps  # its first budget at least (then extended, improving)
