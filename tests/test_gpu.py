"""On a GPU (``gpu`` marker, skipped without CUDA): the paths a GPU runs agree with their CPU references, bf16 stays
close to float32, a trial fits the memory it plans for, and cached decoding equals the full forward.

    pytest -m gpu tests/test_gpu.py        # on a machine with CUDA
"""

from __future__ import annotations

import copy
import dataclasses
import warnings

import lightning as L
import pytest
import torch

import models
from models import kernels
from models.fused import Fused
from models.linear import chunked_scan, scan_reference
from models.selective_scan import selective_scan, selective_scan_reference
from pipeline.training.memory import fit_memory
from tests.helpers.fused import VOCAB, members
from tests.helpers.training import short_trial, with_settings

pytestmark = pytest.mark.gpu
ARCHS = sorted(models.ARCHITECTURES)
CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def exact_float32():
    """TF32 off for float32 products and cuDNN's convolutions and RNNs (cuDNN's is on by default): the parity
    checks compare float32 on CUDA with the CPU at 1e-3, which TF32's 10-bit mantissa would not hold. Restored after
    each test, since a trial turns TF32 on (``train.trial_device``)."""
    before = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.set_float32_matmul_precision(before[0])
    torch.backends.cudnn.allow_tf32 = before[1]


# The whole step graphed first: the proof's time limit (ops/gpu-proof) cuts the file's tail, and these are the newest.
@pytest.mark.parametrize("arch", ["transformer", "mamba", "linear_nofm"])
def test_a_fused_step_graphed_whole_trains_as_the_eager_one(arch):
    """A fused trial's step graphed: the whole step (the forward, vmap over stacked weights and the Triton kernels'
    vmap rules inside, backward, each member's clip, ``FusedAdam``'s update) as one CUDA graph (``GraphedStep``), as
    the sweep and bench_pack's graphed fused rows run it: recorded after its warm-up and replayed, recorded anew after
    a member freezes (a new program), and 12 steps give the eager step's losses, and the trained members the eager
    ones' logits, within float32's rounding (the CPU twin: tests/test_fused_trial.py's whole-step test)."""
    from pipeline.training.fused_step import fused_step
    from pipeline.training.settings import TrainSettings

    settings = TrainSettings().replaced(heads=4, dropout=0.0, optimizer="adam", warmup_fraction=0.0, grad_clip=1.0)
    graphed, eager = (fused_step(arch, (1e-2, 3e-3, 1e-3), settings, vocab_size=16, width=64, depth=2, max_len=65,
                                 device=CUDA, step=step) for step in ("graphed", "eager"))  # fmt: skip
    tokens = torch.randint(0, 16, (13, 8, 65), device=CUDA)
    for i, batch in enumerate(tokens[:12]):
        if i == 6:
            for step in (graphed, eager):
                step.optimizer.freeze([1])
        torch.testing.assert_close(graphed(batch[:, :-1], batch[:, 1:]), eager(batch[:, :-1], batch[:, 1:]),
                                   rtol=1e-3, atol=1e-5)  # fmt: skip
    whole = graphed.whole
    assert whole is not None and whole.mode == "graphed", whole and whole.why
    assert (whole.eager, whole.replays) == (6, 6)  # 3 warm-ups, recorded, 2 replays; again after the freeze
    with torch.no_grad():
        torch.testing.assert_close(graphed.model(tokens[12, :, :-1]), eager.model(tokens[12, :, :-1]), rtol=1e-3,
                                   atol=1e-4)  # fmt: skip


class WholeBooks(L.Callback):
    """A fused fit's whole step, as it ended."""

    def on_train_end(self, trainer, module):
        self.whole = module.whole


