"""Training K models of one shape as one (``models.fused``): the optimizer, the gradient clip and the step.

``FusedAdam`` is torch.optim.Adam (``decoupled=False``: weight decay, if any, added to the gradient) or AdamW
(``decoupled=True``) on stacked parameters (K, ...). Member k's slice of every parameter, moment and step count is
what a separate torch.optim.Adam(W) of member k holds, stepped with member k's own learning rate under the trial's
schedule (``SequenceModel.configure_optimizers_for``: linear warm-up over ``warmup`` steps, then constant; the rate
of a member's step n is its base rate times min(1, (n + 1) / warmup), as LambdaLR gives it). A step is tensor
operations only, nothing read back to the host, so that a CUDA graph can hold it.

A member that stops (its verdict is its own: solved, converged, diverged) is frozen (``freeze``): from then on its
parameters, moments and step count stay bit-identical while the others go on. Its forward and backward still run
inside the fused call, their result discarded; a caller that wants the compute back builds a smaller fused model of
the members still training (``Fused.member``), as learning-rate halving's rungs would.

``clip_per_member`` is the trial's gradient clip (``sweep.grad_clip``: Lightning's ``gradient_clip_val``, torch's
``clip_grad_norm_`` over all of one model's parameters) for each member apart.

``fused_step`` builds what one fused training step needs, for an architecture and shape, and ``FusedStep`` runs
it: what a benchmark times against one trial alone (its learning rates share the initialisation, as a cell's do).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import models
from models.fused import Fused
from pipeline.training.batches import IGNORE
from pipeline.training.settings import TrainSettings
from pipeline.training.train import decay_groups, warmup_steps


class FusedAdam(torch.optim.Optimizer):
    """Adam or AdamW over stacked parameters (K, ...), member k at ``lrs[k]``; see the module's docstring."""

    def __init__(
        self,
        params: Iterable,
        lrs: Sequence[float],
        *,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        decoupled: bool = True,
        warmup: int = 1,
    ):
        groups = list(params)
        first = groups[0]["params"][0] if isinstance(groups[0], dict) else groups[0]
        self.size = len(lrs)
        defaults = dict(
            lrs=torch.tensor(lrs, dtype=torch.float64, device=first.device),  # (K,)
            active=torch.ones(self.size, dtype=torch.bool, device=first.device),  # (K,): not frozen
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            decoupled=decoupled,
            warmup=warmup,
        )
        super().__init__(groups, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.shape[0] != self.size:
                    raise ValueError(f"a parameter of shape {tuple(p.shape)} is not stacked for {self.size} members")

    def freeze(self, members: Iterable[int]) -> None:
        """From now on these members' parameters, moments and step counts stay as they are."""
        for group in self.param_groups:
            group["active"] = group["active"].clone()  # groups may share one tensor: each gets its own
            group["active"][list(members)] = False

    @property
    def active(self) -> torch.Tensor:
        """(K,) bool: the members still training."""
        return self.param_groups[0]["active"]

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros(self.size, dtype=torch.float64, device=p.device)  # (K,)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                for key in ("lrs", "active"):  # a loaded state_dict's are where the checkpoint was read
                    group[key] = group[key].to(p.device)
                state["step"] = step = state["step"].to(p.device)
                active = group["active"]
                # (K,) in float64, as torch's Python floats: this step's rate (the factor of the steps before it)
                lr = group["lrs"] * torch.clamp((step + 1) / group["warmup"], max=1.0)
                taken = step + active  # (K,): the steps taken after this one
                param, grad = p, p.grad
                if group["weight_decay"] and group["decoupled"]:
                    param = p * per_member(1 - lr * group["weight_decay"], p)
                elif group["weight_decay"]:
                    grad = grad.add(p, alpha=group["weight_decay"])
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                if p.is_complex():  # as torch's Adam: real and imaginary parts as two reals
                    param, grad = torch.view_as_real(param), torch.view_as_real(grad)
                    exp_avg, exp_avg_sq = torch.view_as_real(exp_avg), torch.view_as_real(exp_avg_sq)
                m = exp_avg.lerp(grad, 1 - beta1)
                v = (exp_avg_sq * beta2).addcmul_(grad, grad, value=1 - beta2)
                denom = (v.sqrt() / per_member((1 - beta2**taken).sqrt(), v)).add_(group["eps"])
                stepped = param + per_member(-lr / (1 - beta1**taken), m) * (m / denom)
                keep = per_member(active, m).bool()  # a frozen member's values are left as they are, bit for bit
                target = torch.view_as_real(p) if p.is_complex() else p
                for old, new in ((target, stepped), (exp_avg, m), (exp_avg_sq, v)):
                    old.copy_(torch.where(keep, new, old))
                step.copy_(taken)
        return loss


def per_member(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """(K,) -> (K, 1, ...), broadcasting over ``like`` (K, ...), in its (real) dtype."""
    dtype = like.real.dtype if like.is_complex() else like.dtype
    return values.to(dtype).view(-1, *[1] * (like.dim() - 1))


@torch.no_grad()
def clip_per_member(params: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scales each member's gradients so that their norm over all its parameters is at most ``max_norm``, as
    torch's ``clip_grad_norm_`` does for one model; returns the norms before (K,)."""
    grads = [p.grad for p in params if p.grad is not None]
    # (P, K): each parameter's norm per member, then each member's over all its parameters
    norms = torch.stack([torch.linalg.vector_norm(g, 2, dim=tuple(range(1, g.dim()))) for g in grads])
    total = torch.linalg.vector_norm(norms, 2, dim=0)  # (K,)
    scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(per_member(scale, g))
    return total


def member_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(K, B, T, V) logits, (B, T) or (K, B, T) next tokens (``IGNORE`` where none is predicted) -> (K,): each
    member's next-token cross-entropy, averaged over its predicted positions (``SequenceModel.loss``)."""
    K = logits.shape[0]
    targets = targets.expand(K, *targets.shape[-2:])  # (K, B, T)
    each = F.cross_entropy(logits.flatten(0, 2), targets.flatten(), ignore_index=IGNORE, reduction="none")
    predicted = targets != IGNORE
    return each.view(K, -1).sum(1) / predicted.flatten(1).sum(1)


@dataclass
class FusedStep:
    """One training step of K fused members: forward, each member's loss, backward, each member's gradient clip,
    ``FusedAdam``'s step. Returns the members' losses (K,) before the step."""

    model: Fused
    optimizer: FusedAdam
    grad_clip: float | None = None

    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        losses = member_losses(self.model(inputs), targets)
        losses.sum().backward()  # each member's gradient is its own loss's: no gradient crosses members
        if self.grad_clip is not None:
            clip_per_member(self.model.parameters(), self.grad_clip)
        self.optimizer.step()
        return losses.detach()


def fused_optimizer(model: Fused, lrs: Sequence[float], settings: TrainSettings, total_steps: int) -> FusedAdam:
    """``SequenceModel.configure_optimizers_for`` for fused members: plain Adam (``optimizer: adam``, no weight
    decay), else AdamW with weight decay on matrices only; warm-up over ``warmup_fraction`` of ``total_steps``."""
    warmup = warmup_steps(settings, total_steps)
    if settings.optimizer == "adam":
        return FusedAdam(model.parameters(), lrs, decoupled=False, warmup=warmup)
    return FusedAdam(decay_groups(model.parameters(), settings.weight_decay, matrix=3), lrs, warmup=warmup)


def fused_step(
    arch: str,
    lrs: Sequence[float],
    settings: TrainSettings,
    *,
    vocab_size: int,
    width: int,
    depth: int,
    max_len: int,
    options: dict | None = None,
    total_steps: int = 1,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> FusedStep:
    """One member per learning rate in ``lrs``, each initialised as a trial of the cell seeded ``seed`` is (so all
    alike), fused on ``device`` with its optimizer under ``settings`` (heads, dropout, optimizer, weight decay,
    warm-up over ``total_steps``, gradient clip): call the result with (inputs, targets) to train one step."""
    torch.manual_seed(seed)
    model = models.build_model(
        arch,
        vocab_size=vocab_size,
        width=width,
        depth=depth,
        heads=settings.heads,
        max_len=max_len,
        dropout=settings.dropout,
        **(options or {}),
    )
    fused = Fused([model] * len(lrs)).to(device)
    return FusedStep(fused, fused_optimizer(fused, lrs, settings, total_steps), settings.grad_clip)
