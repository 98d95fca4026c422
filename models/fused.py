"""K models of one architecture and shape as one module: their weights stacked on a leading model axis, so that one
forward pass (and one backward) trains all of them (horizontal fusion: HFTA, MLSys 2021; torch.func's model
ensembling).

Built from K members (``Fused(members)``), it keeps each parameter and buffer as one tensor of shape (K, ...)
(``torch.func.stack_module_state``) and runs the architecture's own forward under ``torch.func.vmap`` over the model
axis, on a weightless copy of a member (``functional_call`` on a model on the meta device):

    tokens (B, T), shared by every member, or (K, B, T), one batch each  ->  logits (K, B, T, V)

Member k's slice of every output and gradient is what member k alone computes: vmap batches each op over the model
axis, and every op is separate per member, so a loss on member i gives member j no gradient (and a non-finite
member stays its own). Dropout draws each member's masks apart (``randomness="different"``). Under autocast, vmap's
batching rules run before autocast, which reaches only the ops they call: a Linear's stacked bias is added in float32
(``SoftmaxAttention`` casts its inputs itself; docs/gpu.md says what that changes).

What is not batched by vmap itself:
- the scans' kernels (Mamba's numba and Triton kernels, the linear family's Triton kernel) are autograd Functions
  with a ``vmap`` rule that folds the model axis into an axis the kernel already walks (``models.kernels.fold``):
  the batch for Mamba, each model's rows decaying by their own A; the heads for the linear family, each with its
  own decay. One launch for K models;
- softmax attention on the CPU: PyTorch has no batching rule for its CPU flash-attention kernel, and vmap runs it
  member by member (its own per-member fallback). On CUDA, K members' attention takes flash or the math form only
  (``BATCHED_ATTENTION``: the other kernels' batching rules failed on an H200);
- ``nn.LSTM`` has no batching rule at all (nor any fallback), so an architecture that says so
  (``LanguageModel.unbatched``) runs its members one after another, each with its slice of the stacked weights.
``notes`` says which of these applies on a device, and the first forward pass on a device logs it (a warning of the
``models.fused`` logger): never silently.

Member k can be taken out as a model of its own (``member``, a copy of its weights: to decode, score or checkpoint
it as a separate trial would) and put back (``load_member``); ``member_state`` and ``stacked_state`` turn the fused
module's state dict into member k's, as the member's own model names it, and K of those back into one.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import warnings
from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call, stack_module_state, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel

from models.attention import SoftmaxAttention
from models.backbone import LanguageModel

log = logging.getLogger(__name__)

# the attention kernels K members may run under vmap: on an H200 (torch 2.11, 4 December) the memory-efficient
# kernel's batching rule failed, with a mask ("attn_bias: wrong shape (batch dimension)") and in backward ("LSE is not
# correctly aligned"), and cuDNN's under torch.compile ("expected Tensor() for op"); flash (bf16, no mask) ran fused.
# What flash cannot take (float32, a mask) runs the math form: plain ops, which vmap batches. The CPU's choice is left
# as it is (its flash kernel has no batching rule either way: vmap runs it member by member).
BATCHED_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]

# said by ``notes`` instead, once per model and device, not at every step
warnings.filterwarnings(
    "ignore",
    "There is a performance drop because we have not yet implemented the batching rule for "
    "aten::_scaled_dot_product_flash_attention_for_cpu",
)


class FusionError(ValueError):
    """Members that cannot be stacked: none, or of different architectures or shapes."""


def _attribute(name: str) -> str:
    """A dotted parameter name as an attribute of ``Fused`` (a module attribute cannot hold a dot)."""
    return name.replace(".", "/")


class Fused(nn.Module):
    """K members of one architecture and shape, weights stacked (K, ...); ``forward`` returns (K, B, T, V) logits."""

    template: LanguageModel  # the architecture on the meta device, outside the module tree (set in __init__)

    def __init__(self, members: Sequence[LanguageModel]):
        super().__init__()
        check_same_shape(members)
        first = members[0]
        self.size = len(members)
        self.arch, self.vocab_size, self.width, self.depth, self.max_len = (
            first.arch, first.vocab_size, first.width, first.depth, first.max_len,
        )  # fmt: skip
        self.unbatched = first.unbatched
        self.told: set[torch.device] = set()  # devices whose ``notes`` were logged
        params, buffers = stack_module_state(list(members))
        self.param_names, self.buffer_names = list(params), list(buffers)
        persistent = set(first.state_dict())
        for name, value in params.items():
            self.register_parameter(_attribute(name), nn.Parameter(value.detach()))  # stacked: its own memory
        for name, value in buffers.items():
            self.register_buffer(_attribute(name), value, persistent=name in persistent)
        # the architecture without weights: its forward runs on the stacked ones (outside the module tree, so that
        # it is neither a parameter holder nor moved by .to())
        self.__dict__["template"] = copy.deepcopy(first).to("meta")

    def stacked(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The stacked parameters and buffers by the members' names: each (K, ...)."""
        return (
            {name: getattr(self, _attribute(name)) for name in self.param_names},
            {name: getattr(self, _attribute(name)) for name in self.buffer_names},
        )

    def forward(
        self, tokens: torch.Tensor, members: Sequence[int] | None = None, at: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(B, T) tokens every member reads, or (M, B, T), the m-th member run reading tokens[m] -> (M, B, T, V)
        logits, of every member (M = K) or of ``members`` only (their weights gathered first: a validation's
        saving, where frozen members need no score); with ``at`` (B, R) positions, (M, B, R, V), the logits there
        only (``LanguageModel``)."""
        if tokens.device not in self.told:
            self.told.add(tokens.device)
            for note in self.notes(tokens.device):
                log.warning("fused %d models: %s", self.size, note)
        # dropout is the template's, outside the module tree: it follows this module's mode however that was set
        # (Lightning puts modes back after a validation by attribute, not by ``train()``)
        if self.template.training != self.training:
            self.template.train(self.training)
        params, buffers = self.stacked()
        if members is not None and list(members) != list(range(self.size)):
            index = torch.tensor(list(members), device=tokens.device)
            params = {n: p.index_select(0, index) for n, p in params.items()}
            buffers = {n: b.index_select(0, index) for n, b in buffers.items()}
        size = next(iter(params.values())).shape[0]
        per_member = tokens.dim() == 3
        if self.unbatched is None:
            run = vmap(self.call, in_dims=(0, 0, 0 if per_member else None, None), randomness="different")
            kernels = sdpa_kernel(BATCHED_ATTENTION) if tokens.device.type == "cuda" else contextlib.nullcontext()
            with kernels:
                return run(params, buffers, tokens, at)
        return torch.stack(
            [
                self.call(
                    {n: p[k] for n, p in params.items()},
                    {n: b[k] for n, b in buffers.items()},
                    tokens[k] if per_member else tokens,
                    at,
                )
                for k in range(size)
            ]
        )

    @torch.no_grad()
    def greedy(
        self, prompts: torch.Tensor, stop: int, members: Sequence[int] | None = None, batched: int = 2
    ) -> torch.Tensor:
        """(B, P) prompts -> (M, B, L): each member's greedy continuation (of ``members``, default all), what
        ``LanguageModel.greedy`` gives it, padded with -1 to the longest. The first ``batched`` tokens come from one
        batched forward a token; the members' caches are not stacked, so each such token recomputes the prefix, which
        for a short continuation (a classification's answer and <eos>: 2) costs about one cached decode in a K-th of
        the launches. A member with a row still going after them decodes alone, from the start, with its cache."""
        members = list(range(self.size)) if members is None else list(members)
        out = prompts.expand(len(members), *prompts.shape)  # (M, B, P)
        done = torch.zeros(out.shape[:2], dtype=torch.bool, device=prompts.device)  # (M, B)
        ends = torch.zeros(len(members), dtype=torch.long, device=prompts.device)  # (M,) where each stopped; 0: going
        for _ in range(batched):
            last = torch.full((out.shape[1], 1), out.shape[-1] - 1, device=out.device)  # (B, 1) the one read
            nxt = self(out, members, at=last)[:, :, -1].argmax(-1)  # (M, B)
            out = torch.cat([out, nxt[..., None]], -1)
            done |= nxt == stop
            ends = torch.where((ends == 0) & done.all(1), out.shape[-1], ends)
            if done.all() or out.shape[-1] - 1 >= self.max_len:  # as many tokens read as a full cache holds
                break
        # what a member decoded after its own last row stopped (the others going on) is not its own: cut
        after = torch.arange(out.shape[-1], device=out.device) >= ends[:, None, None]  # (M, 1, L)
        out = out.masked_fill(after & (ends[:, None, None] > 0), -1)
        going = (ends == 0).tolist()  # one read back a batch
        if not any(going) or out.shape[-1] - 1 >= self.max_len:
            return out
        alone = [self.member(k).eval().greedy(prompts, stop) if more else row
                 for k, more, row in zip(members, going, out, strict=True)]  # fmt: skip
        longest = max(a.shape[-1] for a in alone)
        return torch.stack([F.pad(a, (0, longest - a.shape[-1]), value=-1) for a in alone])

    def call(self, params: dict, buffers: dict, tokens: torch.Tensor, at: torch.Tensor | None = None) -> torch.Tensor:
        """One member's forward with the given weights: (B, T) -> (B, T, V), or (B, R, V) at positions ``at``."""
        return functional_call(self.template, (params, buffers), (tokens, None, at))

    def notes(self, device: torch.device) -> list[str]:
        """What of these members does not run as one batched call on ``device``, in words (empty: all of it does)."""
        if self.unbatched is not None:
            return [f"{self.arch}: {self.unbatched}: its {self.size} members run one after another"]
        if device.type == "cpu" and any(isinstance(m, SoftmaxAttention) for m in self.template.modules()):
            return [
                f"{self.arch}: PyTorch has no vmap batching rule for its CPU attention kernel: the {self.size} "
                "members' attention runs member by member (vmap's fallback), everything else batched"
            ]
        return []

    def member(self, k: int) -> LanguageModel:
        """Member k as a model of its own, on the stacked weights' device: a copy of its weights."""
        params, buffers = self.stacked()
        device = next(iter(params.values())).device
        model = copy.deepcopy(self.template).to_empty(device=device)
        with torch.no_grad():
            for name, value in (*model.named_parameters(), *model.named_buffers()):
                value.copy_((params | buffers)[name][k])
        return model

    def load_member(self, k: int, model: LanguageModel) -> None:
        """Member k's weights (and buffers) from ``model``, which must have the members' shape."""
        check_same_shape([self.template, model])
        params, buffers = self.stacked()
        with torch.no_grad():
            for name, value in (*model.named_parameters(), *model.named_buffers()):
                (params | buffers)[name][k].copy_(value)

    def exact_flops(self, length: int) -> int:
        """One member's forward FLOPs over one sequence (``LanguageModel.exact_flops``)."""
        return self.template.exact_flops(length)


def member_state(state: dict[str, torch.Tensor], k: int) -> dict[str, torch.Tensor]:
    """Member k's state dict (its model's own names) from a ``Fused`` module's (stacked, (K, ...) each)."""
    return {name.replace("/", "."): value[k].clone() for name, value in state.items()}


def stacked_state(states: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """A ``Fused`` module's state dict from its members' (each its model's own names), member k the k-th."""
    names = list(states[0])
    for i, other in enumerate(states[1:], 1):
        if list(other) != names:
            raise FusionError(f"member {i}'s state names differ from member 0's: they cannot be stacked")
    return {_attribute(name): torch.stack([s[name] for s in states]) for name in names}


def check_same_shape(members: Sequence[nn.Module]) -> None:
    """Raises ``FusionError`` naming the first difference unless every member has the first one's architecture, length
    and parameter and buffer names, shapes and dtypes. Options that leave every shape alone (an attention window, a
    scan's chunk) are the caller's to keep equal: a fused trial's members are one cell's."""
    if not members:
        raise FusionError("a fused model needs at least one member")

    def shape(m: nn.Module) -> dict[str, tuple]:
        return {n: (tuple(t.shape), t.dtype) for n, t in (*m.named_parameters(), *m.named_buffers())}

    def kind(m: nn.Module) -> tuple:
        return type(m).__name__, getattr(m, "arch", None), getattr(m, "max_len", None)

    first = members[0]
    for i, other in enumerate(members[1:], 1):
        if kind(other) != kind(first):
            raise FusionError(
                f"members of different architectures cannot be fused: member 0 is {kind(first)}, member {i} "
                f"{kind(other)} (class, architecture, max_len)"
            )
        a, b = shape(first), shape(other)
        if a != b:
            name = next(n for n in [*a, *b] if a.get(n) != b.get(n))  # the first in the model's order
            raise FusionError(
                f"members of different shapes cannot be fused: {kind(first)[1]}'s {name} is "
                f"{a.get(name, 'absent')} in member 0, {b.get(name, 'absent')} in member {i}"
            )
