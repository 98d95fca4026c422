"""Fused models (``models.fused``): K members of one shape as one model equal the K models run apart, forward and
gradients, for every architecture; no gradient crosses members; members of different shapes are refused."""

import copy

import pytest
import torch

import models
from models.fused import Fused, FusionError
from tests.helpers.fused import LENGTH as T
from tests.helpers.fused import VOCAB as V
from tests.helpers.fused import members
from tests.helpers.training import needs_cpu_bf16

ARCHS = sorted(models.ARCHITECTURES)
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5}  # relative to the largest magnitude compared
K, B = 3, 2


def close(a: torch.Tensor, b: torch.Tensor, dtype) -> bool:
    return float((a - b).abs().max()) <= TOLERANCE[dtype] * float(b.abs().max())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("arch", ARCHS)
def test_fused_forward_and_gradients_equal_the_members_apart(arch, dtype):
    """Logits and every parameter's gradient under a random upstream gradient, member by member; the members train
    (every parameter reached) and read one batch (B, T), then one batch each (K, B, T), then one batch's logits at
    two positions a row (``at``, a classification's answer)."""
    apart = members(arch, dtype)
    fused = Fused(copy.deepcopy(apart)).train()
    torch.manual_seed(10)
    at = torch.tensor([[T - 2, T - 1], [3, 4]])  # (B, 2)
    for tokens, where in ((torch.randint(0, V, (B, T)), None), (torch.randint(0, V, (K, B, T)), None),
                          (torch.randint(0, V, (B, T)), at)):  # fmt: skip
        R = T if where is None else where.shape[1]
        upstream = torch.randn(K, B, R, V, dtype=dtype)
        logits = fused(tokens, at=where)
        assert logits.shape == (K, B, R, V) and logits.dtype == dtype
        (logits * upstream).sum().backward()
        params = dict(fused.stacked()[0])
        for k, model in enumerate(apart):
            model.train().zero_grad()
            alone = model(tokens[k] if tokens.dim() == 3 else tokens, at=where)
            assert close(logits[k].detach(), alone.detach(), dtype), (arch, k)
            (alone * upstream[k]).sum().backward()
            for name, p in model.named_parameters():
                assert p.grad is not None, name
                assert close(params[name].grad[k], p.grad, dtype), (arch, k, name)
        fused.zero_grad()


@pytest.mark.parametrize("arch", ARCHS)
def test_fused_under_bf16_autocast_equals_the_members_apart_under_it(arch):
    """The profiles' bf16-mixed precision: each member's logits within bf16's rounding of its own under autocast."""
    needs_cpu_bf16(arch)
    apart = members(arch, torch.float32)
    fused = Fused(copy.deepcopy(apart)).eval()
    tokens = torch.randint(0, V, (B, T))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = fused(tokens)
        for k, model in enumerate(apart):
            alone = model.eval()(tokens)
            assert float((logits[k] - alone).abs().max()) <= 2e-2 * float(alone.abs().max()), (arch, k)


@pytest.mark.parametrize("arch", ARCHS)
def test_fused_greedy_decodes_what_each_member_decodes_with_its_cache(arch):
    """Batched greedy decoding (no cache, the prefix recomputed a token) gives each member's own cached decode, for
    every member or a subset (a validation skips frozen ones): rows that stop within the batched tokens, rows that go
    on (those members decode alone, padded with -1), and every token batched."""
    apart = [m.eval() for m in members(arch)]
    fused = Fused(copy.deepcopy(apart)).eval()
    torch.manual_seed(3)
    prompts = torch.randint(0, V, (B, T - 6))
    own = [m.greedy(prompts, 0) for m in apart]
    # a stop token the members often produce first: some rows stop at once, some go on
    stop = int(torch.cat([o[:, T - 6] for o in own]).mode().values)
    own = [m.greedy(prompts, stop) for m in apart]
    for subset in (None, [0, 2]):
        for batched in (2, T):
            out = fused.greedy(prompts, stop, subset, batched=batched)
            chosen = range(K) if subset is None else subset
            assert out.shape[:2] == (len(chosen), B), (subset, batched)
            for row, k in zip(out, chosen, strict=True):
                kept = row[:, : own[k].shape[1]]
                assert torch.equal(kept, own[k]), (arch, k, subset, batched)
                assert (row[:, own[k].shape[1] :] == -1).all()