def test_a_fused_trial_graphed_whole_on_cuda_ends_each_member_as_its_eager_fit(spec):
    """The sweep's fused trial graphed on a GPU runs its whole step as CUDA graphs (Lightning's manual optimization,
    the clip inside): its members, one diverging, two solving and one going on to the budget, end as the eager fit's
    do (status and steps; the update is compiled in the graph, so a reason's figures may round apart), most steps
    replayed."""
    from pipeline.training.fused_trial import run_fused

    books = WholeBooks()
    runs = {}
    for step in ("graphed", "eager"):
        base = with_settings(spec, dropout=0.0, threshold=0.4, patience=1, targets={"lis": 0.4}, use_gpu=True,
                             step=step)  # fmt: skip
        specs = [dataclasses.replace(base, lr=lr) for lr in (3e-2, 3e-3, 1e-5, 1e6)]
        runs[step] = run_fused(specs, [f"m{k}" for k in range(4)], callbacks=[books] if step == "graphed" else [])
    for a, b in zip(runs["graphed"], runs["eager"]):
        assert (a["status"], a["train_steps"]) == (b["status"], b["train_steps"]), (a["reason"], b["reason"])
    whole = books.whole
    assert whole.mode == "graphed" and whole.replays > whole.eager, (whole.why, whole.replays, whole.eager)


