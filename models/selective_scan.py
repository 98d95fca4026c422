"""Mamba's selective scan (Gu & Dao 2023, Alg. 2): a plain PyTorch loop, a fused CPU kernel (its Triton twin for
CUDA beside it), and a parallel form for every other device.

Per batch row b, channel e and state n, with dt > 0 and A < 0:

    h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t          (B, E, N) state; B_t, C_t (B, N) shared by every channel
    y_t = C_t . h_t                                    summed over n

The loop (``selective_scan_reference``) costs about ten PyTorch ops per token, each over the whole (B, E, N)
state, and autograd keeps every intermediate: on a CPU it is bandwidth- and overhead-bound. A chunked
parallel form does not help on a CPU: Mamba's decay exp(dt A) differs per channel *and* state, so the
intra-chunk form materialises a (B, T, E, N, chunk) tensor, chunk times the loop's work. The kernel
(``selective_scan``) runs the same recurrence in numba, one (b, e) row per iteration with the N states in
registers, and never writes the (B, T, E, N) states: the backward pass recomputes them a chunk at a time
from the states saved at chunk starts.

On CUDA the same kernel's algorithm runs in Triton (``models.selective_scan_triton``, where triton is installed;
``models.kernels`` chooses). Elsewhere off the CPU (or off float32) the parallel form runs
(``selective_scan_parallel``): the recurrence unrolled as
    h_t = exp(L_t) h_0 + sum_(s <= t) exp(L_t - L_s) u_s,      L_t = sum_(r <= t) dt_r A,  u_s = dt_s x_s B_s
with the sums in log space (``torch.logcumsumexp``, a scan in one kernel), positive and negative u apart, in
chunks (float32 keeps exp(L) to |L| x 6e-8, so L must not grow over all of T), in float32 whatever the autocast
dtype: no step depends on the one before in Python. Its backward recomputes it
(activation checkpointing), so only the (B, T, E) and (B, T, N) inputs are kept, not the (B, T, E, N) states.
"""

from __future__ import annotations

import numba
import numpy as np
import torch
import torch.nn.functional as F
from numba import prange
from torch.utils.checkpoint import checkpoint

from models.kernels import fold, triton_ready, unfold

CHECKPOINT = 32  # tokens between saved states: the backward pass recomputes one chunk of states at a time

# contract: fused multiply-adds; reassoc: the sums over states may be vectorised (summation order changes)
parallel_kernel = numba.njit(cache=True, nogil=True, parallel=True, fastmath={"contract", "reassoc"})

LOG2E = np.float32(1.4426950408889634)
LN2_HI, LN2_LO = np.float32(0.693359375), np.float32(-2.12194440e-4)  # ln 2 = HI + LO, HI exact in 9 bits
POW2 = np.ldexp(np.float32(1.0), np.arange(-127, 1)).astype(np.float32)  # 2^k for k = -127..0


@numba.njit(cache=True, inline="always", fastmath={"contract"})
def decay(z):  # pragma: no cover (compiled)
    """exp(z) for float32 z <= 0, within 1e-7 relative (float32 rounding) down to exp(-87).

    libm's scalar expf is most of the scan's time and LLVM cannot vectorise calls to it; this is the textbook
    range reduction  exp(z) = 2^k exp(f),  k = round(z / ln 2),  |f| <= ln(2) / 2,  with exp(f) by its degree-7
    Taylor polynomial (error f^8 / 8! < 5e-9), which vectorises over the N states.
    """
    if z != z:  # NaN (a diverged model's): NaN out, where int32(NaN) would index POW2 out of its bounds
        return z
    z = max(z, np.float32(-87.0))
    k = np.floor(z * LOG2E + np.float32(0.5))
    f = z - k * LN2_HI - k * LN2_LO
    one = np.float32(1.0)
    p = one + f * (
        one
        + f
        * (
            np.float32(1 / 2)
            + f
            * (
                np.float32(1 / 6)
                + f
                * (
                    np.float32(1 / 24)
                    + f * (np.float32(1 / 120) + f * (np.float32(1 / 720) + f * np.float32(1 / 5040)))
                )
            )
        )
    )  # Horner
    return p * POW2[np.int32(k) + 127]


