"""linear: Katharopoulos et al.'s linear attention with phi = elu + 1 (the DP paper's "linear Transformer").

Per head, with S_i = sum_{j<=i} phi(k_j) v_j^T (hd x hd) and z_i = sum_{j<=i} phi(k_j):

    out_i = phi(q_i)^T S_i / (phi(q_i)^T z_i + eps)           no 1/sqrt(hd) scaling

Computed chunk by chunk from a carried state (S, z): inside a chunk the masked quadratic form, across chunks
the state. Training runs the chunks from a zero state; decoding is the same code with chunks of one token,
so both forms agree by construction and a step costs O(hd^2) per head whatever the position.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.registry import register
from models.transformer import Cache, LanguageModel, Mixer, heads_view, merge_heads


def phi(x: torch.Tensor) -> torch.Tensor:
    return F.elu(x) + 1


class LinearAttention(Mixer):
    def __init__(self, width: int, heads: int, chunk: int, eps: float = 1e-6):
        super().__init__()
        self.heads, self.chunk, self.eps = heads, chunk, eps
        self.qkv = nn.Linear(width, 3 * width)

    def forward(self, x: torch.Tensor, cache: Cache | None = None, layer: int = 0) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = (heads_view(t, self.heads) for t in self.qkv(x).split(D, dim=2))  # (B, H, T, hd)
        q, k = phi(q), phi(k)
        hd = D // self.heads
        state = cache.layers[layer] if cache is not None else {}
        S = state.get("S", q.new_zeros(B, self.heads, hd, hd))  # (B, H, hd, hd)
        z = state.get("z", q.new_zeros(B, self.heads, hd))  # (B, H, hd)
        out = []
        for c in range(0, T, self.chunk):
            qc, kc, vc = q[:, :, c:c + self.chunk], k[:, :, c:c + self.chunk], v[:, :, c:c + self.chunk]
            A = torch.tril(qc @ kc.transpose(-1, -2))  # (B, H, C, C): phi(q_i)^T phi(k_j), j <= i
            num = qc @ S + A @ vc  # (B, H, C, hd)
            den = (qc @ z.unsqueeze(-1)).squeeze(-1) + A.sum(-1)  # (B, H, C)
            out.append(num / (den.unsqueeze(-1) + self.eps))
            S = S + kc.transpose(-1, -2) @ vc
            z = z + kc.sum(2)
        if cache is not None:
            state["S"], state["z"] = S, z
        return merge_heads(torch.cat(out, dim=2))  # (B, T, D)

    def exact_flops(self, length: int) -> int:
        # recurrent form per token and head: S += k v^T (hd^2), z += k (hd), q^T S (hd^2), q^T z (hd)
        width = self.qkv.in_features
        hd = width // self.heads
        return 2 * length * self.heads * (2 * hd * hd + 2 * hd)

    def state_bytes(self, length: int, bytes_per_value: int = 4) -> int:
        hd = self.qkv.in_features // self.heads
        return self.heads * (hd * hd + hd) * bytes_per_value


@register("linear", chunk=64)
def build(*, vocab_size, width, depth, heads, max_len, dropout, chunk):
    """Normalised linear attention, phi = elu + 1, chunked prefix sums in training, O(1) state in decoding."""
    return LanguageModel(vocab_size, width, depth, heads, max_len, dropout,
                         lambda: LinearAttention(width, heads, chunk), "linear")
