import pytest
import torch

import models
from models.attention import blockwise_attention
from models.dss import ssm_kernel, ssm_kernel_reference
from models.linear import chunked_scan, scan_reference
from models.selective_scan import (
    CHECKPOINT,
    SCAN_CHUNK,
    selective_scan,
    selective_scan_parallel,
    selective_scan_reference,
)
from models.sinks import Sinks
from models.sliding_window import Window
from models.sparse import BlockSparse, block_size
from models.standard import Causal
from tasks import EOS_ID

ARCHS = sorted(models.ARCHITECTURES)


def tiny(arch: str, **kw):
    torch.manual_seed(0)
    args = dict(vocab_size=23, width=32, depth=2, heads=4, max_len=48, dropout=0.0) | kw
    return models.build_model(arch, **args).eval()


def test_sparse_mask_is_the_spec_definition_element_by_element():
    for length, block, k in [(40, 8, 1), (70, 8, 2), (64, 4, 1)]:
        pos = torch.arange(length)
        mask = BlockSparse(block, k).mask(pos, pos)
        for i in range(length):
            for j in range(length):
                spec = j <= i and (i - j < k * block or j % block == block - 1)
                assert bool(mask[i, j]) == spec, (length, block, k, i, j)
        assert BlockSparse(block, k).pairs(length) == int(mask.sum())


def test_sparse_block_size_from_the_dataset_length():
    assert [block_size(L) for L in (72, 83, 87, 210, 221, 223, 342, 355, 503, 506)] == [8] * 6 + [16] * 4


@pytest.mark.parametrize("depth, width, vocab, length", [(3, 32, 20, 85), (5, 256, 60, 506), (3, 1024, 553, 503)])
def test_paper_flops_of_standard_equal_the_closed_form(depth, width, vocab, length):
    model = models.build_model("standard", vocab_size=vocab, width=width, depth=depth, heads=4, max_len=length)
    closed = 2 * (length + 2) * (12 * depth * width**2 + width * vocab + 4 * (2 * depth + 2) * width)
    assert model.paper_flops(length) == closed


def test_exact_flops_count_the_pattern_pairs():
    L, D = 40, 32
    std, sp = tiny("standard", width=D), tiny("sparse", width=D, block=4)
    linear_part = 2 * L * sum(m.in_features * m.out_features for m in std.modules() if isinstance(m, torch.nn.Linear))
    assert std.exact_flops(L) == linear_part + 2 * 4 * D * L * (L + 1) // 2
    assert sp.exact_flops(L) == linear_part + 2 * 4 * D * BlockSparse(4, 1).pairs(L)
    assert sp.exact_flops(L) < std.exact_flops(L)


