"""linear: Katharopoulos et al.'s linear attention with phi = elu + 1 (the DP paper's "linear Transformer"),
and the chunked scan it shares with retention (retnet) and the unnormalised linear Transformer (linear_nofm).

Per head, with S_t = gamma S_{t-1} + k_t v_t^T (dk x dv) and z_t = gamma z_{t-1} + k_t:

    out_t = q_t^T S_t / (q_t^T z_t + eps)      normalised (linear; gamma = 1, q, k = phi(.))
    out_t = q_t^T S_t                          unnormalised (retnet: gamma_h < 1; linear_nofm: gamma = 1)

Computed chunk by chunk from a carried state: inside a chunk the masked quadratic form
(q k^T * Gamma) v with Gamma[t, s] = gamma^(t-s) for s <= t, across chunks the state. Training runs the chunks
from a zero state; decoding is the same code with chunks of one token, so both forms agree by construction and
a step costs O(dk dv) per head whatever the position.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.backbone import BlockStack, Cache, Mixer, heads_view, merge_heads
from models.registry import Option, register


def chunked_scan(q, k, v, state: dict, gamma: torch.Tensor, normalize: bool, chunk: int, eps: float = 1e-6):
    """q, k (B, H, T, dk), v (B, H, T, dv), gamma (H,) -> (B, H, T, dv); updates ``state`` (S, and z if normalised)."""
    B, H, T, dk = q.shape
    S = state.get("S", q.new_zeros(B, H, dk, v.shape[-1]))  # (B, H, dk, dv)
    z = state.get("z", q.new_zeros(B, H, dk))  # (B, H, dk)
    out = []
    for c in range(0, T, chunk):
        qc, kc, vc = q[:, :, c : c + chunk], k[:, :, c : c + chunk], v[:, :, c : c + chunk]
        C = qc.shape[2]
        n = torch.arange(C, device=q.device, dtype=q.dtype)
        logg = torch.log(gamma)[:, None]  # (H, 1)
        decay = torch.exp(logg[..., None] * (n[:, None] - n[None, :])).tril()  # (H, C, C): gamma^(t-s), s <= t
        into = torch.exp(logg * (n + 1))[..., None]  # (H, C, 1): how much of the carried state reaches t
        out_of = torch.exp(logg * (C - 1 - n))[..., None]  # (H, C, 1): how much of s is left at the chunk end
        A = (qc @ kc.transpose(-1, -2)) * decay  # (B, H, C, C)
        num = (qc @ S) * into + A @ vc  # (B, H, C, dv)
        if normalize:
            den = (qc @ z.unsqueeze(-1)) * into + A.sum(-1, keepdim=True)  # (B, H, C, 1)
            num = num / (den + eps)
            z = gamma[:, None] ** C * z + (kc * out_of).sum(2)
        out.append(num)
        S = gamma[:, None, None] ** C * S + (kc * out_of).transpose(-1, -2) @ vc
    state["S"] = S
    if normalize:
        state["z"] = z
    return torch.cat(out, dim=2)


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
