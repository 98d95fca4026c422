"""Less work a step (sweep.resources.step, the FLOP count, the training loss's logging, a shared GPU's memory cap),
tested on the CPU: the graphed step's CPU fallback and its one-shape batches, the compiled step against the eager one,
the fallback when compiling fails, and what a trial records, unchanged."""

from __future__ import annotations

import logging

import lightning as L
import pytest
import torch
import torch.nn.functional as F

import models
from pipeline.data.datasets import dataset_path, read_dataset
from pipeline.training import steps
from pipeline.training.batches import IGNORE, collate
from pipeline.training.memory import GB, DoesNotFit, memory_cap
from pipeline.training.steps import StepForward, effective, pad_to
from pipeline.training.train import SequenceModel, run_trial
from tests.helpers.training import Curve, with_settings

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_the_graphed_step_needs_a_gpu_and_pads_its_batches_to_one_shape():
    assert effective("graphed", CUDA) == ("graphed", "") and effective("compiled", CPU) == ("compiled", "")
    mode, why = effective("graphed", CPU)
    assert mode == "eager" and "graphed needs a GPU (CUDA graphs); on cpu the step runs eager" in why
    assert pad_to("graphed", CUDA, 102) == 102  # every batch the dataset's longest: one graph
    assert pad_to("graphed", CPU, 102) is pad_to("compiled", CUDA, 102) is pad_to("eager", CUDA, 102) is None


@pytest.mark.parametrize("arch", sorted(models.ARCHITECTURES))
def test_a_batch_padded_to_the_datasets_longest_trains_as_the_batch_itself(tiny_data, arch):
    """The models are causal: padding after every sequence changes none of the logits the loss reads, so the loss and
    every gradient are the batch's own (float64, within its rounding; without dropout, whose masks for the padded
    positions would be drawn from the same stream)."""
    data = read_dataset(dataset_path(tiny_data, "lis", 3, "train"))
    rows = torch.arange(8).numpy()
    torch.manual_seed(0)
    model = models.build_model(arch, vocab_size=len(data.meta["vocab"]), width=16, depth=2, heads=2,
                               max_len=int(data.lengths.max()) + 8, dropout=0.0).double()

    def loss_and_grads(pad: int | None):
        inputs, targets = (torch.from_numpy(a) for a in collate(data, rows, pad))
        model.zero_grad()
        loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten(), ignore_index=IGNORE)
        loss.backward()
        return inputs.shape[1], [loss.detach(), *(p.grad.clone() for p in model.parameters())]

    (own, ref), (padded, ours) = loss_and_grads(None), loss_and_grads(int(data.lengths.max()) + 8)
    assert padded == int(data.lengths.max()) + 8 > own
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_a_graphed_trial_on_a_cpu_trains_eager_says_so_and_records_the_same(spec, caplog):
    eager = run_trial(with_settings(spec, max_steps=6))
    with caplog.at_level(logging.WARNING, logger=steps.__name__):
        graphed = run_trial(with_settings(spec, max_steps=6, step="graphed"))
    assert "sweep.resources.step: graphed needs a GPU" in caplog.text
    same = ("final_accuracy", "val_accuracy", "token_accuracy", "train_pflops", "train_steps", "status")
    assert [graphed[k] for k in same] == [eager[k] for k in same]


def test_a_step_that_cannot_compile_trains_eager_and_says_why(monkeypatch, caplog):
    def broken(model, **options):
        def run(tokens):
            raise RuntimeError("no backend here")
        return run

    monkeypatch.setattr(torch, "compile", broken)
    model = models.build_model("standard", vocab_size=12, width=16, depth=1, heads=2, max_len=20, dropout=0.0)
    step = StepForward(model, "compiled", CPU)
    tokens = torch.randint(0, 12, (2, 9))
    with caplog.at_level(logging.WARNING, logger=steps.__name__):
        out = step(tokens)
    assert step.mode == "eager" and "compiled failed (RuntimeError: no backend here); eager" in step.why
    assert step.why in caplog.text
    torch.testing.assert_close(out, model(tokens), rtol=0, atol=0)


@pytest.mark.slow
def test_the_compiled_step_gives_the_eager_steps_logits_and_gradients():
    """torch.compile of the standard model (inductor's CPU code): the same logits and gradients within float32's
    rounding of a different kernel order; it compiles, it does not fall back."""
    torch.manual_seed(0)
    model = models.build_model("standard", vocab_size=12, width=32, depth=2, heads=2, max_len=40, dropout=0.0)
    tokens = torch.randint(0, 12, (4, 33))

    def run(forward):
        model.zero_grad()
        logits = forward(tokens)
        logits.square().mean().backward()
        return [logits.detach(), *(p.grad.clone() for p in model.parameters())]

    eager = run(model)
    step = StepForward(model, "compiled", CPU)
    compiled = run(step)
    assert step.mode == "compiled" and step.why == ""
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_a_shared_gpus_memory_cap_leaves_a_context_to_every_process():
    total = 80 * GB
    assert memory_cap(1.0, total) == 1.0  # a whole GPU: no cap of its own
    cap = memory_cap(1 / 14, total, context=0.6 * GB)
    assert cap == pytest.approx(1 / 14 - 0.6 / 80)
    assert 14 * (cap * total + 0.6 * GB) == pytest.approx(total)  # 14 processes, contexts included, fill it exactly
    with pytest.raises(DoesNotFit, match=r"a share of 0.005 of a GPU of 80 GB is 0.4 GB, no more than the 0.6 GB"):
        memory_cap(0.005, total, context=0.6 * GB)


