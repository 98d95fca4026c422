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


def test_the_scans_run_triton_under_the_interpreter_and_torch_otherwise(monkeypatch):
    inputs = mamba_inputs(1, 3, 2, 4)
    assert kernels.triton_ready(*inputs)
    assert type(selective_scan(*inputs)[0].grad_fn).__name__ == "_SelectiveScanTritonBackward"
    with kernels.use("torch"):
        assert not kernels.triton_ready(*inputs)
        assert type(selective_scan(*inputs)[0].grad_fn).__name__ == "_SelectiveScanBackward"  # numba
    assert not kernels.triton_ready(*(t.double() for t in inputs))  # float64 checks the torch forms
    monkeypatch.delenv("TRITON_INTERPRET")
    assert not kernels.triton_ready(*inputs)
    assert type(selective_scan(*inputs)[0].grad_fn).__name__ == "_SelectiveScanBackward"
    with pytest.raises(ValueError, match="backend"), kernels.use("cuda"):
        pass
