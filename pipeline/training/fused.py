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

A member's slice of the optimizer is also what a separate trial's checkpoint holds (``member_state``: its
torch.optim.Adam(W) state dict and its LambdaLR's), and K of those load back into one (``load_state_dict`` of
``{"members": [...], "active": [...]}``): a fused trial's members are checkpointed, and resumed, as separate trials.

``clip_per_member`` is the trial's gradient clip (``sweep.optim.grad_clip``: Lightning's ``gradient_clip_val``, torch's
``clip_grad_norm_`` over all of one model's parameters) for each member apart.

``fused_step`` builds what one fused training step needs, for an architecture and shape, and ``FusedStep`` runs
it (its forward eager, compiled or graphed, as a fused trial's): what a benchmark times against one trial alone (its
learning rates share the initialisation, as a cell's do).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import models
from models.fused import Fused
from pipeline.common.config import StepMode
from pipeline.training.batches import IGNORE
from pipeline.training.settings import TrainSettings
from pipeline.training.steps import StepForward
from pipeline.training.train import decay_groups, warmup_steps


class FusedAdam(torch.optim.Optimizer):
    """Adam or AdamW over stacked parameters (K, ...), member k at ``lrs[k]``; see the module's docstring.

    Each parameter group holds, besides torch's keys, ``lrs`` (K,) the members' base rates, ``active`` (K,) bool the
    members still training, and ``steps`` (K,) the steps each member has taken: one count for every parameter of the
    group, which all step together (torch keeps one per parameter; a parameter without a gradient is skipped, and
    every parameter of these models has one at every step). Member k's state is its slice of each parameter's
    ``exp_avg`` and ``exp_avg_sq`` and of ``steps``."""

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
        self.size = len(lrs)
        defaults = dict(lrs=lrs, betas=betas, eps=eps, weight_decay=weight_decay, decoupled=decoupled, warmup=warmup)
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.shape[0] != self.size:
                    raise ValueError(f"a parameter of shape {tuple(p.shape)} is not stacked for {self.size} members")
            device = group["params"][0].device
            group["lrs"] = torch.tensor(group["lrs"], dtype=torch.float64, device=device)
            group["active"] = torch.ones(self.size, dtype=torch.bool, device=device)
            group["steps"] = torch.zeros(self.size, dtype=torch.float64, device=device)

    def freeze(self, members: Iterable[int]) -> None:
        """From now on these members' parameters, moments and step counts stay as they are."""
        for group in self.param_groups:
            group["active"][list(members)] = False

    @property
    def active(self) -> torch.Tensor:
        """(K,) bool: the members still training."""
        return self.param_groups[0]["active"]

    def rates(self) -> list[float]:
        """Each member's learning rate at its next step, as its LambdaLR would have set it (host floats)."""
        group = self.param_groups[0]
        return (group["lrs"] * torch.clamp((group["steps"] + 1) / group["warmup"], max=1.0)).tolist()

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's, or ``{"members": [K separate trials' Adam(W) state dicts], "active": [K bools]}``: member k's
        learning rate, step count and moments from the k-th (``member_state``'s inverse), with this optimizer's own
        warm-up and parameter groups, which must match the members'."""
        if "members" not in state_dict:
            super().load_state_dict(state_dict)
            return
        members, active = state_dict["members"], state_dict["active"]
        if len(members) != self.size:
            raise ValueError(f"{len(members)} members' optimizer states for {self.size} fused members")
        index = 0
        for g, group in enumerate(self.param_groups):
            device = group["params"][0].device
            sizes = {len(m["param_groups"][g]["params"]) for m in members}
            if sizes != {len(group["params"])}:
                raise ValueError(
                    f"parameter group {g}: the members' hold {sorted(sizes)} parameters, not {len(group['params'])}"
                )
            group["lrs"] = torch.tensor(
                [m["param_groups"][g]["initial_lr"] for m in members], dtype=torch.float64, device=device
            )
            group["active"] = torch.tensor(active, dtype=torch.bool, device=device)
            first = [m["state"][m["param_groups"][g]["params"][0]] for m in members]
            group["steps"] = torch.tensor([float(s["step"]) for s in first], dtype=torch.float64, device=device)
            for p in group["params"]:
                self.state[p] = {
                    key: torch.stack([m["state"][index][key] for m in members]).to(p)
                    for key in ("exp_avg", "exp_avg_sq")
                }
                index += 1

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            for key in ("lrs", "active", "steps"):  # a loaded state_dict's are where the checkpoint was read
                group[key] = group[key].to(params[0].device)
            self.step_group(group, params)
        return loss

    def step_group(self, group: dict, params: list[torch.Tensor]) -> None:
        """One step of ``params``, a group's parameters with gradients: the members' factors once for the group,
        (K,) in float64 as torch's Python floats are, then a dozen operations per parameter."""
        beta1, beta2 = group["betas"]
        steps, active = group["steps"], group["active"]
        lr = group["lrs"] * torch.clamp((steps + 1) / group["warmup"], max=1.0)  # LambdaLR's factor of the steps before
        taken = steps + active  # the steps taken after this one
        factors = {
            "shrink": 1 - lr * group["weight_decay"],  # AdamW's decay
            "step": -lr / (1 - beta1**taken),
            "root": (1 - beta2**taken).sqrt(),
            "keep": active,  # a frozen member's values are left as they are, bit for bit
        }
        cast: dict[torch.dtype, dict[str, torch.Tensor]] = {}  # the factors in each parameter dtype
        for p in params:
            state = self.state[p]
            if not state:
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            real = p.real.dtype if p.is_complex() else p.dtype
            f = cast.setdefault(real, {k: v.to(real if k != "keep" else torch.bool) for k, v in factors.items()})
            param, grad, exp_avg, exp_avg_sq = p, p.grad, state["exp_avg"], state["exp_avg_sq"]
            assert grad is not None  # params: those with a gradient
            if group["weight_decay"] and group["decoupled"]:
                param = p * per_member(f["shrink"], p)
            elif group["weight_decay"]:
                grad = grad.add(p, alpha=group["weight_decay"])
            target = p
            if p.is_complex():  # as torch's Adam: real and imaginary parts as two reals
                param, grad, exp_avg, exp_avg_sq, target = (
                    torch.view_as_real(t) for t in (param, grad, exp_avg, exp_avg_sq, p)
                )
            m = exp_avg.lerp(grad, 1 - beta1)
            v = (exp_avg_sq * beta2).addcmul_(grad, grad, value=1 - beta2)
            denom = (v.sqrt() / per_member(f["root"], v)).add_(group["eps"])
            stepped = param + per_member(f["step"], m) * (m / denom)
            keep = per_member(f["keep"], m)
            for old, new in ((target, stepped), (exp_avg, m), (exp_avg_sq, v)):
                torch.where(keep, new, old, out=old)
        steps.copy_(taken)


def member_state(state: dict, k: int) -> tuple[dict, dict]:
    """Member k's slice of a ``FusedAdam`` state dict as a separate trial of it holds its optimizer: the state dicts
    of torch.optim.Adam(W) (its parameter groups, each parameter's step, exp_avg and exp_avg_sq) and of the LambdaLR
    warm-up over it (``SequenceModel.configure_optimizers_for``), after as many steps as member k has taken."""
    groups = state["param_groups"]
    first = groups[0]
    lr, steps, warmup = float(first["lrs"][k]), int(first["steps"][k]), first["warmup"]
    kind = torch.optim.AdamW if first["decoupled"] else torch.optim.Adam
    # torch's own parameter groups (every key it keeps), over placeholders in the members' grouping
    placeholders = [
        {"params": [torch.zeros(()) for _ in g["params"]], "weight_decay": g["weight_decay"]} for g in groups
    ]
    optimizer = kind(placeholders, lr=lr, betas=first["betas"], eps=first["eps"])
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda n: min(1.0, (n + 1) / warmup))
    rate = lr * min(1.0, (steps + 1) / warmup)  # what the schedule has set after ``steps`` steps
    for group in optimizer.param_groups:
        group["lr"] = rate
    out = optimizer.state_dict()
    out["state"] = {
        i: {
            "step": torch.tensor(float(steps)),
            "exp_avg": s["exp_avg"][k].clone(),
            "exp_avg_sq": s["exp_avg_sq"][k].clone(),
        }
        for i, s in state["state"].items()
    }
    scheduled = schedule.state_dict() | {
        "last_epoch": steps,
        "_step_count": steps + 1,
        "_last_lr": [rate] * len(groups),
    }
    return out, scheduled