def test_the_flop_count_and_the_training_loss_are_recorded_as_before(spec):
    """The FLOP count of a batch is the sum over its sequences (counted once a length); the training loss is logged at
    each validation, the last step's, as the curves and the checkpoints read it."""
    module = SequenceModel(spec)
    lengths = torch.tensor([5, 7, 5, 5, 9, 7]).numpy()
    assert module.batch_flops(lengths) == sum(module.model.exact_flops(int(n)) for n in lengths)

    class LastLoss(L.Callback):
        def __init__(self):
            self.losses: dict[int, float] = {}

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self.losses[trainer.global_step] = float(outputs["loss"])

    curve, last = Curve(), LastLoss()
    run_trial(with_settings(spec, max_steps=10, val_every_steps=5), callbacks=[curve, last])
    assert [step for step, _, _ in curve.points] == [5, 10]
    assert [loss for _, loss, _ in curve.points] == [pytest.approx(last.losses[5]), pytest.approx(last.losses[10])]


@pytest.mark.slow  # over 10 s on 2 cores: the fast tier stays a developer's loop
def test_a_step_compiled_in_pieces_counts_its_graph_breaks_and_says_so(caplog):
    """Mamba's numba scan on the CPU is opaque to torch.compile: its forward compiles in pieces, counted and logged
    with the first reason; a transformer's compiles whole."""
    import models
    from pipeline.training.steps import StepForward

    tokens = torch.randint(0, 11, (4, 16))
    counted = {}
    for arch in ("transformer", "mamba"):
        model = models.build_model(arch, vocab_size=11, width=16, depth=1, heads=2, max_len=17, dropout=0.0)
        step = StepForward(model, "compiled", torch.device("cpu"))
        step(tokens).sum().backward()
        counted[arch] = (step.mode, step.graph_breaks)
    assert counted["transformer"] == ("compiled", 0)
    assert counted["mamba"][0] == "compiled" and counted["mamba"][1] > 0
    assert f"compiled in pieces, {counted['mamba'][1]} graph breaks (the first: Skip calling" in caplog.text


@pytest.mark.slow
def test_a_step_past_the_recompile_limit_trains_eager_and_says_so(monkeypatch):
    """torch.compile caches a forward's code once per model and shape, and past its recompile limit runs it eager
    without a word: a step there falls back, named, instead of training eager under a compiled label."""
    monkeypatch.setattr(steps, "RECOMPILE_LIMIT", 1)
    torch._dynamo.reset()  # no earlier test's models in the cache
    tokens = torch.randint(0, 12, (2, 9))
    with torch._dynamo.config.patch(recompile_limit=1):
        forwards = []
        for width in (8, 16):
            model = models.build_model("standard", vocab_size=12, width=width, depth=1, heads=2, max_len=20,
                                       dropout=0.0)  # fmt: skip
            forwards.append(StepForward(model, "compiled", CPU))
            forwards[-1](tokens)
    assert forwards[0].mode == "compiled" and forwards[0].why == ""
    assert forwards[1].mode == "eager"
    assert "compiled failed (FailOnRecompileLimitHit: this process has compiled this forward" in forwards[1].why


def test_a_failure_without_a_message_names_where_it_was_raised():
    def bare():
        raise AssertionError  # what a bare assert in torch's CUDA-graph code raises

    try:
        bare()
    except AssertionError as err:
        assert steps.failure(err) == f"AssertionError: at {__file__}:{bare.__code__.co_firstlineno + 1}"


@pytest.mark.slow
def test_two_models_graphed_in_turn_in_one_process_train_as_eager(monkeypatch):
    """reduce-overhead's step, each one marked as a new step for CUDA-graph trees, with two models taking turns (as
    bench_pack's rounds run them): each trains as its eager twin. On a CPU inductor compiles without the graphs, so
    this checks the marking and the alternation, not the graphs (tests/test_gpu.py does, on CUDA)."""
    monkeypatch.setattr(steps, "effective", lambda step, device: (step, ""))
    tokens = torch.randint(0, 12, (2, 9))
    pairs = []
    for width in (8, 16):
        torch.manual_seed(width)
        model = models.build_model("standard", vocab_size=12, width=width, depth=1, heads=2, max_len=20, dropout=0.0)
        twin = models.build_model("standard", vocab_size=12, width=width, depth=1, heads=2, max_len=20, dropout=0.0)
        twin.load_state_dict(model.state_dict())
        pairs.append((StepForward(model, "graphed", CPU), twin))
    for _ in range(2):
        for graphed, twin in pairs:
            for forward, module in ((graphed, graphed.model), (twin, twin)):
                module.zero_grad()
                forward(tokens).square().mean().backward()
                with torch.no_grad():
                    for p in module.parameters():
                        p -= 0.1 * p.grad
            assert graphed.mode == "graphed", graphed.why
            torch.testing.assert_close(graphed.model(tokens), twin(tokens), rtol=1e-4, atol=1e-5)
