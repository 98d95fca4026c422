"""linear: Katharopoulos et al.'s linear attention with phi = elu + 1 (the DP paper's "linear Transformer"),
and the chunked scan it shares with retention (retnet) and the unnormalised linear Transformer (linear_nofm).

Per head, with S_t = gamma S_{t-1} + k_t v_t^T (dk x dv) and z_t = gamma z_{t-1} + k_t:

    out_t = q_t^T S_t / (q_t^T z_t + eps)      normalised (linear; gamma = 1, q, k = phi(.))
    out_t = q_t^T S_t                          unnormalised (retnet: gamma_h < 1; linear_nofm: gamma = 1)

``chunked_scan`` computes every chunk at once, with no loop over chunks (the chunked form of
flash-linear-attention and of RetNet's paper, in plain torch ops, so it runs on any device): inside a chunk the
masked quadratic form (q k^T * Gamma) v with Gamma[t, s] = gamma^(t-s) for s <= t; across chunks the state each
chunk starts from, a decayed sum of the earlier chunks' contributions (one (n, n) product over the n chunks).
Decoding is the same code on one token. On CUDA the unnormalised scan runs as a Triton kernel instead
(``models.linear_triton``, where triton is installed; ``models.kernels`` chooses), the normalised one through
it. ``scan_reference`` is the recurrence a token at a time, which all are tested against.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.backbone import BlockStack, Cache, Mixer, heads_view, merge_heads
from models.kernels import triton_ready
from models.registry import Option, register


def chunked_scan(q, k, v, state: dict, gamma: torch.Tensor, normalize: bool, chunk: int, eps: float = 1e-6):
    """q, k (B, H, T, dk), v (B, H, T, dv), gamma (H,) -> (B, H, T, dv); updates ``state`` (S, and z if normalised).

    With T in n chunks of C tokens (the last one possibly shorter, of length C_n), chunk c's own contribution to
    the state at its end is U_c = sum_s gamma^(end_c - s) k_s v_s^T, and the state it starts from is
        S_(c) = gamma^(C c) S_0 + sum_(j < c) gamma^(C (c - 1 - j)) U_j
    so every chunk's output is its intra-chunk form plus (q_t^T S_(c)) gamma^(t + 1), all in batched products.
    Normalised, z is S's column for a value of ones: the denominators come out of the same products.
    """
    if normalize:
        return normalized(chunked_scan, q, k, v, state, gamma, chunk=chunk, eps=eps)
    if triton_ready(q, k, v, gamma, *state.values()):
        from models.linear_triton import linear_scan  # imports triton: only where it runs

        out, state["S"] = linear_scan(q, k, v, state.get("S"), gamma)  # its own chunks of BLOCK_T tokens
        return out
    B, H, T, dk = q.shape
    dv = v.shape[-1]
    n = -(-T // chunk)
    C = -(-T // n)  # n chunks of at most ``chunk`` tokens, as even as can be: the least padding
    S0 = state.get("S", q.new_zeros(B, H, dk, dv))  # (B, H, dk, dv)
    pad = n * C - T  # the last chunk padded with zero keys and values (no contribution), its padded outputs dropped
    qc, kc, vc = (F.pad(t, (0, 0, 0, pad)).view(B, H, n, C, -1) for t in (q, k, v))  # (B, H, n, C, d)
    logg = torch.log(gamma).to(q.dtype)[:, None, None]  # (H, 1, 1); log 1 = 0 for linear attention
    t = torch.arange(C, device=q.device, dtype=q.dtype)
    c = torch.arange(n, device=q.device, dtype=q.dtype)
    length = (T - c * C).clamp(max=C)[:, None]  # (n, 1): tokens of each chunk
    # Gamma: gamma^(t - s) for s <= t, else 0 (the exponent is masked before exp: it would overflow above s > t)
    decay = torch.exp((logg * (t[:, None] - t[None, :])).masked_fill(t[None, :] > t[:, None], float("-inf")))
    into = torch.exp(logg * (t + 1))[..., None]  # (H, 1, C, 1): how much of the chunk's start state reaches t
    out_of = torch.exp(logg * (length - 1 - t).clamp(min=0))[..., None]  # (H, n, C, 1): what of s is left at the end
    between = c[:, None] - 1 - c[None, :]  # (n, n): chunks between j and c, when j < c
    carry = torch.exp((logg * C * between).masked_fill(between < 0, float("-inf")))  # (H, n, n)
    start = torch.exp(logg * C * c[:, None])[..., None]  # (H, n, 1, 1): what of S_0 reaches chunk c's start

    U = (kc * out_of).transpose(-1, -2) @ vc  # (B, H, n, dk, dv)
    S = torch.einsum("hcj,bhjkv->bhckv", carry, U) + start * S0[:, :, None]  # (B, H, n, dk, dv)
    A = (qc @ kc.transpose(-1, -2)) * decay[:, None]  # (B, H, n, C, C)
    out = (qc @ S) * into + A @ vc  # (B, H, n, C, dv)
    last = torch.exp(logg * length[-1])  # (H, 1, 1): gamma^(C_n)
    state["S"] = last * S[:, :, -1] + U[:, :, -1]
    return out.view(B, H, n * C, dv)[:, :, :T]


def normalized(scan, q, k, v, state: dict, gamma: torch.Tensor, eps: float, **options) -> torch.Tensor:
    """The normalised form from an unnormalised ``scan``: z_t = sum gamma^(t-s) k_s is S's column for a value of
    ones, so out = (q^T S) / (q^T z + eps) is the first dv columns over the last."""
    inner = {"S": torch.cat([state["S"], state["z"][..., None]], -1)} if "S" in state else {}
    ones = v.new_ones(*v.shape[:-1], 1)
    out = scan(q, k, torch.cat([v, ones], -1), inner, gamma, False, **options)  # (B, H, T, dv + 1)
    state["S"], state["z"] = inner["S"][..., :-1], inner["S"][..., -1]
    return out[..., :-1] / (out[..., -1:] + eps)


def scan_reference(q, k, v, state: dict, gamma: torch.Tensor, normalize: bool, eps: float = 1e-6):
    """``chunked_scan``'s contract, the recurrence S_t = gamma S_(t-1) + k_t v_t^T one token at a time."""
    if normalize:
        return normalized(scan_reference, q, k, v, state, gamma, eps=eps)
    B, H, T, dk = q.shape
    S = state.get("S", q.new_zeros(B, H, dk, v.shape[-1]))  # (B, H, dk, dv)
    g = gamma.to(q.dtype)[:, None, None]  # (H, 1, 1)
    out = []
    for t in range(T):
        S = g * S + k[:, :, t, :, None] * v[:, :, t, None, :]
        out.append((q[:, :, t, None, :] @ S)[:, :, 0])  # (B, H, dv)
    state["S"] = S
    return torch.stack(out, 2)