@pytest.mark.parametrize("arch", ARCHS)
def test_no_gradient_crosses_members(arch):
    """A loss on member 1 alone: every other member's slice of every gradient is exactly zero, member 1's is not."""
    fused = Fused(members(arch))
    fused(torch.randint(0, V, (B, T)))[1].pow(2).sum().backward()
    reached = 0
    for name, p in fused.stacked()[0].items():
        assert p.grad[0].abs().max() == 0 and p.grad[2].abs().max() == 0, name
        reached += bool(p.grad[1].abs().max() > 0)
    assert reached == len(fused.param_names)


def test_a_non_finite_member_stays_its_own():
    """Member 0's weights not finite (a diverged member, frozen): the others' logits and gradients are unchanged."""
    apart = members("mamba")
    fused = Fused(apart)
    tokens = torch.randint(0, V, (B, T))
    before = fused(tokens).detach()
    with torch.no_grad():
        fused.stacked()[0]["embed.weight"][0] = float("nan")
    logits = fused(tokens)
    logits[1:].sum().backward()
    assert logits[0].isnan().all() and torch.equal(logits[1:].detach(), before[1:])
    assert all(p.grad[1:].isfinite().all() for p in fused.stacked()[0].values())


def test_members_out_and_back_are_the_same_models():
    apart = members("retnet", torch.float32)
    fused = Fused(apart)
    tokens = torch.randint(0, V, (B, T))
    for k in range(K):
        out = fused.member(k).eval()
        assert type(out) is type(apart[k]) and torch.equal(out(tokens), apart[k].eval()(tokens))
    fused.load_member(0, apart[2])
    assert torch.equal(fused.eval()(tokens)[0], fused(tokens)[2])
    assert fused.member(0).greedy(tokens[:, :5], stop=0).shape[0] == B  # decodes with its own cache


def test_dropout_draws_each_members_masks_apart():
    fused = Fused(members("transformer", k=1) * 2).train()  # two identical members
    fused.template.drop.p = 0.5  # the embedding's dropout
    tokens = torch.randint(0, V, (B, T))
    logits = fused(tokens)
    assert not torch.equal(logits[0], logits[1])
    logits = fused.eval()(tokens)  # the weightless template is put in eval mode too
    assert torch.equal(logits[0], logits[1])
    fused.training = True  # as Lightning puts a module's mode back after a validation: by attribute, not train()
    logits = fused(tokens)
    assert not torch.equal(logits[0], logits[1])  # dropout is on again (it once stayed off for the rest of a fit)


@pytest.mark.parametrize("other, match", [
    (dict(width=32), "different shapes cannot be fused: transformer.s pos is .*16.* in member 0, .*32.* in member 1"),
    (dict(depth=1), "different shapes.*blocks.1"),
    (dict(max_len=T + 1), "different architectures"),
])  # fmt: skip
def test_members_of_different_shapes_are_refused(other, match):
    with pytest.raises(FusionError, match=match):
        Fused(members("transformer", k=1) + members("transformer", k=1, **other))
    with pytest.raises(FusionError, match="different architectures"):
        Fused(members("transformer", k=1) + members("standard", k=1))
    with pytest.raises(FusionError, match="at least one"):
        Fused([])


def test_what_runs_member_by_member_is_said(caplog):
    assert "nn.LSTM has no vmap batching rule" in Fused(members("lstm")).notes(torch.device("cpu"))[0]
    cpu = Fused(members("standard")).notes(torch.device("cpu"))
    assert len(cpu) == 1 and "attention runs member by member" in cpu[0]
    assert Fused(members("standard")).notes(torch.device("cuda")) == []
    assert Fused(members("mamba")).notes(torch.device("cpu")) == []
    lstm = Fused(members("lstm"))
    for _ in range(2):
        lstm(torch.randint(0, V, (B, T)))
    said = [r for r in caplog.records if r.name == "models.fused"]
    assert len(said) == 1 and said[0].levelname == "WARNING" and "run one after another" in said[0].getMessage()
