"""mamba: the selective state space block of Gu & Dao 2023 in plain PyTorch (mamba-ssm's kernels need CUDA and nvcc).

    x, z = in_proj(u)                                 (B, T, E) each, E = expand * D
    x = SiLU(causal depthwise conv_k(x))              width-k convolution
    dt, B, C = softplus(dt_proj(.)), x_proj(x) splits  input-dependent step and projections
    h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t           A = -exp(A_log), (E, N) diagonal   (Alg. 2, selective scan)
    y_t = C_t . h_t + D x_t,   out = out_proj(y * SiLU(z))

The scan (``models.selective_scan``) is a fused CPU kernel for float32 on the CPU, its Triton twin on CUDA, and a
parallel (chunked, log-space) torch form on any other device or dtype (or on CUDA without triton), in training,
prefill and decoding alike, all tested against the plain per-token loop. The block is Mamba's own:
x += Mamba(LN(x)), no FFN.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.backbone import BlockStack, Cache, Mixer
from models.registry import Option, register


class Mamba(Mixer):
    def __init__(self, width: int, d_state: int, expand: int, conv: int):
        super().__init__()
        E, self.N, self.k = expand * width, d_state, conv
        self.E, self.rank = E, math.ceil(width / 16)
        self.in_proj = nn.Linear(width, 2 * E)
        self.conv = nn.Conv1d(E, E, conv, groups=E)
        self.x_proj = nn.Linear(E, self.rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(self.rank, E)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, d_state + 1, dtype=torch.float32)).repeat(E, 1))
        self.D = nn.Parameter(torch.ones(E))
        self.out_proj = nn.Linear(E, width)
        # imported where a Mamba is built, not where the registry is read: the scan's module imports numba and
        # torch._dynamo (for ``torch.compiler.disable``), 1.4 CPU-s that the sweep driver and the report need not pay
        from models.selective_scan import selective_scan

        self.scan = selective_scan

    def reset_parameters(self) -> None:
        """dt_proj's bias so that softplus(bias) is log-uniform in [1e-3, 1e-1] (Mamba's init)."""
        dt = torch.exp(torch.empty(self.E).uniform_(math.log(1e-3), math.log(1e-1)))
        with torch.no_grad():
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus

    def forward(self, u: torch.Tensor, cache: Cache | None = None, layer: int = 0) -> torch.Tensor:
        Bsz, T, _ = u.shape
        state = cache.layers[layer] if cache is not None else {}
        x, z = self.in_proj(u).chunk(2, dim=-1)  # (B, T, E) each
        x = x.transpose(1, 2)  # (B, E, T)
        past = state.get("conv", x.new_zeros(Bsz, self.E, self.k - 1))  # the last k-1 inputs, zeros at the start
        x = torch.cat([past, x], dim=2)  # (B, E, k-1+T)
        if cache is not None:
            state["conv"] = x[:, :, -(self.k - 1) :]
        x = F.silu(self.conv(x)).transpose(1, 2)  # (B, T, E)
        dt, Bm, Cm = self.x_proj(x).split([self.rank, self.N, self.N], dim=-1)
        dt = F.softplus(self.dt_proj(dt))  # (B, T, E)
        A = -torch.exp(self.A_log)  # (E, N)
        y, h = self.scan(dt, x, A, Bm, Cm, state.get("h", x.new_zeros(Bsz, self.E, self.N)))  # (B, T, E)
        if cache is not None:
            state["h"] = h  # (B, E, N)
        y = y + self.D * x  # (B, T, E)
        return self.out_proj(y * F.silu(z))

    def exact_flops(self, length: int) -> int:
        # depthwise conv: k multiply-adds per channel and token; scan per (channel, state): dt*A, the decay times
        # h, dt*x times B, C . h: 4 multiply-adds
        return 2 * length * self.E * (self.k + 4 * self.N)

    def state_bytes(self, length: int, bytes_per_value: int = 4) -> int:
        return self.E * (self.N + self.k - 1) * bytes_per_value


# conv >= 2: the decoding cache keeps the last conv - 1 inputs
@register("mamba", d_state=Option(16, int, 1), expand=Option(2, int, 1), conv=Option(4, int, 2))
def build(*, vocab_size, width, depth, heads, max_len, dropout, d_state, expand, conv):
    """Selective SSM block (d_state 16, expand 2, conv 4), no FFN, no position embedding (heads unused)."""
    model = BlockStack(
        "mamba",
        vocab_size,
        width,
        depth,
        max_len,
        dropout,
        lambda: Mamba(width, d_state, expand, conv),
        positions="none",
        proj=False,
        ffn=False,
    )
    for block in model.blocks:
        mixer = block.mixer
        assert isinstance(mixer, Mamba)  # made by the lambda above
        mixer.reset_parameters()
    return model