class LinearAttention(Mixer):
    """Normalised linear attention, phi = elu + 1, no 1/sqrt(hd) scaling (Katharopoulos et al. 2020, eq. 6)."""

    gamma: torch.Tensor  # a buffer: per-head decay, 1

    def __init__(self, width: int, heads: int, chunk: int):
        super().__init__()
        self.heads, self.chunk = heads, chunk
        self.qkv = nn.Linear(width, 3 * width)
        self.register_buffer("gamma", torch.ones(heads), persistent=False)

    def forward(self, x: torch.Tensor, cache: Cache | None = None, layer: int = 0) -> torch.Tensor:
        q, k, v = (heads_view(t, self.heads) for t in self.qkv(x).split(x.shape[-1], dim=2))  # (B, H, T, hd)
        state = cache.layers[layer] if cache is not None else {}
        return merge_heads(chunked_scan(F.elu(q) + 1, F.elu(k) + 1, v, state, self.gamma, True, self.chunk))

    def exact_flops(self, length: int) -> int:
        # recurrent form per token and head: S += k v^T (hd^2), z += k (hd), q^T S (hd^2), q^T z (hd)
        hd = self.qkv.in_features // self.heads
        return 2 * length * self.heads * (2 * hd * hd + 2 * hd)

    def state_bytes(self, length: int, bytes_per_value: int = 4) -> int:
        hd = self.qkv.in_features // self.heads
        return self.heads * (hd * hd + hd) * bytes_per_value


@register("linear", chunk=Option(64, int, 1))
def build(*, vocab_size, width, depth, heads, max_len, dropout, chunk):
    """Normalised linear attention, phi = elu + 1, chunked prefix sums in training, O(1) state in decoding."""
    return BlockStack(
        "linear", vocab_size, width, depth, max_len, dropout, lambda: LinearAttention(width, heads, chunk)
    )
