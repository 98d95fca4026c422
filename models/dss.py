"""dss: a diagonal state space layer (Gupta et al. 2022, in S4D's ZOH parameterisation), in a pre-LN block with FFN.

Per channel d and complex mode n:  x_t = Abar x_{t-1} + Bbar u_t,  y_t = Re(C . x_t) + D_skip u_t, with
Abar = exp(dt Lambda), Bbar = (Abar - 1) / Lambda (zero-order hold), Lambda = -exp(log_re) + i im.
Training: the causal convolution y = K * u with K_l = Re(sum_n C_n Bbar_n Abar_n^l), by FFT.
Decoding: the recurrence, one step per token; prefill continues from the carried state.

The kernel never takes a complex power (``ssm_kernel_reference`` does: its pow and pow's gradient were most of
a training step). Abar^l = exp(l dt Lambda), and writing l = a + r b with r = ceil(sqrt(L)),

    K_l = Re sum_n (C_n Bbar_n exp(a dt Lambda_n)) exp(r b dt Lambda_n)           (``ssm_kernel``)

is one (r x N) @ (N x L/r) complex matmul per channel over 2 sqrt(L) exponentials per mode, not L.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.backbone import BlockStack, Cache, Mixer
from models.registry import Option, register


class DSS(Mixer):
    def __init__(self, width: int, modes: int):
        super().__init__()
        self.width, self.modes = width, modes
        self.log_re = nn.Parameter(torch.full((width, modes), math.log(0.5)))  # S4D-Lin init: Lambda = -1/2 + i pi n
        self.im = nn.Parameter(math.pi * torch.arange(modes, dtype=torch.float32).repeat(width, 1))
        self.C = nn.Parameter(torch.randn(width, modes, dtype=torch.cfloat) * modes**-0.5)
        self.log_dt = nn.Parameter(torch.empty(width).uniform_(math.log(1e-3), math.log(1e-1)))
        self.skip = nn.Parameter(torch.ones(width))

    def discrete(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(dt Lambda, Bbar), each (D, N) complex; Abar = exp(dt Lambda)."""
        lam = torch.complex(-torch.exp(self.log_re), self.im)
        dtlam = lam * torch.exp(self.log_dt)[:, None]
        return dtlam, (torch.exp(dtlam) - 1) / lam

    def forward(self, u: torch.Tensor, cache: Cache | None = None, layer: int = 0) -> torch.Tensor:
        B, T, D = u.shape
        dtlam, bbar = self.discrete()
        K = ssm_kernel(dtlam, self.C * bbar, T)  # (D, T)
        uf = u.transpose(1, 2)  # (B, D, T)
        n = 2 * T  # zero-padded FFT: a linear, not circular, convolution
        y = torch.fft.irfft(torch.fft.rfft(uf, n) * torch.fft.rfft(K, n), n)[..., :T] + self.skip[:, None] * uf
        if cache is not None:
            powers = torch.exp(dtlam[..., None] * torch.arange(T + 1, device=u.device))  # (D, N, T+1): Abar^l
            state = cache.layers[layer]
            if "x" in state:  # what the carried state adds at t: Re(C Abar^(t+1) x_prev)
                carried = (self.C[None, :, :, None] * powers[None, ..., 1:] * state["x"][..., None]).sum(2).real
                y = y + carried
                state["x"] = powers[None, ..., T] * state["x"]
            else:
                state["x"] = u.new_zeros(B, D, self.modes, dtype=bbar.dtype)  # complex, of the weights' precision
            # x_T += sum_s Abar^(T-1-s) Bbar u_s
            state["x"] = state["x"] + torch.einsum(
                "dnt,bdt->bdn", powers[..., :T].flip(-1) * bbar[..., None], uf.to(bbar.dtype)
            )
        return F.gelu(y.transpose(1, 2), approximate="tanh")  # (B, T, D)

    def exact_flops(self, length: int) -> int:
        # recurrent form, per token, channel and complex mode: Abar x (4 real multiply-adds), + Bbar u (2),
        # Re(C x) (2): 8 multiply-adds
        return 2 * 8 * length * self.width * self.modes

    def state_bytes(self, length: int, bytes_per_value: int = 4) -> int:
        return self.width * self.modes * 2 * bytes_per_value  # complex state


def ssm_kernel_reference(dtlam: torch.Tensor, W: torch.Tensor, length: int) -> torch.Tensor:
    """K_l = Re(sum_n W_n Abar_n^l) for l < length, Abar = exp(dt Lambda): (D, N), (D, N) -> (D, length)."""
    powers = torch.exp(dtlam)[..., None] ** torch.arange(length, device=W.device)  # (D, N, L)
    return (W[..., None] * powers).sum(1).real


def ssm_kernel(dtlam: torch.Tensor, W: torch.Tensor, length: int) -> torch.Tensor:
    """``ssm_kernel_reference`` with l = a + r b:  K_l = Re sum_n W_n exp(a dt Lambda_n) exp(r b dt Lambda_n)."""
    D = W.shape[0]
    r = math.isqrt(max(length - 1, 0)) + 1  # ceil(sqrt(length))
    s = -(-length // r)
    low = torch.exp(dtlam[..., None] * torch.arange(r, device=W.device))  # (D, N, r): Abar^a
    high = torch.exp(dtlam[..., None] * (r * torch.arange(s, device=W.device)))  # (D, N, s): Abar^(r b)
    K = high.transpose(1, 2) @ (W[..., None] * low)  # (D, s, r): K[d, b, a] = K_{a + r b}
    return K.real.reshape(D, s * r)[:, :length]


@register("dss", modes=Option(64, int, 1))
def build(*, vocab_size, width, depth, heads, max_len, dropout, modes):
    """Diagonal state space layer, ``modes`` complex modes per channel, FFT convolution in training."""
    return BlockStack("dss", vocab_size, width, depth, max_len, dropout, lambda: DSS(width, modes), positions="none")
