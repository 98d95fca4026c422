"""The Triton kernels against the per-token references, on the CPU under Triton's interpreter.

Triton reads TRITON_INTERPRET when a function is defined (``@triton.jit`` returns an interpreted one under it), not
when a kernel is launched: triton.language's own functions are defined under it by tests/conftest.py, and the kernel
modules here. ``kernels.triton_ready`` reads it at every call, so it is set only while these tests run, and the other
test modules in the same process keep their numba and torch paths. With CUDA, tests/test_gpu.py checks the compiled
kernels and these are skipped (triton.language is then compiled, not interpreted).
"""

from __future__ import annotations

import importlib

import pytest
import torch

from models import kernels
from models.linear import chunked_scan, scan_reference
from models.selective_scan import CHECKPOINT, selective_scan, selective_scan_reference

tl = pytest.importorskip("triton.language")
if torch.cuda.is_available():
    pytest.skip("with CUDA, tests/test_gpu.py checks the compiled kernels", allow_module_level=True)

from triton.runtime import interpreter  # noqa: E402


def interpreted(module: str):
    assert isinstance(tl.sum, interpreter.InterpretedFunction), "see _interpreted_triton in conftest.py"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TRITON_INTERPRET", "1")
        return importlib.import_module(module)


selective_scan_triton = interpreted("models.selective_scan_triton").selective_scan_triton
interpreted("models.linear_triton")  # reached through chunked_scan's dispatch


@pytest.fixture(autouse=True)
def under_the_interpreter(monkeypatch):
    """TRITON_INTERPRET=1 for the dispatch; and the fix of triton-lang/triton#9171, not in Triton 3.6.0: its
    interpreter takes int() of a one-element array for a loop bound, which numpy 2.4 refuses."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    patch = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    monkeypatch.setattr(interpreter, "_patch_lang_tensor", patched)


def mamba_inputs(B: int, T: int, E: int, N: int, dtypes=(torch.float32,) * 6):
    """dt, x, A, B, C, h0 at Mamba's scales: dt = softplus(.) around 0.1, A = -(1..N) times up to 2."""
    torch.manual_seed(0)
    inputs = [torch.nn.functional.softplus(torch.randn(B, T, E) - 2), torch.randn(B, T, E),
              -torch.arange(1.0, N + 1) * (1 + torch.rand(E, 1)), torch.randn(B, T, N), torch.randn(B, T, N),
              torch.randn(B, E, N)]
    return [t.to(dtype).requires_grad_() for t, dtype in zip(inputs, dtypes)]


def outputs_and_grads(scan, inputs):
    y, h = scan(*inputs)
    torch.manual_seed(1)  # the same upstream gradients whatever the dtype
    gy, gh = (torch.randn(t.shape, dtype=torch.float64).to(t.dtype) for t in (y, h))
    return [y, h, *torch.autograd.grad((y * gy).sum() + (h * gh).sum(), inputs)]


@pytest.mark.parametrize("T, E, N", [(37, 5, 4), (2 * CHECKPOINT + 6, 20, 3)])
def test_mamba_kernel_matches_the_loop_forward_state_and_gradients(T, E, N):
    """float32 against the loop in float64: y, h_T and every input's gradient, over several checkpoint chunks (an
    uneven last one), a partial block of channels (E = 20) and N padded to a power of two (N = 3)."""
    inputs = mamba_inputs(2, T, E, N)
    ref = outputs_and_grads(selective_scan_reference, [t.detach().double().requires_grad_() for t in inputs])
    for ours, ref_ in zip(outputs_and_grads(selective_scan_triton, inputs), ref):
        assert ours.dtype == torch.float32 and ours.shape == ref_.shape
        assert (ours.double() - ref_).abs().max() <= 1e-5 * ref_.abs().max()


def test_mamba_kernel_in_bf16_accumulates_in_float32():
    """Autocast's dtypes (bf16 x, B, C and h_0; float32 dt and A): y in x's dtype, h_T in h_0's, each gradient in
    its input's, all within bf16's rounding of the loop run in float64 on the same rounded inputs."""
    bf16, f32 = torch.bfloat16, torch.float32
    inputs = mamba_inputs(2, 37, 5, 4, (f32, bf16, f32, bf16, bf16, bf16))
    ref = outputs_and_grads(selective_scan_reference, [t.detach().double().requires_grad_() for t in inputs])
    dtypes = [inputs[1].dtype, inputs[5].dtype] + [t.dtype for t in inputs]  # y, h_T, then the gradients
    for ours, ref_, dtype in zip(outputs_and_grads(selective_scan_triton, inputs), ref, dtypes):
        assert ours.dtype == dtype
        assert (ours.double() - ref_).abs().max() <= 1e-2 * ref_.abs().max()