def selective_scan_reference(dt, x, A, Bm, Cm, h0):
    """dt, x (B, T, E); A (E, N); Bm, Cm (B, T, N); h0 (B, E, N) -> y (B, T, E), h_T (B, E, N). One step per token."""
    h, ys = h0, []
    for t in range(dt.shape[1]):
        h = torch.exp(dt[:, t, :, None] * A) * h + (dt[:, t] * x[:, t])[..., None] * Bm[:, t, None, :]  # (B, E, N)
        ys.append((h * Cm[:, t, None, :]).sum(-1))  # (B, E)
    return torch.stack(ys, 1), h


@parallel_kernel
def _forward(dt, x, A, Bm, Cm, h0, y, hT, saved):  # pragma: no cover (compiled)
    """dt, x, y (B, E, T); A (G, E, N): batch row b decays by A[b // (B / G)] (``grouped``); saved (B, E,
    ceil(T / CHECKPOINT), N): the state before each chunk."""
    Bsz, E, T = dt.shape
    N = A.shape[2]
    rows = Bsz // A.shape[0]  # batch rows per group
    for be in prange(Bsz * E):
        b, e = be // E, be % E
        Ab = A[b // rows]
        h = h0[b, e].copy()
        for t in range(T):
            if t % CHECKPOINT == 0:
                saved[b, e, t // CHECKPOINT] = h
            d = dt[b, e, t]
            u = d * x[b, e, t]
            acc = np.float32(0.0)
            for n in range(N):
                h[n] = decay(d * Ab[e, n]) * h[n] + u * Bm[b, t, n]
                acc += h[n] * Cm[b, t, n]
            y[b, e, t] = acc
        hT[b, e] = h


@parallel_kernel
def _backward(dt, x, A, Bm, Cm, saved, gy, ghT, gdt, gx, gA, gB, gC, gh0):  # pragma: no cover (compiled)
    """Reverse-mode through the recurrence; one batch row per iteration, so the sums over channels into gB and gC
    need no locks. A (G, E, N) as in ``_forward``; gA (B, E, N) holds per-row partial sums.

    With a_t = exp(dt_t A) and g_t the gradient reaching h_t (from y_t and from h_{t+1}):
        g_t = dL/dy_t C_t + a_{t+1} g_{t+1}
        dL/dC_t += dL/dy_t h_t,   dL/dB_t += g_t dt_t x_t,   dL/dx_t = sum_n g_t dt_t B_t
        dL/ddt_t = sum_n g_t (A a_t h_{t-1} + x_t B_t),      dL/dA += g_t dt_t a_t h_{t-1}
    """
    Bsz, E, T = dt.shape
    N = A.shape[2]
    rows = Bsz // A.shape[0]
    for b in prange(Bsz):
        Ab = A[b // rows]
        hs = np.empty((CHECKPOINT + 1, N), dtype=np.float32)  # states h_{t0-1} .. h_{t1-1} of one chunk
        a = np.empty((CHECKPOINT, N), dtype=np.float32)
        for e in range(E):
            g = ghT[b, e].copy()
            for c in range(saved.shape[2] - 1, -1, -1):
                t0 = c * CHECKPOINT
                t1 = min(T, t0 + CHECKPOINT)
                hs[0] = saved[b, e, c]
                for t in range(t0, t1):  # recompute the chunk's states
                    i, d = t - t0, dt[b, e, t]
                    u = d * x[b, e, t]
                    for n in range(N):
                        a[i, n] = decay(d * Ab[e, n])
                        hs[i + 1, n] = a[i, n] * hs[i, n] + u * Bm[b, t, n]
                for t in range(t1 - 1, t0 - 1, -1):
                    i, d, xv, gyt = t - t0, dt[b, e, t], x[b, e, t], gy[b, e, t]
                    gd = np.float32(0.0)
                    gxt = np.float32(0.0)
                    for n in range(N):
                        gn = g[n] + gyt * Cm[b, t, n]
                        gC[b, t, n] += gyt * hs[i + 1, n]
                        gdecay = gn * a[i, n] * hs[i, n]
                        gA[b, e, n] += gdecay * d
                        gd += gdecay * Ab[e, n] + gn * xv * Bm[b, t, n]
                        gxt += gn * d * Bm[b, t, n]
                        gB[b, t, n] += gn * d * xv
                        g[n] = gn * a[i, n]
                    gdt[b, e, t] = gd
                    gx[b, e, t] = gxt
            gh0[b, e] = g


def _threads() -> None:
    """Use as many threads as torch does (a trial's CPU share), not numba's default of every core."""
    # numba.config sets NUMBA_NUM_THREADS through globals() when it loads, which its types cannot show
    cores = numba.config.NUMBA_NUM_THREADS  # type: ignore[attr-defined]
    numba.set_num_threads(max(1, min(torch.get_num_threads(), cores)))


@torch.compiler.disable
def numba_call(kernel, *tensors: torch.Tensor) -> None:
    """``kernel`` on the tensors' memory (outputs written in place), with torch's thread count; opaque to
    torch.compile, which cannot trace numba's dispatcher (the step runs the kernel between compiled graphs)."""
    _threads()
    kernel(*(t.numpy() for t in tensors))


class _SelectiveScan(torch.autograd.Function):
    """The fused kernel under autograd, A (G, E, N) grouped as ``_forward`` takes it. Under ``torch.func.vmap`` (the K
    models of a fused trial, ``models.fused``) the model axis folds into the batch: K models of B rows each are one
    call on K B rows in K groups, each group decaying by its own model's A (``vmap``)."""

    @staticmethod
    def forward(dt, x, A, Bm, Cm, h0):
        dt_, x_ = (t.detach().transpose(1, 2).contiguous() for t in (dt, x))  # (B, E, T): one row per (b, e)
        A_, Bm_, Cm_, h0_ = (t.detach().contiguous() for t in (A, Bm, Cm, h0))
        Bsz, E, T = dt_.shape
        y, hT = dt_.new_empty(Bsz, E, T), torch.empty_like(h0_)
        saved = dt_.new_empty(Bsz, E, -(-T // CHECKPOINT), A.shape[2])
        numba_call(_forward, dt_, x_, A_, Bm_, Cm_, h0_, y, hT, saved)
        return y.transpose(1, 2), hT, saved

    @staticmethod
    def setup_context(ctx, inputs, output):
        dt, x, A, Bm, Cm, _ = inputs
        ctx.mark_non_differentiable(output[2])
        # the inputs, not their (B, E, T) copies: autograd keeps dt and x for other nodes anyway
        ctx.save_for_backward(dt, x, A, Bm, Cm, output[2])

    @staticmethod
    def backward(ctx, gy, ghT, _):
        dt, x, A, Bm, Cm, saved = ctx.saved_tensors
        dt_, x_ = (t.detach().transpose(1, 2).contiguous() for t in (dt, x))  # (B, E, T)
        A_, Bm_, Cm_ = (t.detach().contiguous() for t in (A, Bm, Cm))
        gy = gy.transpose(1, 2).contiguous() if gy is not None else torch.zeros_like(dt_)  # (B, E, T)
        ghT = ghT.contiguous() if ghT is not None else saved.new_zeros(saved.shape[:2] + saved.shape[3:])
        gdt, gx = torch.empty_like(dt_), torch.empty_like(x_)
        gA = saved.new_zeros(dt_.shape[0], *A_.shape[1:])  # per batch row
        gB, gC, gh0 = torch.zeros_like(Bm_), torch.zeros_like(Cm_), torch.empty_like(ghT)
        numba_call(_backward, dt_, x_, A_, Bm_, Cm_, saved, gy, ghT, gdt, gx, gA, gB, gC, gh0)
        gA = gA.view(A_.shape[0], -1, *A_.shape[1:]).sum(1)  # (G, E, N): each group's rows
        return gdt.transpose(1, 2), gx.transpose(1, 2), gA, gB, gC, gh0

    @staticmethod
    def vmap(info, in_dims, *inputs):
        y, hT, saved = _SelectiveScan.apply(*(fold(t, d, info.batch_size) for t, d in zip(inputs, in_dims)))
        return tuple(unfold(t, info.batch_size) for t in (y, hT, saved)), (0, 0, 0)


# log|u| of an exact zero: exp(-80 + L) is below float32's smallest normal for any L <= 0
LOG_ZERO = -80.0
# an absent term (the other sign's): finite, so that logcumsumexp's backward stays finite, and far below any present one
ABSENT = -1e30
# tokens per chunk of the parallel form: float32 loses about |L| x 6e-8 relative in exp(L), and L sums dt A over a
# chunk at most (at 64: ~1e-5 at Mamba's initial dt and A; over the whole of T = 400, up to 30x that)
SCAN_CHUNK = 64


def segment_sums(y: torch.Tensor) -> torch.Tensor:
    """y (B, m, ...) -> (B, m, m, ...): [c, j] = y_(j+1) + ... + y_c for j <= c, -inf above (exp: 0). Summed, not
    differenced from a running total: no cancellation of large numbers (Mamba-2's ``segsum``)."""
    m = y.shape[1]
    i = torch.arange(m, device=y.device)
    shape = (1, m, m) + (1,) * (y.dim() - 2)
    later = (i[:, None] > i[None, :]).view(shape)  # [k, j]: k > j
    seg = y[:, :, None].expand(-1, -1, m, *y.shape[2:]).masked_fill(~later, 0).cumsum(1)  # [c, j]: sum_(j<k<=c) y_k
    return seg.masked_fill(~(i[:, None] >= i[None, :]).view(shape), float("-inf"))


def _parallel(dt, x, A, Bm, Cm, h0):
    """Chunks of ``SCAN_CHUNK`` tokens: within each, the log-space form from a zero state; across them, each chunk's
    start state from the earlier chunks' end states and h_0 (``segment_sums`` of the chunks' log decays)."""
    dtype = torch.promote_types(dt.dtype, torch.float32)  # the accumulators in float32 at least
    B, T, E = dt.shape
    n = -(-T // SCAN_CHUNK)
    C = -(-T // n)
    # zero steps pad the last chunk: no decay, no input, so the state at the end is h_T
    dt, x, Bm, Cm = (F.pad(t.to(dtype), (0, 0, 0, n * C - T)).view(B, n, C, -1) for t in (dt, x, Bm, Cm))
    A, h0 = A.to(dtype), h0.to(dtype)
    L = (dt[..., None] * A).cumsum(2)  # (B, n, C, E, N): log of the decay from the chunk's start through t, <= 0
    u = (dt * x)[..., None] * Bm[:, :, :, None, :]  # (B, n, C, E, N)
    log_u = torch.log(u.abs()).clamp(min=LOG_ZERO) - L  # log |u_s| - L_s
    pos = torch.logcumsumexp(torch.where(u > 0, log_u, ABSENT), 2)  # log sum_(s <= t) exp(-L_s) u_s over u_s > 0
    neg = torch.logcumsumexp(torch.where(u < 0, log_u, ABSENT), 2)
    own = torch.exp(pos + L) - torch.exp(neg + L)  # (B, n, C, E, N): the chunk's inputs alone
    # states at the chunks' starts and at the end: [c] = sum_(j' <= c) exp(decay of chunks j'..c-1) ends[j']
    ends = torch.cat([h0[:, None], own[:, :, -1]], 1)  # (B, n + 1, E, N): h_0, then each chunk's own end state
    decays = F.pad(L[:, :, -1], (0, 0, 0, 0, 1, 0))  # (B, n + 1, E, N): 0, then each chunk's log decay
    starts = (torch.exp(segment_sums(decays)) * ends[:, None]).sum(2)  # (B, n + 1, E, N)
    h = torch.exp(L) * starts[:, :-1, None] + own  # (B, n, C, E, N)
    y = (h * Cm[:, :, :, None, :]).sum(-1)  # (B, n, C, E)
    return y.view(B, n * C, E)[:, :T], starts[:, -1]


def selective_scan_parallel(dt, x, A, Bm, Cm, h0):
    """Same contract as ``selective_scan_reference``; float32 (or wider) inside, y and h_T in x's dtype."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in (dt, x, A, Bm, Cm, h0)):
        y, h = checkpoint(_parallel, dt, x, A, Bm, Cm, h0, use_reentrant=False)
    else:
        y, h = _parallel(dt, x, A, Bm, Cm, h0)
    return y.to(x.dtype), h.to(h0.dtype)


def selective_scan(dt, x, A, Bm, Cm, h0):
    """Same contract as ``selective_scan_reference``: the Triton kernel where it runs (CUDA, ``kernels.triton_ready``),
    else the fused numba kernel for float32 CPU tensors, else the parallel form."""
    if triton_ready(dt, x, A, Bm, Cm, h0):
        from models.selective_scan_triton import selective_scan_triton  # imports triton: only where it runs

        return selective_scan_triton(dt, x, A, Bm, Cm, h0)
    if all(t.device.type == "cpu" and t.dtype == torch.float32 for t in (dt, x, A, Bm, Cm, h0)):
        y, hT, _ = _SelectiveScan.apply(dt, x, A[None], Bm, Cm, h0)  # one group: every row decays by A
        return y, hT
    return selective_scan_parallel(dt, x, A, Bm, Cm, h0)
