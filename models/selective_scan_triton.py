"""Mamba's selective scan as Triton kernels, for CUDA tensors: the numba CPU kernel's algorithm
(``models.selective_scan``, ``_forward`` and ``_backward``) on a GPU. Tested on the CPU under Triton's interpreter.

Per batch row b, channel e and state n (the recurrence of ``selective_scan_reference``):

    h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t          (B, E, N) state; B_t, C_t (B, N) shared by every channel
    y_t = C_t . h_t                                    summed over n

One program per (batch row, block of BLOCK_E channels) keeps its (BLOCK_E, N) states in registers, in float32
whatever the inputs' dtype, and walks t in order, reading dt_t, x_t (BLOCK_E,) and B_t, C_t (N,) per token. It never
writes the (B, T, E, N) states, only the state before every chunk of CHECKPOINT tokens. The backward pass walks the
chunks in reverse: it recomputes a chunk's states from the saved one into a small scratch buffer of its own, then
runs the chunk's tokens backwards. The sums over channels (the gradients of B and C) are per-program partials added
up afterwards, and A's per batch row: no two programs write the same place, so no atomics.

N need not be a power of two: the state axis is padded to one, the padding masked (zero A, B, C and h_0 keep its
states at zero, so it adds nothing to any sum).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from models.kernels import fold, unfold

CHECKPOINT = 32  # tokens between saved states, as the CPU kernel's: the backward recomputes one chunk at a time


# channels per program: small, so that B E / BLOCK_E programs fill the GPU's SMs (each one walks all of T in turn);
# one warp each, so the per-token sums over channels and states are warp shuffles, not shared-memory round trips
BLOCK_E = 16
WARPS = 1


@triton.jit
def _forward(
    dt, x, A, Bm, Cm, h0, y, hT, saved, T, E, N, n_chunks, rows,
    CHUNK: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """dt, x, y (B, T, E); A (G, E, N): batch row b decays by A[b // rows], rows = B / G; Bm, Cm (B, T, N); h0, hT
    (B, E, N); saved (B, E, n_chunks, N) float32: the state before each chunk of CHUNK tokens."""
    b = tl.program_id(0).to(tl.int64)
    e = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)  # (BLOCK_E,)
    n = tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    e_in, n_in = e < E, n < N
    en_in = e_in[:, None] & n_in[None, :]  # (BLOCK_E, BLOCK_N)
    en = e[:, None] * N + n[None, :]  # (BLOCK_E, BLOCK_N): offsets in an (E, N) matrix
    A_ = tl.load(A + (b // rows) * E * N + en, mask=en_in, other=0.0).to(tl.float32)
    h = tl.load(h0 + b * E * N + en, mask=en_in, other=0.0).to(tl.float32)
    for c in range(n_chunks):
        tl.store(saved + ((b * E + e[:, None]) * n_chunks + c) * N + n[None, :], h, mask=en_in)
        for t in range(c * CHUNK, tl.minimum(T, c * CHUNK + CHUNK)):
            d = tl.load(dt + (b * T + t) * E + e, mask=e_in, other=0.0).to(tl.float32)  # (BLOCK_E,)
            u = d * tl.load(x + (b * T + t) * E + e, mask=e_in, other=0.0).to(tl.float32)
            Bt = tl.load(Bm + (b * T + t) * N + n, mask=n_in, other=0.0).to(tl.float32)  # (BLOCK_N,)
            Ct = tl.load(Cm + (b * T + t) * N + n, mask=n_in, other=0.0).to(tl.float32)
            h = tl.exp(d[:, None] * A_) * h + u[:, None] * Bt[None, :]  # (BLOCK_E, BLOCK_N)
            tl.store(y + (b * T + t) * E + e, tl.sum(h * Ct[None, :], 1).to(y.dtype.element_ty), mask=e_in)
    tl.store(hT + b * E * N + en, h.to(hT.dtype.element_ty), mask=en_in)


@triton.jit
def _backward(
    dt, x, A, Bm, Cm, saved, gy, ghT, gdt, gx, gA, gB, gC, gh0, hs, T, E, N, n_chunks, rows,
    CHUNK: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Reverse-mode through the recurrence; A (G, E, N) as in ``_forward``. gA (B, E, N) float32: per batch row; gB, gC
    (B, n_blocks, T, N) float32: per block of channels; hs (B, n_blocks, CHUNK + 1, BLOCK_E, BLOCK_N): scratch for a
    chunk's h_{t0-1} .. h_{t1-1}.

    With a_t = exp(dt_t A) and g_t the gradient reaching h_t (from y_t and from h_{t+1}):
        g_t = dL/dy_t C_t + a_{t+1} g_{t+1}
        dL/dC_t += dL/dy_t h_t,   dL/dB_t += g_t dt_t x_t,   dL/dx_t = sum_n g_t dt_t B_t
        dL/ddt_t = sum_n g_t (A a_t h_{t-1} + x_t B_t),      dL/dA += g_t dt_t a_t h_{t-1}
    """
    b = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    part = b * tl.num_programs(1) + block  # this program's partial sums in gB and gC, and its scratch
    e = block * BLOCK_E + tl.arange(0, BLOCK_E)  # (BLOCK_E,)
    n = tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    e_in, n_in = e < E, n < N
    en_in = e_in[:, None] & n_in[None, :]  # (BLOCK_E, BLOCK_N)
    en = e[:, None] * N + n[None, :]
    scratch = hs + part * (CHUNK + 1) * BLOCK_E * BLOCK_N + tl.arange(0, BLOCK_E)[:, None] * BLOCK_N + n[None, :]
    A_ = tl.load(A + (b // rows) * E * N + en, mask=en_in, other=0.0).to(tl.float32)
    g = tl.load(ghT + b * E * N + en, mask=en_in, other=0.0).to(tl.float32)  # (BLOCK_E, BLOCK_N)
    gA_ = tl.zeros((BLOCK_E, BLOCK_N), dtype=tl.float32)
    for i in range(n_chunks):
        c = n_chunks - 1 - i
        t0 = c * CHUNK
        t1 = tl.minimum(T, t0 + CHUNK)
        h = tl.load(saved + ((b * E + e[:, None]) * n_chunks + c) * N + n[None, :], mask=en_in, other=0.0)
        tl.store(scratch, h)
        for t in range(t0, t1):  # recompute the chunk's states
            d = tl.load(dt + (b * T + t) * E + e, mask=e_in, other=0.0).to(tl.float32)
            u = d * tl.load(x + (b * T + t) * E + e, mask=e_in, other=0.0).to(tl.float32)
            Bt = tl.load(Bm + (b * T + t) * N + n, mask=n_in, other=0.0).to(tl.float32)
            h = tl.exp(d[:, None] * A_) * h + u[:, None] * Bt[None, :]
            tl.store(scratch + (t - t0 + 1) * BLOCK_E * BLOCK_N, h)
        tl.debug_barrier()  # the states are read back by other threads than wrote them
        for j in range(t1 - t0):  # the chunk's tokens backwards, h = h_t
            t = t1 - 1 - j
            d = tl.load(dt + (b * T + t) * E + e, mask=e_in, other=0.0).to(tl.float32)  # (BLOCK_E,)
            xv = tl.load(x + (b * T + t) * E + e, mask=e_in, other=0.0).to(tl.float32)
            gyt = tl.load(gy + (b * T + t) * E + e, mask=e_in, other=0.0).to(tl.float32)
            Bt = tl.load(Bm + (b * T + t) * N + n, mask=n_in, other=0.0).to(tl.float32)  # (BLOCK_N,)
            Ct = tl.load(Cm + (b * T + t) * N + n, mask=n_in, other=0.0).to(tl.float32)
            h_prev = tl.load(scratch + (t - t0) * BLOCK_E * BLOCK_N)  # (BLOCK_E, BLOCK_N)
            a = tl.exp(d[:, None] * A_)
            gn = g + gyt[:, None] * Ct[None, :]
            gdecay = gn * a * h_prev
            gA_ += gdecay * d[:, None]
            gd = tl.sum(gdecay * A_ + gn * xv[:, None] * Bt[None, :], 1)
            tl.store(gdt + (b * T + t) * E + e, gd.to(gdt.dtype.element_ty), mask=e_in)
            tl.store(gx + (b * T + t) * E + e, (d * tl.sum(gn * Bt[None, :], 1)).to(gx.dtype.element_ty), mask=e_in)
            tl.store(gB + (part * T + t) * N + n, tl.sum(gn * (d * xv)[:, None], 0), mask=n_in)
            tl.store(gC + (part * T + t) * N + n, tl.sum(gyt[:, None] * h, 0), mask=n_in)
            g = gn * a
            h = h_prev
        tl.debug_barrier()  # every thread done reading the scratch before the next chunk overwrites it
    tl.store(gh0 + b * E * N + en, g.to(gh0.dtype.element_ty), mask=en_in)
    tl.store(gA + b * E * N + en, gA_, mask=en_in)


class _SelectiveScanTriton(torch.autograd.Function):
    """The kernels under autograd, A (G, E, N) grouped as ``_forward`` takes it; under ``torch.func.vmap`` the model
    axis folds into the batch, as the CPU kernel's ``_SelectiveScan`` does."""

    @staticmethod
    def forward(dt, x, A, Bm, Cm, h0):
        dt, x, A, Bm, Cm, h0 = (t.detach().contiguous() for t in (dt, x, A, Bm, Cm, h0))
        (Bsz, T, E), N = dt.shape, A.shape[2]
        n_chunks = triton.cdiv(T, CHECKPOINT)
        y, hT = torch.empty_like(x), torch.empty_like(h0)
        saved = dt.new_empty(Bsz, E, n_chunks, N, dtype=torch.float32)
        _forward[(Bsz, triton.cdiv(E, BLOCK_E))](
            dt, x, A, Bm, Cm, h0, y, hT, saved, T, E, N, n_chunks, Bsz // A.shape[0],
            CHUNK=CHECKPOINT, BLOCK_E=BLOCK_E, BLOCK_N=triton.next_power_of_2(N), num_warps=WARPS,
        )  # fmt: skip
        return y, hT, saved

    @staticmethod
    def setup_context(ctx, inputs, output):
        dt, x, A, Bm, Cm, h0 = inputs
        ctx.mark_non_differentiable(output[2])
        ctx.save_for_backward(dt, x, A, Bm, Cm, output[2])
        ctx.h0_dtype = h0.dtype

    @staticmethod
    def backward(ctx, gy, ghT, _):
        dt, x, A, Bm, Cm, saved = (t.detach().contiguous() for t in ctx.saved_tensors)
        (Bsz, T, E), (G, _, N) = dt.shape, A.shape
        n_blocks, BLOCK_N = triton.cdiv(E, BLOCK_E), triton.next_power_of_2(N)
        gy = gy.contiguous() if gy is not None else torch.zeros_like(x)
        ghT = ghT.contiguous() if ghT is not None else saved.new_zeros(Bsz, E, N)
        gdt, gx = torch.empty_like(dt), torch.empty_like(x)
        gh0 = dt.new_empty(Bsz, E, N, dtype=ctx.h0_dtype)
        gA = saved.new_empty(Bsz, E, N)  # per batch row
        gB, gC = (saved.new_empty(Bsz, n_blocks, T, N) for _ in range(2))  # per block of channels
        hs = saved.new_empty(Bsz, n_blocks, CHECKPOINT + 1, BLOCK_E, BLOCK_N)
        _backward[(Bsz, n_blocks)](
            dt, x, A, Bm, Cm, saved, gy, ghT, gdt, gx, gA, gB, gC, gh0, hs, T, E, N, saved.shape[2], Bsz // G,
            CHUNK=CHECKPOINT, BLOCK_E=BLOCK_E, BLOCK_N=BLOCK_N, num_warps=WARPS,
        )  # fmt: skip
        gA = gA.view(G, -1, E, N).sum(1)  # (G, E, N): each group's rows
        return gdt, gx, gA.to(A.dtype), gB.sum(1).to(Bm.dtype), gC.sum(1).to(Cm.dtype), gh0

    @staticmethod
    def vmap(info, in_dims, *inputs):
        y, hT, saved = _SelectiveScanTriton.apply(*(fold(t, d, info.batch_size) for t, d in zip(inputs, in_dims)))
        return tuple(unfold(t, info.batch_size) for t in (y, hT, saved)), (0, 0, 0)


def selective_scan_triton(dt, x, A, Bm, Cm, h0):
    """Same contract as ``selective_scan_reference``; float32 inside, y in x's dtype and h_T in h0's."""
    y, hT, _ = _SelectiveScanTriton.apply(dt, x, A[None], Bm, Cm, h0)  # one group: every row decays by A
    return y, hT
