"""min_gru (a worked example, not registered in the product): the minimal GRU of Feng et al. 2024 as the mixer of
the block stack. Its gate and candidate read the input only, never the state:

    z_t = sigmoid(W_z x_t),  c_t = W_c x_t,  h_t = (1 - z_t) h_{t-1} + z_t c_t,  out_t = W_o h_t

so one matmul gives every position's gate and candidate, and decoding keeps h alone (a constant state)."""

from __future__ import annotations

import torch
import torch.nn as nn

from models.backbone import BlockStack, Cache, Mixer
from models.registry import Option, register


class MinGRU(Mixer):
    def __init__(self, width: int, expand: int):
        super().__init__()
        self.hidden = expand * width  # E, the recurrent state's width
        self.gates = nn.Linear(width, 2 * self.hidden)  # z and c together
        self.out = nn.Linear(self.hidden, width)  # back to the residual width (the block has no projection)

    def forward(self, x: torch.Tensor, cache: Cache | None = None, layer: int = 0) -> torch.Tensor:
        z, c = self.gates(x).chunk(2, dim=-1)  # (B, T, E) each
        z = torch.sigmoid(z)
        # with a cache, continue from the state the previous call left in it: prefill and one-token steps alike
        state = cache.layers[layer] if cache is not None else {}
        h = state.get("h", x.new_zeros(x.shape[0], self.hidden))  # (B, E)
        hs = []
        for t in range(x.shape[1]):  # a plain loop: readable, and fast enough at the tests' lengths
            h = (1 - z[:, t]) * h + z[:, t] * c[:, t]
            hs.append(h)
        if cache is not None:
            state["h"] = h
        return self.out(torch.stack(hs, 1))  # (B, T, D)

    def exact_flops(self, length: int) -> int:
        # per token and state channel: (1 - z) h and z c, two multiply-adds (the Linear layers count elsewhere)
        return 2 * length * 2 * self.hidden

    def state_bytes(self, length: int, bytes_per_value: int = 4) -> int:
        return self.hidden * bytes_per_value  # h, whatever the length


@register("min_gru", expand=Option(1, int, 1))
def build(*, vocab_size, width, depth, heads, max_len, dropout, expand):
    """Minimal GRU mixer, state width expand x width; no positions (the recurrence knows order; heads unused)."""
    return BlockStack(
        "min_gru",
        vocab_size,
        width,
        depth,
        max_len,
        dropout,
        lambda: MinGRU(width, expand),
        positions="none",
        proj=False,
    )