def test_chunked_scan_on_cuda_matches_the_cpu_recurrence():
    """The torch form: float64 never runs the Triton kernel (``kernels.triton_ready``)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 300, 16, dtype=torch.float64) for _ in range(3))
    gamma = 1 - 2.0 ** (-5 - torch.arange(4, dtype=torch.float64))
    ref = scan_reference(q, k, v, {}, gamma, False)
    ours = chunked_scan(*(t.to(CUDA) for t in (q, k, v)), {}, gamma.to(CUDA), False, chunk=64)
    torch.testing.assert_close(ours.cpu(), ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("H, d", [(8, 64), (2, 256)])
def test_linear_triton_kernel_on_cuda_matches_the_cpu_recurrence_forward_state_and_gradients(H, d):
    """The Triton kernel (retention's decays, a carried state) at a training shape: out, S_T and the gradients of
    q, k, v and S_0; at head dim 256 its keys in two tiles (KEY_TILE)."""
    pytest.importorskip("triton")
    torch.manual_seed(0)
    B, T = 4, 512
    q, k = (torch.nn.functional.elu(torch.randn(B, H, T, d)) + 1 for _ in range(2))
    inputs = [q, k, torch.randn(B, H, T, d), torch.randn(B, H, d, d)]
    gamma = 1 - 2.0 ** (-5 - torch.arange(H, dtype=torch.float32))
    results = []
    for device, dtype in [(CUDA, torch.float32), (torch.device("cpu"), torch.float64)]:
        leaves = [t.to(device, dtype).requires_grad_() for t in inputs]
        state = {"S": leaves[3]}
        scan = chunked_scan if device == CUDA else lambda *a, chunk: scan_reference(*a)
        out = scan(*leaves[:3], state, gamma.to(device, dtype), False, chunk=64)
        assert device != CUDA or type(out.grad_fn).__name__ == "_LinearScanBackward"
        torch.manual_seed(1)
        up = [torch.randn(t.shape, dtype=torch.float64).to(device, dtype) for t in (out, state["S"])]
        grads = torch.autograd.grad((out * up[0]).sum() + (state["S"] * up[1]).sum(), leaves)
        results.append([t.cpu().double() for t in (out, state["S"], *grads)])
    for a, b in zip(*results):
        assert (a - b).abs().max() <= 1e-4 * b.abs().max()


def mamba_inputs(B: int, T: int, E: int, N: int) -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.nn.functional.softplus(torch.randn(B, T, E) - 2), torch.randn(B, T, E),
            -torch.arange(1.0, N + 1).repeat(E, 1), torch.randn(B, T, N), torch.randn(B, T, N), torch.randn(B, E, N)]


def test_selective_scan_on_cuda_matches_the_cpu_loop_forward_and_gradients():
    """The torch form (the fallback without triton)."""
    inputs = mamba_inputs(2, 300, 8, 16)
    ref = [t.double().requires_grad_() for t in inputs]
    ours = [t.to(CUDA).requires_grad_() for t in inputs]
    y_ref, h_ref = selective_scan_reference(*ref)
    with kernels.use("torch"):
        y, h = selective_scan(*ours)
    assert y.device.type == "cuda"
    torch.testing.assert_close(y.cpu().double(), y_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(h.cpu().double(), h_ref, rtol=1e-4, atol=1e-4)
    g_ref = torch.autograd.grad(y_ref.sum() + h_ref.sum(), ref)
    g = torch.autograd.grad(y.sum() + h.sum(), ours)
    for a, b in zip(g, g_ref):
        assert (a.cpu().double() - b).abs().max() <= 1e-3 * b.abs().max()


def test_mamba_triton_kernel_on_cuda_matches_the_cpu_loop_forward_and_gradients():
    """The Triton kernel, the default on CUDA where triton is installed, at a training shape."""
    pytest.importorskip("triton")
    inputs = mamba_inputs(4, 512, 256, 16)
    ref = [t.double().requires_grad_() for t in inputs]
    ours = [t.to(CUDA).requires_grad_() for t in inputs]
    assert kernels.triton_ready(*ours)
    y, h = selective_scan(*ours)
    assert type(y.grad_fn).__name__ == "_SelectiveScanTritonBackward"
    y_ref, h_ref = selective_scan_reference(*ref)
    gy, gh = torch.randn_like(y_ref), torch.randn_like(h_ref)
    g = torch.autograd.grad((y * gy.to(CUDA)).sum() + (h * gh.to(CUDA)).sum(), ours)
    g_ref = torch.autograd.grad((y_ref * gy).sum() + (h_ref * gh).sum(), ref)
    for a, b in zip([y, h, *g], [y_ref, h_ref, *g_ref]):
        assert (a.cpu().double() - b).abs().max() <= 1e-4 * b.abs().max()


@pytest.mark.parametrize("arch", ARCHS)
def test_every_architecture_on_cuda_agrees_with_the_cpu_and_under_bf16(arch):
    """float32 on CUDA (TF32 off) against the CPU; bf16 autocast on CUDA within the CPU test's tolerance; the logits
    at a few positions (``at``: a classification's answer) those of the whole forward there."""
    torch.manual_seed(0)
    model = models.build_model(arch, vocab_size=16, width=64, depth=2, heads=4, max_len=800, dropout=0.0).eval()
    tokens = torch.randint(0, 16, (2, 800))
    at = torch.tensor([[798, 799], [100, 101]], device=CUDA)
    with torch.no_grad():
        cpu = model(tokens)
        model.to(CUDA)
        exact = model(tokens.to(CUDA)).float()
        part = model(tokens.to(CUDA), at=at).float()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            low = model(tokens.to(CUDA)).float()
    torch.testing.assert_close(exact.cpu(), cpu, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(part, exact.gather(1, at[..., None].expand(-1, -1, 16)), rtol=1e-4, atol=1e-4)
    assert torch.isfinite(low).all()
    assert ((low - exact).norm() / exact.norm()).item() < 0.03


@pytest.mark.parametrize("arch", ARCHS)
def test_fused_models_on_cuda_equal_their_members_with_every_op_batched(arch):
    """K = 3 fused on CUDA (float32, TF32 off; the Triton kernels' vmap rules compiled): each member's logits and
    gradients its own's within 1e-4; no op falls back to vmap's per-member loop (CUDA's attention kernels have
    batching rules), but lstm, whose members run one after another, as its notes say."""
    apart = [m.to(CUDA) for m in members(arch, torch.float32, width=64, max_len=200)]
    fused = Fused(copy.deepcopy(apart))
    tokens = torch.randint(0, VOCAB, (4, 200), device=CUDA)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logits = fused(tokens)
    assert not [w for w in caught if "batching rule" in str(w.message)]
    assert bool(fused.notes(CUDA)) == (arch == "lstm")
    upstream = torch.randn_like(logits)
    (logits * upstream).sum().backward()
    params = fused.stacked()[0]
    for k, model in enumerate(apart):
        alone = model(tokens)
        assert (logits[k] - alone).abs().max() <= 1e-4 * alone.abs().max()
        (alone * upstream[k]).sum().backward()
        for name, p in model.named_parameters():
            assert (params[name].grad[k] - p.grad).abs().max() <= 1e-4 * p.grad.abs().max(), name


@pytest.mark.parametrize("arch", ARCHS)
def test_cached_decoding_on_cuda_equals_the_full_forward(arch):
    torch.manual_seed(0)
    model = models.build_model(arch, vocab_size=23, width=32, depth=2, heads=4, max_len=48).eval().to(CUDA)
    x = torch.randint(0, 23, (3, 40), device=CUDA)
    with torch.no_grad():
        cache = model.new_cache(3)
        steps = [model(x[:, :9], cache)] + [model(x[:, t:t + 1], cache) for t in range(9, 40)]
        torch.testing.assert_close(torch.cat(steps, 1), model(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "arch, backend", [("standard", "triton"), ("mamba", "triton"), ("mamba", "torch"), ("linear", "triton"),
                      ("linear", "torch")])
def test_a_planned_step_stays_within_the_memory_it_planned(arch, backend):
    """The plan's bytes for a micro-batch (with its headroom) bound the measured peak of a real training step, also
    for the scans' torch forms, whose backward recomputes states no saved tensor shows."""
    with kernels.use(backend):
        planned_step_within_its_plan(arch)


def planned_step_within_its_plan(arch: str) -> None:
    model = models.build_model(arch, vocab_size=32, width=256, depth=4, heads=4, max_len=501).to(CUDA)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16)
    with torch.random.fork_rng(devices=[CUDA]):
        fit = fit_memory(model, 500, 64, 2e9, CUDA, lambda: autocast)
    opt = torch.optim.AdamW(model.parameters())
    micro = torch.randint(0, 32, (64, 501), device=CUDA).tensor_split(fit.micro_batches)
    torch.cuda.reset_peak_memory_stats()
    for _ in range(2):
        for x in micro:
            with autocast:
                loss = torch.nn.functional.cross_entropy(model(x[:, :-1]).float().flatten(0, 1), x[:, 1:].flatten())
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    assert torch.cuda.max_memory_allocated() <= fit.needed(len(micro[0])) <= 2e9


def test_a_bf16_trial_trains_and_scores_on_cuda(tiny_cfg, tiny_data):
    result = short_trial(tiny_cfg, tiny_data, precision="bf16-mixed", use_gpu=True, gpu_share=0.5)
    assert result["train_steps"] == 20 and 0 <= result["final_accuracy"] <= 1


def test_a_trials_device_caps_its_share_and_a_whole_gpu_after_it_is_uncapped():
    """One process training trials of other shares in turn (bench_pack's pool): each trial's allocator cap is its
    own, never the one before's."""
    from pipeline.training.settings import TrainSettings
    from pipeline.training.train import trial_device

    third = torch.cuda.get_device_properties(CUDA).total_memory // 3
    trial_device(TrainSettings().replaced(use_gpu=True, gpu_share=0.25))
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(third, dtype=torch.uint8, device=CUDA)
    trial_device(TrainSettings().replaced(use_gpu=True, gpu_share=1.0))
    whole = torch.empty(third, dtype=torch.uint8, device=CUDA)  # over a quarter: the cap is gone
    del whole
    torch.cuda.empty_cache()


@pytest.mark.parametrize("arch", ["standard", "mamba"])
def test_a_graphed_step_trains_as_the_eager_one(arch):
    """sweep.resources.step: graphed (CUDA graphs through torch.compile's reduce-overhead mode; mamba's Triton scan
    inside): logits and gradients within float32's rounding of the eager step's, at the recorded graph's replays."""
    from pipeline.training.steps import StepForward

    torch.manual_seed(0)
    model = models.build_model(arch, vocab_size=16, width=64, depth=2, heads=4, max_len=65, dropout=0.0).to(CUDA)
    tokens = torch.randint(0, 16, (8, 64), device=CUDA)

    def run(forward):
        model.zero_grad()
        logits = forward(tokens)
        logits.square().mean().backward()
        return [logits.detach().clone(), *(p.grad.clone() for p in model.parameters())]

    eager = run(model)
    step = StepForward(model, "graphed", CUDA)
    for _ in range(3):  # recorded, then replayed
        graphed = run(step)
        assert step.mode == "graphed", step.why
        for a, b in zip(graphed, eager):
            torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)


def test_a_graphed_bf16_trial_trains_and_scores_on_cuda(tiny_cfg, tiny_data):
    result = short_trial(tiny_cfg, tiny_data, precision="bf16-mixed", use_gpu=True, step="graphed")
    assert result["train_steps"] == 20 and 0 <= result["final_accuracy"] <= 1