def linear_inputs(T: int, dk: int, dv: int, dtype=torch.float32, B: int = 2, H: int = 3):
    """q, k, v, S_0 (normal; q and k through elu + 1, as linear attention's phi)."""
    torch.manual_seed(0)
    q, k = (torch.nn.functional.elu(torch.randn(B, H, T, dk)) + 1 for _ in range(2))
    return [t.to(dtype) for t in (q, k, torch.randn(B, H, T, dv), torch.randn(B, H, dk, dv))]


def scan_outputs_and_grads(scan, q, k, v, S0, gamma, normalize=False):
    """out and the final state (S, then z if normalised), and the gradients of q, k, v and S_0 (and z_0)."""
    leaves = [q, k, v, S0] = [t.detach().clone().requires_grad_() for t in (q, k, v, S0)]
    state = {"S": S0} | ({"z": S0[..., 0].detach().abs().requires_grad_()} if normalize else {})
    leaves += [state["z"]] if normalize else []
    outputs = [scan(q, k, v, state, gamma, normalize), *state.values()]
    torch.manual_seed(1)  # the same upstream gradients whatever the dtype
    loss = sum((t * torch.randn(t.shape, dtype=torch.float64).to(t.dtype)).sum() for t in outputs)
    return [*outputs, *torch.autograd.grad(loss, leaves)]


GAMMAS = {"linear attention": [1.0, 1.0, 1.0], "retention": [1 - 2**-5, 1 - 2**-6, 0.8]}


@pytest.mark.parametrize("gamma", GAMMAS.values(), ids=GAMMAS.keys())
@pytest.mark.parametrize("T, dk, dv", [(1, 4, 4), (37, 4, 8), (70, 20, 70), (37, 256, 256), (45, 200, 24)])
def test_linear_kernel_matches_the_recurrence_forward_state_and_gradients(gamma, T, dk, dv):
    """float32 against one token at a time in float64, from a carried state: out, S_T and the gradients of q, k, v
    and S_0, over an uneven last chunk (T = 37, 70 against BLOCK_T = 32), d padded to 16 and 32, two blocks of
    value columns (dv = 70 against BLOCK_V = 64), and keys in tiles of KEY_TILE = 128: head dim 256 (the DP paper's
    width 1024 over 4 heads; its backward tiles dv = 256 as keys too) and 200 (a partial last tile)."""
    inputs, g = linear_inputs(T, dk, dv), torch.tensor(gamma)
    ref = scan_outputs_and_grads(scan_reference, *(t.double() for t in inputs), g.double())
    ours = scan_outputs_and_grads(lambda *a: chunked_scan(*a, chunk=64), *inputs, g)
    assert type(ours[0].grad_fn).__name__ == "_LinearScanBackward"
    for a, b in zip(ours, ref):
        assert a.dtype == torch.float32 and a.shape == b.shape
        assert (a.double() - b).abs().max() <= 1e-5 * b.abs().max()


def test_normalised_linear_attention_runs_the_kernel_through_normalized():
    inputs, g = linear_inputs(37, 4, 4), torch.ones(3)
    ref = scan_outputs_and_grads(scan_reference, *(t.double() for t in inputs), g.double(), normalize=True)
    ours = scan_outputs_and_grads(lambda *a: chunked_scan(*a, chunk=64), *inputs, g, normalize=True)
    for a, b in zip(ours, ref):
        assert (a.double() - b).abs().max() <= 1e-5 * b.abs().max()


def test_linear_kernel_in_bf16_accumulates_in_float32():
    """out and S_T in the inputs' dtype, within bf16's rounding of the recurrence on the same rounded inputs."""
    inputs, g = linear_inputs(37, 4, 8, torch.bfloat16), torch.tensor(GAMMAS["retention"])
    ref = scan_outputs_and_grads(scan_reference, *(t.double() for t in inputs), g.double())
    for ours, ref_ in zip(scan_outputs_and_grads(lambda *a: chunked_scan(*a, chunk=64), *inputs, g), ref):
        assert ours.dtype == torch.bfloat16
        assert (ours.double() - ref_).abs().max() <= 1e-2 * ref_.abs().max()


class Counted:
    """A Triton kernel (``kernel[grid](...)``) or a function whose calls are counted in ``counts[name]``."""

    def __init__(self, target, counts: dict, name: str):
        self.target, self.counts, self.name = target, counts, name

    def __getitem__(self, grid):
        self.counts[self.name] = self.counts.get(self.name, 0) + 1
        return self.target[grid]

    def __call__(self, *args, **kwargs):
        self.counts[self.name] = self.counts.get(self.name, 0) + 1
        return self.target(*args, **kwargs)


def counted(monkeypatch, module, *names: str) -> dict:
    counts: dict[str, int] = {}
    for name in names:
        monkeypatch.setattr(module, name, Counted(getattr(module, name), counts, name))
    return counts


