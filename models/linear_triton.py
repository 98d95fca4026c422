"""The unnormalised chunked scan of ``models.linear`` as a Triton kernel, for CUDA tensors (retnet, linear_nofm,
and linear through ``normalized``). Tested on the CPU under Triton's interpreter.

Per batch row and head, with S_t = gamma S_{t-1} + k_t v_t^T (dk x dv) from S_0:

    out_t = q_t^T S_t

One program per (batch row, head, block of BLOCK_V value columns, tile of at most KEY_TILE key dimensions) walks the
chunks of BLOCK_T tokens in order, with its (key tile, BLOCK_V) slice of S in float32 registers, and every product in
float32 (TF32 where torch's are, and for bf16 inputs: more exact than their bf16 products under autocast, and the only
dtype Triton's interpreter multiplies right). A chunk of positions i, j < BLOCK_T (C valid tokens) that starts
from S is, in three products (the chunked form of ``chunked_scan``):

    out = (q S) gamma^(i + 1) + ((q k^T) * Gamma) v,      Gamma[i, j] = gamma^(i - j) for j <= i, else 0
    S  <- gamma^C S + (k gamma^(C - 1 - j))^T v

Both of out's terms are sums over the key dimensions, so a key tile's program computes its share of out from its own
columns of q and k (q k^T = the sum over tiles of q_tile k_tile^T), and the shares are added after the kernel. Heads up
to KEY_TILE wide take one tile, as before; a head of 256 (the DP paper's width 1024 over 4 heads) takes two, each
state tile half the registers that one (256, BLOCK_V) tile spilled, with more warps.

The backward pass is the same kernel three times (``_LinearScan.backward``): dq is the scan of (do, v, k) from S_0^T,
and dk and dv are scans of (v, do, q) and (k, q, do) run backwards in time.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from models.kernels import fold, unfold

# tokens per chunk and value columns per program: tl.dot needs every side >= 16; 32 tokens keep the (BLOCK_T, dk)
# tiles and the (dk, BLOCK_V) state within registers for heads up to 128 wide (untuned: no GPU measured). A wider
# head's keys are split into tiles of KEY_TILE, run with TILED_WARPS warps (untuned too: bench_gpu's
# `linear@dk256` row measures it beside today's head-dim-128 rows, on a GPU only)
BLOCK_T = 32
BLOCK_V = 64
KEY_TILE = 128
TILED_WARPS = 8


@triton.jit
def _scan(
    q, k, v, gamma, S0, out, ST, T, H, DK, DV,
    HAS_S0: tl.constexpr, REVERSE: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """q, k (B, H, T, DK); v (B, H, T, DV); out (NK, B, H, T, DV), a share for each of NK key tiles of BLOCK_K; gamma
    (H,); S0, ST (B, H, DK, DV): the state before the first token and after the last. REVERSE: token t of the scan
    is T - 1 - t of the tensors."""
    bh = tl.program_id(0).to(tl.int64)  # batch row times H plus head
    tile = tl.program_id(2).to(tl.int64)  # the key tile
    out = out + tile * tl.num_programs(0).to(tl.int64) * T * DV  # its share of out
    logg = tl.log(tl.load(gamma + bh % H).to(tl.float32))  # log 1 = 0 for linear attention
    i = tl.arange(0, BLOCK_T)  # (BLOCK_T,): position in the chunk
    dk = tile * BLOCK_K + tl.arange(0, BLOCK_K)
    dv = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    kv_in = (dk < DK)[:, None] & (dv < DV)[None, :]  # (BLOCK_K, BLOCK_V)
    kv = bh * DK * DV + dk[:, None] * DV + dv[None, :]
    if HAS_S0:
        S = tl.load(S0 + kv, mask=kv_in, other=0.0).to(tl.float32)  # (BLOCK_K, BLOCK_V)
    else:
        S = tl.zeros((BLOCK_K, BLOCK_V), dtype=tl.float32)
    # Gamma, with the exponent clamped at 0 above the diagonal (it would overflow there, and is masked anyway)
    Gamma = tl.where(i[:, None] >= i[None, :], tl.exp(logg * tl.maximum(i[:, None] - i[None, :], 0)), 0.0)
    into = tl.exp(logg * (i + 1))[:, None]  # (BLOCK_T, 1): how much of the chunk's start state reaches i
    for c in range(tl.cdiv(T, BLOCK_T)):
        C = tl.minimum(T - c * BLOCK_T, BLOCK_T)  # tokens in this chunk
        t = c * BLOCK_T + i
        if REVERSE:
            t = T - 1 - t
        row = bh * T + t  # (BLOCK_T,)
        tk_in = (i < C)[:, None] & (dk < DK)[None, :]  # (BLOCK_T, BLOCK_K); out of range: zeros, no contribution
        tv_in = (i < C)[:, None] & (dv < DV)[None, :]
        qc = tl.load(q + row[:, None] * DK + dk[None, :], mask=tk_in, other=0.0).to(tl.float32)  # (BLOCK_T, BLOCK_K)
        kc = tl.load(k + row[:, None] * DK + dk[None, :], mask=tk_in, other=0.0).to(tl.float32)
        vc = tl.load(v + row[:, None] * DV + dv[None, :], mask=tv_in, other=0.0).to(tl.float32)  # (BLOCK_T, BLOCK_V)
        A = tl.dot(qc, tl.trans(kc), input_precision=PRECISION) * Gamma  # (BLOCK_T, BLOCK_T)
        o = tl.dot(qc, S, input_precision=PRECISION) * into + tl.dot(A, vc, input_precision=PRECISION)
        tl.store(out + row[:, None] * DV + dv[None, :], o.to(out.dtype.element_ty), mask=tv_in)
        out_of = tl.exp(logg * tl.maximum(C - 1 - i, 0))[:, None]  # (BLOCK_T, 1): what of token i is left at the end
        S = tl.exp(logg * C) * S + tl.dot(tl.trans(kc * out_of), vc, input_precision=PRECISION)
    tl.store(ST + kv, S.to(ST.dtype.element_ty), mask=kv_in)


def _launch(q, k, v, S0, gamma, reverse: bool = False):
    """``_scan`` on contiguous inputs -> out (B, H, T, DV) in v's dtype, S_T (B, H, DK, DV) in S0's (else q's)."""
    q, k, v, gamma = (t.contiguous() for t in (q, k, v, gamma))
    B, H, T, DK = q.shape
    DV = v.shape[-1]
    block_k = min(KEY_TILE, max(16, triton.next_power_of_2(DK)))
    tiles = triton.cdiv(DK, block_k)
    # one key tile writes out itself; several write float32 shares, added here
    out = torch.empty_like(v)[None] if tiles == 1 else v.new_empty(tiles, *v.shape, dtype=torch.float32)
    ST = q.new_empty(B, H, DK, DV, dtype=S0.dtype if S0 is not None else q.dtype)
    block_v = min(BLOCK_V, max(16, triton.next_power_of_2(DV)))
    exact = q.dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32  # as torch's float32 products
    _scan[(B * H, triton.cdiv(DV, block_v), tiles)](
        q, k, v, gamma, S0.contiguous() if S0 is not None else ST, out, ST, T, H, DK, DV,
        HAS_S0=S0 is not None, REVERSE=reverse, PRECISION="ieee" if exact else "tf32",
        BLOCK_T=BLOCK_T, BLOCK_K=block_k, BLOCK_V=block_v, num_warps=4 if tiles == 1 else TILED_WARPS,
    )  # fmt: skip
    return (out[0] if tiles == 1 else out.sum(0).to(v.dtype)), ST


class _LinearScan(torch.autograd.Function):
    """gamma is a constant (a buffer), not differentiated. Under ``torch.func.vmap`` (the K models of a fused trial,
    ``models.fused``) the model axis folds into the heads: K models of H heads are one launch over K H heads, each
    with its own model's gamma (``vmap``)."""

    @staticmethod
    def forward(q, k, v, S0, gamma):
        return _launch(q.detach(), k.detach(), v.detach(), S0.detach() if S0 is not None else None, gamma)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, gout, gST):
        """dS_t, the gradient reaching S_t, is q_t do_t^T + gamma dS_(t+1): a scan backwards in time. So dk_t = dS_t v_t
        and dv_t = dS_t^T k_t are scans of (v, do, q) and (k, q, do) from the last token, and dq_t = S_t do_t is the
        forward scan of (do, v, k) from S_0^T. The final state's gradient gST reaches token t as gamma^(T - 1 - t) gST,
        and S_0 as gamma^T gST."""
        q, k, v, S0, gamma = ctx.saved_tensors
        T = q.shape[2]
        gout = gout if gout is not None else torch.zeros_like(v)
        dq, _ = _launch(gout, v, k, S0.transpose(-1, -2) if S0 is not None else None, gamma)
        dk, _ = _launch(v, gout, q, None, gamma, reverse=True)
        dv, R = _launch(k, q, gout, None, gamma, reverse=True)  # R = sum_t gamma^t q_t do_t^T
        logg = torch.log(gamma.float())[:, None, None]  # (H, 1, 1)
        dS0 = torch.exp(logg) * R.float()  # (B, H, dk, dv)
        if gST is not None:
            left = torch.exp(logg * torch.arange(T - 1, -1, -1, device=q.device)[:, None])  # (H, T, 1): gamma^(T-1-t)
            dk = dk + (left * (v.float() @ gST.float().transpose(-1, -2))).to(dk.dtype)
            dv = dv + (left * (k.float() @ gST.float())).to(dv.dtype)
            dS0 = dS0 + torch.exp(logg * T) * gST.float()
        return dq, dk, dv, dS0.to(S0.dtype) if S0 is not None else None, None

    @staticmethod
    def vmap(info, in_dims, q, k, v, S0, gamma):
        K = info.batch_size
        heads = (fold(t, d, K, into=1) for t, d in zip((q, k, v, S0), in_dims))  # (B, K H, ...)
        out, ST = _LinearScan.apply(*heads, fold(gamma, in_dims[4], K))  # gamma (K H,)
        return (unfold(out, K, at=1), unfold(ST, K, at=1)), (1, 1)


def linear_scan(q, k, v, S0: torch.Tensor | None, gamma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k (B, H, T, dk), v (B, H, T, dv), S0 (B, H, dk, dv) or None (zeros), gamma (H,) -> out (B, H, T, dv), S_T;
    float32 inside, out in v's dtype."""
    return _LinearScan.apply(q, k, v, S0, gamma)