def per_member(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """(K,) -> (K, 1, ...), a view broadcasting over ``like`` (K, ...)."""
    return values.view(-1, *[1] * (like.dim() - 1))


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
        g.mul_(per_member(scale.to(g.real.dtype if g.is_complex() else g.dtype), g))
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
    forward: StepForward | None = None  # the training forward as sweep.resources.step runs it; None: the eager model

    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        losses = member_losses((self.forward or self.model)(inputs), targets)
        losses.sum().backward()  # each member's gradient is its own loss's: no gradient crosses members
        if self.grad_clip is not None:
            clip_per_member(self.model.parameters(), self.grad_clip)
        self.optimizer.step()
        return losses.detach()


def fused_optimizer(model: Fused, lrs: Sequence[float], settings: TrainSettings, total_steps: int) -> FusedAdam:
    """``SequenceModel.configure_optimizers_for`` for fused members: plain Adam (``optimizer: adam``, no weight
    decay), else AdamW with weight decay on matrices only; warm-up over ``warmup_fraction`` of ``total_steps``."""
    warmup = warmup_steps(settings, total_steps)
    if settings.optim.optimizer == "adam":
        return FusedAdam(model.parameters(), lrs, decoupled=False, warmup=warmup)
    return FusedAdam(decay_groups(model.parameters(), settings.optim.weight_decay, matrix=3), lrs, warmup=warmup)


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
    step: StepMode = "eager",
) -> FusedStep:
    """One member per learning rate in ``lrs``, each initialised as a trial of the cell seeded ``seed`` is (so all
    alike), fused on ``device`` with its optimizer under ``settings`` (heads, dropout, optimizer, weight decay,
    warm-up over ``total_steps``, gradient clip), its forward run ``step`` as a fused trial runs it (``StepForward``:
    compiled or graphed, the optimizer eager): call the result with (inputs, targets) to train one step."""
    torch.manual_seed(seed)
    model = models.build_model(
        arch,
        vocab_size=vocab_size,
        width=width,
        depth=depth,
        heads=settings.model.heads,
        max_len=max_len,
        dropout=settings.model.dropout,
        **(options or {}),
    )
    fused = Fused([model] * len(lrs)).to(device)
    forward = StepForward(fused, step, torch.device(device)) if step != "eager" else None
    return FusedStep(fused, fused_optimizer(fused, lrs, settings, total_steps), settings.optim.grad_clip, forward)