def vmapped_against_apart(scan, inputs, in_dims, differentiable):
    """``scan`` under torch.func.vmap over K models (``in_dims``: 0, or None for an input every model shares) against
    ``scan`` on each model alone: outputs and the gradients of the ``differentiable`` inputs, within 1e-6 relative
    (the same float32 kernel on the same rows), a shared input's gradient the sum over the models."""
    K = next(t.shape[0] for t, d in zip(inputs, in_dims) if d == 0)
    inputs = [t.detach().requires_grad_(i in differentiable) for i, t in enumerate(inputs)]
    outputs = torch.func.vmap(scan, in_dims=in_dims)(*inputs)
    torch.manual_seed(1)
    upstream = [torch.randn_like(o) for o in outputs]
    wrt = [inputs[i] for i in differentiable]
    grads = torch.autograd.grad(sum((o * u).sum() for o, u in zip(outputs, upstream)), wrt)
    shared = [torch.zeros_like(g) for g in grads]
    for k in range(K):
        alone = [(t[k] if d == 0 else t).detach().requires_grad_(i in differentiable)
                 for i, (t, d) in enumerate(zip(inputs, in_dims))]
        outs = scan(*alone)
        for o, ok in zip(outputs, outs):
            assert (o[k] - ok).abs().max() <= 1e-6 * ok.abs().max()
        alone_grads = torch.autograd.grad(sum((o * u[k]).sum() for o, u in zip(outs, upstream)),
                                          [alone[i] for i in differentiable])
        for j, (i, g, gk) in enumerate(zip(differentiable, grads, alone_grads)):
            if in_dims[i] == 0:
                assert (g[k] - gk).abs().max() <= 1e-6 * gk.abs().max()
            else:
                shared[j] += gk
    for i, g, total in zip(differentiable, grads, shared):
        if in_dims[i] is None:
            assert (g - total).abs().max() <= 1e-6 * total.abs().max()


def test_mamba_kernel_under_vmap_folds_the_models_into_one_launch(monkeypatch):
    """K = 3 models' scans (a fused trial's) under vmap, h_0 shared: one launch of each kernel for all three, and
    each model's outputs and gradients those of the kernel on that model alone."""
    models = [mamba_inputs(2, 37, 5, 3) for _ in range(3)]  # the same seed: made to differ below
    inputs = [torch.stack([t.detach() * (1 + 0.1 * k) for k, t in enumerate(ts)]) for ts in zip(*models)]
    inputs[5] = inputs[5][0]  # h_0: one for every model
    module = importlib.import_module("models.selective_scan_triton")
    launches = counted(monkeypatch, module, "_forward", "_backward")
    vmapped_against_apart(selective_scan_triton, inputs, (0, 0, 0, 0, 0, None), range(6))
    assert launches == {"_forward": 1 + 3, "_backward": 1 + 3}  # fused once, then each model alone


@pytest.mark.parametrize("gamma_dim", [None, 0], ids=["shared decay", "a decay per model"])
def test_linear_kernel_under_vmap_folds_the_models_into_the_heads(gamma_dim, monkeypatch):
    """K = 3 models' linear scans from carried states under vmap: one forward launch over K H heads (and the
    backward's three), each model with its own decay; each model's outputs and gradients its own."""
    K = 3
    q, k, v, S0 = (torch.stack([t.detach() * (1 + 0.1 * i) for i in range(K)]) for t in linear_inputs(37, 4, 8))
    gamma = torch.tensor(GAMMAS["retention"])
    gamma = gamma if gamma_dim is None else torch.stack([gamma ** (i + 1) for i in range(K)])
    module = importlib.import_module("models.linear_triton")
    launches = counted(monkeypatch, module, "_launch")
    vmapped_against_apart(module.linear_scan, [q, k, v, S0, gamma], (0, 0, 0, 0, gamma_dim), range(4))
    assert launches == {"_launch": 4 + 4 * K}  # forward and three backward launches, fused once, then per model


def test_the_scans_run_triton_under_the_interpreter_and_torch_otherwise(monkeypatch):
    inputs = mamba_inputs(1, 3, 2, 4)
    q, k, v, _ = (t.requires_grad_() for t in linear_inputs(3, 4, 4))
    linear = lambda: type(chunked_scan(q, k, v, {}, torch.ones(3), False, 64).grad_fn).__name__  # noqa: E731
    assert kernels.triton_ready(*inputs)
    assert type(selective_scan(*inputs)[0].grad_fn).__name__ == "_SelectiveScanTritonBackward"
    assert linear() == "_LinearScanBackward"
    with kernels.use("torch"):
        assert not kernels.triton_ready(*inputs)
        assert type(selective_scan(*inputs)[0].grad_fn).__name__ == "_SelectiveScanBackward"  # numba
        assert linear() != "_LinearScanBackward"
    assert not kernels.triton_ready(*(t.double() for t in inputs))  # float64 checks the torch forms
    monkeypatch.delenv("TRITON_INTERPRET")
    assert not kernels.triton_ready(*inputs)
    assert type(selective_scan(*inputs)[0].grad_fn).__name__ == "_SelectiveScanBackward"
    assert linear() != "_LinearScanBackward"
    with pytest.raises(ValueError, match="backend"), kernels.use("cuda"):
        pass