@pytest.mark.parametrize("arch", ARCHS)
def test_cached_logits_equal_full_forward_at_every_position(arch):
    model = tiny(arch)
    x = torch.randint(0, 23, (3, 40))
    full = model(x)
    cache = model.new_cache(3)
    steps = [model(x[:, :9], cache)] + [model(x[:, t:t + 1], cache) for t in range(9, 40)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_at_a_few_positions_equal_the_full_forwards_there_with_their_gradients(arch):
    """``at``: two positions a row, other in each row (padded classifications' answers): the logits and every
    parameter's gradient equal those of the whole forward gathered there."""
    model = tiny(arch).train()  # dropout 0: train mode changes nothing else
    x = torch.randint(0, 23, (3, 40))
    at = torch.tensor([[38, 39], [20, 21], [0, 5]])
    part = model(x, at=at)
    full = model(x).gather(1, at[..., None].expand(-1, -1, 23))
    torch.testing.assert_close(part, full, rtol=1e-5, atol=1e-5)
    upstream = torch.randn_like(full)
    params = list(model.parameters())
    for a, b in zip(torch.autograd.grad((part * upstream).sum(), params),
                    torch.autograd.grad((full * upstream).sum(), params), strict=True):  # fmt: skip
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("arch", ARCHS)
def test_a_prefill_at_its_last_position_caches_every_position_and_decoding_goes_on_as_from_a_full_one(arch):
    """Greedy decoding's prefill asks for the last prompt position's logits only (``at`` with a cache): they are the
    whole forward's there, and the one-token steps after it are the whole forward's too."""
    model = tiny(arch)
    x = torch.randint(0, 23, (3, 20))
    full = model(x)
    cache = model.new_cache(3)
    first = model(x[:, :9], cache, at=torch.full((3, 1), 8))
    steps = [first] + [model(x[:, t:t + 1], cache) for t in range(9, 20)]
    torch.testing.assert_close(torch.cat(steps, 1), full[:, 8:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch, options, kept", [("sliding_window", {"window": 5}, 4),
                                                  ("sinks", {"window": 5, "sinks": 2}, 6),
                                                  ("sparse", {"block": 4}, 3 + 40 // 4 - 1)])
def test_limited_patterns_drop_what_no_later_token_can_attend(arch, options, kept):
    model = tiny(arch, **options)
    x = torch.randint(0, 23, (2, 40))
    cache = model.new_cache(2)
    steps = [model(x[:, :7], cache)] + [model(x[:, t:t + 1], cache) for t in range(7, 40)]
    torch.testing.assert_close(torch.cat(steps, 1), model(x), rtol=1e-5, atol=1e-5)
    assert cache.layers[0]["k"].shape[2] == kept == model.blocks[0].mixer.pattern.attended(40)
    assert model.state_size(40) == model.depth * 2 * kept * model.width * 4


@pytest.mark.parametrize("arch", ARCHS)
def test_cached_greedy_decoding_equals_recomputing_the_prefix(arch):
    model = tiny(arch)
    prompts = torch.randint(2, 23, (4, 6))
    out = model.greedy(prompts, EOS_ID)
    seq = prompts
    with torch.no_grad():
        while seq.shape[1] < out.shape[1]:
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, seq)


def test_linear_attention_chunking_does_not_change_the_result():
    x = torch.randint(0, 23, (2, 45))
    torch.testing.assert_close(tiny("linear", chunk=4)(x), tiny("linear", chunk=64)(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_architecture_trains_and_reports_its_sizes(arch):
    model = tiny(arch).train()
    x = torch.randint(0, 23, (4, 30))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(40):
        loss = torch.nn.functional.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]  # memorises a fixed batch
    assert model.num_params() == sum(p.numel() for p in model.parameters()) > 0
    assert 0 < model.state_size(40) and 0 < model.exact_flops(40) and 0 < model.paper_flops(40)


def test_state_size_grows_with_length_only_where_the_pattern_says():
    std, sp, lin = tiny("standard"), tiny("sparse", block=8), tiny("linear")
    assert std.state_size(400) == 10 * std.state_size(40) > std.state_size(39)
    assert lin.state_size(400) == lin.state_size(40)
    assert sp.state_size(400) < std.state_size(400)
    assert Causal().attended(9) == 9 and BlockSparse(4, 1).attended(9) == 4  # window 6..8, summary 3 (7 is both)


@pytest.mark.parametrize("kwargs, match", [
    (dict(name="nope"), "unknown architecture 'nope'; registered: " + ", ".join(sorted(models.ARCHITECTURES))),
    (dict(name="standard", width=30), "width 30 is not divisible by heads 4"),
    (dict(name="standard", block=4), "unknown option"),
])
def test_bad_architecture_arguments_name_the_problem(kwargs, match):
    args = dict(vocab_size=10, width=32, depth=1, heads=4, max_len=8) | kwargs
    with pytest.raises(models.ArchitectureError, match=match):
        models.build_model(args.pop("name"), **args)


def counted(model, length: int, custom=None) -> dict[str, int]:
    """FlopCounterMode's counts per aten op for one forward pass over ``length`` tokens."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False, custom_mapping=custom or {}) as counter, torch.no_grad():
        model(torch.randint(0, model.vocab_size, (1, length)))
    return {str(op).removeprefix("aten."): n for op, n in counter.get_flop_counts()["Global"].items()}


@pytest.mark.parametrize("arch", ARCHS)
def test_flop_counter_sees_exactly_our_linear_part(arch):
    """Every matmul FlopCounterMode sees as mm/addmm is one of our nn.Linear layers, counted as we count them.

    Its blind spots in torch 2.13 on CPU, which our exact count covers by formula: scaled_dot_product_attention
    (counted 0), the mkldnn nn.LSTM kernel (0), the scans of mamba/dss (elementwise ops), FFTs, cumsum."""
    model, L = tiny(arch), 40
    linear = 2 * L * sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear))
    ops = counted(model, L)
    assert ops.get("mm", 0) + ops.get("addmm", 0) == linear
    assert model.exact_flops(L) > linear  # mixing (or LSTM gates) on top
    if arch == "mamba":  # the depthwise convolution is visible, and equals our conv term
        mixer = model.blocks[0].mixer
        assert ops["convolution"] == model.depth * 2 * L * mixer.E * mixer.k


def test_flop_counter_with_an_attention_mapping_confirms_the_causal_count():
    """Map the CPU attention kernel to its dense cost 4 B H T S hd: causal attention's useful pairs are
    L(L+1)/2 of the L^2 the kernel executes."""
    def dense_attention(q, k, v, *args, **kwargs):
        B, H, T, hd = q
        return 4 * B * H * T * k[2] * hd

    ops_cpu = [torch.ops.aten._scaled_dot_product_flash_attention_for_cpu]
    model, L = tiny("standard"), 40
    ops = counted(model, L, {op: dense_attention for op in ops_cpu})
    executed = sum(n for op, n in ops.items() if "attention" in op)
    assert executed == model.depth * 4 * L * L * model.width
    linear = ops["addmm"]
    assert model.exact_flops(L) - linear == executed * (L + 1) // (2 * L)


def test_selective_scan_kernel_matches_the_loop_forward_and_gradients():
    """The fused kernel against the per-token loop run in float64; T spans several checkpoint chunks."""
    torch.manual_seed(0)
    B, T, E, N = 2, 2 * CHECKPOINT + 7, 5, 4
    inputs = [torch.rand(B, T, E) * 0.5 + 0.01, torch.randn(B, T, E), -torch.rand(E, N) * 8,
              torch.randn(B, T, N), torch.randn(B, T, N), torch.randn(B, E, N)]  # dt, x, A, B, C, h0
    ours = [t.clone().requires_grad_() for t in inputs]
    ref = [t.double().requires_grad_() for t in inputs]
    y, h = selective_scan(*ours)
    y_ref, h_ref = selective_scan_reference(*ref)
    torch.testing.assert_close(y, y_ref.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h, h_ref.float(), rtol=1e-5, atol=1e-5)
    gy, gh = torch.randn_like(y), torch.randn_like(h)
    grads = torch.autograd.grad((y * gy).sum() + (h * gh).sum(), ours)
    grads_ref = torch.autograd.grad((y_ref * gy.double()).sum() + (h_ref * gh.double()).sum(), ref)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref.float(), rtol=1e-4, atol=1e-4)


def test_the_selective_scan_kernel_carries_a_nan_through_instead_of_crashing():
    """A diverged Mamba's NaN decay rate: the kernel's exp gives NaN (it once indexed its table of powers of two with
    int32(NaN), out of bounds: the worker died of a segfault instead of the trial ending diverged), in that channel
    only, forward and backward."""
    torch.manual_seed(0)
    B, T, E, N = 2, 9, 3, 4
    dt, x, A, Bm, Cm, h0 = [torch.rand(B, T, E) * 0.5 + 0.01, torch.randn(B, T, E), -torch.rand(E, N) * 8,
                            torch.randn(B, T, N), torch.randn(B, T, N), torch.randn(B, E, N)]
    A[1, 2] = float("nan")
    A.requires_grad_()
    y, h = selective_scan(dt, x, A, Bm, Cm, h0)
    assert y[..., 1].isnan().all() and y[..., [0, 2]].isfinite().all() and h[:, 1].isnan().any()
    (y[..., 0].sum()).backward()
    assert A.grad[0].isfinite().all()


def scan_inputs(T: int, dtype=torch.float64, B: int = 2, E: int = 5, N: int = 16):
    """dt, x, A, B, C, h0 at Mamba's scales: dt = softplus(.) around 0.1, A = -(1..N) (its initial values)."""
    torch.manual_seed(0)
    dt = torch.nn.functional.softplus(torch.randn(B, T, E) - 2)
    inputs = [dt, torch.randn(B, T, E), -torch.arange(1.0, N + 1).repeat(E, 1), torch.randn(B, T, N),
              torch.randn(B, T, N), torch.randn(B, E, N)]
    return [t.to(dtype).requires_grad_() for t in inputs]


def outputs_and_grads(scan, inputs, seed: int = 1):
    y, h = scan(*inputs)
    torch.manual_seed(seed)  # the same upstream gradients whatever the dtype
    gy, gh = (torch.randn(t.shape, dtype=torch.float64).to(t.dtype) for t in (y, h))
    return [y, h, *torch.autograd.grad((y * gy).sum() + (h * gh).sum(), inputs)]


@pytest.mark.parametrize("T", [1, 7, SCAN_CHUNK, SCAN_CHUNK + 1, 5 * SCAN_CHUNK - 20])
def test_parallel_selective_scan_matches_the_loop_forward_and_gradients(T):
    """The device-agnostic form against the per-token loop: equal in float64 (the same sums); in float32 within
    what exp(L) keeps over a chunk (docs of SCAN_CHUNK), for y, h_T and every input's gradient."""
    ref = outputs_and_grads(selective_scan_reference, scan_inputs(T))
    for ours, ref_ in zip(outputs_and_grads(selective_scan_parallel, scan_inputs(T)), ref):
        torch.testing.assert_close(ours, ref_, rtol=1e-10, atol=1e-10)
    for ours, ref_ in zip(outputs_and_grads(selective_scan_parallel, scan_inputs(T, torch.float32)), ref):
        assert ours.dtype == torch.float32
        assert (ours.double() - ref_).abs().max() <= 1e-4 * ref_.abs().max()


def test_parallel_selective_scan_keeps_only_its_inputs_for_backward():
    """Activation checkpointing: autograd saves the (B, T, E) and (B, T, N) inputs, never a (B, T, E, N) state."""
    inputs = scan_inputs(3 * SCAN_CHUNK, torch.float32)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        selective_scan_parallel(*inputs)
    (B, T, E), N = inputs[0].shape, inputs[2].shape[1]
    assert saved and max(saved) == B * T * max(E, N) < B * T * E * N


@pytest.mark.parametrize("normalize, gamma", [(True, [1.0, 1.0, 1.0]), (False, [1.0, 1.0, 1.0]),
                                              (False, [1 - 2**-5, 1 - 2**-6, 1 - 2**-7])])
@pytest.mark.parametrize("T, chunk", [(1, 64), (5, 2), (37, 8), (130, 64)])
def test_chunked_scan_matches_the_recurrence_forward_state_and_gradients(normalize, gamma, T, chunk):
    """Every chunk at once (an uneven last chunk included) against one token at a time, from a carried state."""
    torch.manual_seed(0)
    B, H, d = 2, 3, 4
    q, k, v = (torch.randn(B, H, T, d, dtype=torch.float64) for _ in range(3))
    if normalize:  # phi = elu + 1 keeps the denominators positive
        q, k = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    start = {"S": torch.randn(B, H, d, d, dtype=torch.float64)} | (
        {"z": torch.rand(B, H, d, dtype=torch.float64)} if normalize else {})
    g = torch.tensor(gamma, dtype=torch.float64)
    results = []
    for scan in (lambda *a: chunked_scan(*a, chunk=chunk), scan_reference):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        state = dict(start)
        y = scan(*leaves, state, g, normalize)
        results.append([y, *state.values(), *torch.autograd.grad((y * torch.cos(y)).sum(), leaves)])
    for ours, ref in zip(*results):
        torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("arch", ["linear", "retnet", "linear_nofm", "mamba"])
def test_device_agnostic_paths_decode_as_they_train(arch):
    """In float64 a CPU runs the code a GPU runs (Mamba's parallel scan, not the float32 CPU kernel): cached decoding
    a token at a time equals the full forward."""
    model = tiny(arch).double()
    x = torch.randint(0, 23, (3, 40))
    cache = model.new_cache(3)
    steps = [model(x[:, :9], cache)] + [model(x[:, t:t + 1], cache) for t in range(9, 40)]
    torch.testing.assert_close(torch.cat(steps, 1), model(x), rtol=1e-9, atol=1e-9)


def test_dss_kernel_without_pow_matches_the_powers_forward_and_gradients():
    mixer = tiny("dss").blocks[0].mixer
    params = [mixer.log_re, mixer.im, mixer.C, mixer.log_dt]

    def kernel_and_grads(kernel, length, g):
        dtlam, bbar = mixer.discrete()
        K = kernel(dtlam, mixer.C * bbar, length)  # (D, length)
        return K, torch.autograd.grad((K * g).sum(), params)

    for length in (1, 40, 97):
        g = torch.randn(mixer.width, length)
        K, grads = kernel_and_grads(ssm_kernel, length, g)
        K_ref, grads_ref = kernel_and_grads(ssm_kernel_reference, length, g)
        torch.testing.assert_close(K, K_ref, rtol=1e-4, atol=1e-5)
        for a, b in zip(grads, grads_ref):
            torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("pattern", [Window(5), Window(8), Sinks(5, 3), BlockSparse(4, 1), BlockSparse(3, 2)],
                         ids=["window5", "window8", "sinks", "sparse4x1", "sparse3x2"])
@pytest.mark.parametrize("length", [64, 70])
def test_blockwise_kernel_equals_the_dense_masked_reference(pattern, length, monkeypatch):
    """The kernel alone, blocks of max(reach, 8) queries (a multiple of the reach or not; the sequence a multiple
    of the block or not): output and gradients of q, k, v agree with one SDPA call under the dense mask."""
    monkeypatch.setattr(models.attention, "BLOCK_QUERIES", 8)
    monkeypatch.setattr(models.attention, "BLOCKWISE_SAVING", 1)
    torch.manual_seed(0)
    # (B, H, T, hd) views of (B, T, H, hd), as the model passes them: not contiguous
    q, k, v = (torch.randn(2, length, 3, 4).transpose(1, 2).requires_grad_() for _ in range(3))
    g = torch.randn(2, 3, length, 4)
    pos = torch.arange(length)
    outs = [blockwise_attention(q, k, v, *pattern.blocks(length), 0.0),
            torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=pattern.mask(pos, pos))]
    (y, grads), (ref, ref_grads) = ((out, torch.autograd.grad(out, (q, k, v), g)) for out in outs)
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("arch, options", [("sliding_window", {"window": 3}), ("sinks", {"window": 4, "sinks": 3}),
                                           ("sparse", {"block": 4, "k": 2})])
def test_blockwise_local_attention_equals_the_dense_masked_call(arch, options, monkeypatch):
    """Blockwise at L = 61, in blocks of 6 or 8 queries (thresholds lowered so that these tiny patterns qualify):
    forward and gradients agree with the dense masked call; the last block is mostly padding."""
    monkeypatch.setattr(models.attention, "BLOCKWISE_SAVING", 1)
    monkeypatch.setattr(models.attention, "BLOCK_QUERIES", 8)
    model = tiny(arch, max_len=64, **options).train()
    mixers = [b.mixer for b in model.blocks]
    assert mixers[0].pattern.blocks(61) is not None
    x = torch.randint(0, 23, (2, 61))
    results = []
    for blockwise in (True, False):
        for m in mixers:
            m.blockwise = blockwise
        out = model(x)
        results.append((out, torch.autograd.grad(out.square().sum(), list(model.parameters()))))
    (out, grads), (dense, dense_grads) = results
    torch.testing.assert_close(out, dense, rtol=1e-5, atol=1e-5)
    at = torch.tensor([[59, 60], [7, 33]])  # the pattern's mask at a few queries, beside the blockwise forward
    torch.testing.assert_close(model(x, at=at), out.gather(1, at[..., None].expand(-1, -1, 23)), rtol=1e-5, atol=1e-5)
    for g, g_dense in zip(grads, dense_grads):
        torch.testing.assert_close(g, g_dense, rtol=1e-4, atol=1e-5)
