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

``FusedAdam.clip_per_member`` is the trial's gradient clip (``sweep.optim.grad_clip``: Lightning's
``gradient_clip_val``, torch's ``clip_grad_norm_`` over all of one model's parameters) for each member apart.

``train_members`` is one training step of the members (forward, each member's loss, backward, clip, update: tensors
only, so that a graph holds it), ``fused_step`` builds what it needs for an architecture and shape, and ``FusedStep``
runs it as a fused trial does (its forward eager or compiled; graphed, on a GPU, the whole step as CUDA graphs,
``GraphedStep``): what a benchmark times against one trial alone (its learning rates share the initialisation, as a
cell's do).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import models
from models.fused import Fused
from pipeline.common.config import StepMode
from pipeline.training.batches import IGNORE
from pipeline.training.settings import TrainSettings
from pipeline.training.steps import Compiled, GraphedStep, StepForward, effective
from pipeline.training.train import decay_groups, warmup_steps


def real(t: torch.Tensor) -> torch.Tensor:
    """A complex tensor as two reals (a view), as torch's Adam steps it; a real one as it is."""
    return torch.view_as_real(t) if t.is_complex() else t


class Flat:
    """The stacked parameters of one real dtype (a complex one counted as two reals) laid end to end in one buffer,
    each a contiguous (K, ...) block of it, so that an optimizer step is a dozen operations over the whole buffer,
    whatever the number of parameters: ``param`` holds the weights (every parameter's data is a view of it from
    then on), ``grad`` their gradients gathered each step (one ``cat``), ``exp_avg`` and ``exp_avg_sq`` the moments
    (each parameter's state a view of them); ``member`` (P,) says whose element each is, and ``decay`` (P,) its
    parameter group's weight decay. A complex parameter's block starts at an even offset, as a complex view needs."""

    def __init__(self, params: list[torch.Tensor], groups: list[int], state: dict, size: int):
        dtype = real(params[0]).dtype
        device = params[0].device
        blocks, offsets, total = [], [], 0
        for p in params:
            total += total % 2  # a complex view starts at an even offset
            offsets.append(total)
            total += real(p).numel()
        self.params, self.offsets, self.size = params, offsets, size
        self.index = {id(p): i for i, p in enumerate(params)}
        self.param = torch.zeros(total, dtype=dtype, device=device)
        self.exp_avg = torch.zeros_like(self.param)
        self.exp_avg_sq = torch.zeros_like(self.param)
        self.grad = torch.zeros_like(self.param)
        member, slot = torch.zeros(total, dtype=torch.long), torch.zeros(total, dtype=torch.long)
        for p, off, group in zip(params, offsets, groups):
            n = real(p).numel()
            member[off : off + n] = torch.arange(size).repeat_interleave(n // size)
            slot[off : off + n] = group * size + member[off : off + n]
            blocks.append((off, n))
        self.member = member.to(device)
        self.slot = slot.to(device)  # (P,): group g's member k at g K + k, for the factors of (group, member)
        with torch.no_grad():
            for p, (off, n) in zip(params, blocks):
                own = state.get(p, {})
                for buffer, key in ((self.param, None), (self.exp_avg, "exp_avg"), (self.exp_avg_sq, "exp_avg_sq")):
                    source = p if key is None else own.get(key)
                    if source is not None:
                        buffer[off : off + n].copy_(real(source.detach()).reshape(-1))
                p.data = self.view(self.param, p)
                state[p] = {"exp_avg": self.view(self.exp_avg, p), "exp_avg_sq": self.view(self.exp_avg_sq, p)}

    def view(self, buffer: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """``p``'s block of ``buffer`` in ``p``'s shape and dtype (complex where ``p`` is)."""
        off = self.offsets[self.index[id(p)]]
        block = buffer[off : off + real(p).numel()].view(real(p).shape)
        return torch.view_as_complex(block) if p.is_complex() else block

    def gather(self) -> torch.Tensor:
        """The parameters' gradients into ``grad``, in one ``cat`` (the padding between blocks stays zero)."""
        grads = []
        for i, p in enumerate(self.params):
            assert p.grad is not None  # FusedAdam.flat: every parameter has one, or none
            end = self.offsets[i + 1] if i + 1 < len(self.params) else self.param.numel()
            pad = end - self.offsets[i] - real(p).numel()
            grads.append(real(p.grad).reshape(-1))
            if pad:
                grads.append(self.grad.new_zeros(pad))
        torch.cat(grads, out=self.grad)
        return self.grad


@dataclass
class Stepped:
    """What a closure returns that has run the optimizer's update itself (inside its graph): the members' losses."""

    losses: torch.Tensor


class FusedAdam(torch.optim.Optimizer):
    """Adam or AdamW over stacked parameters (K, ...), member k at ``lrs[k]``; see the module's docstring.

    Each parameter group holds, besides torch's keys, ``lrs`` (K,) the members' base rates, ``active`` (K,) bool the
    members still training, and ``steps`` (K,) the steps each member has taken: one count for every parameter, all
    of which step together (torch keeps one per parameter; a parameter without a gradient is skipped, so a step
    with only some of them is refused here: every parameter of these models has one at every step). Member k's
    state is its slice of each parameter's ``exp_avg`` and ``exp_avg_sq`` and of ``steps``.

    The step runs over ``Flat`` buffers, one per real dtype, built at the first step (and again after a state is
    loaded): about a dozen tensor operations in all, each member's factors (its rate under the warm-up, Adam's bias
    corrections, whether it is frozen) gathered to every element of the buffer by its member index, instead of a
    dozen per parameter."""

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
        step: StepMode = "eager",
    ):
        self.size = len(lrs)
        defaults = dict(lrs=lrs, betas=betas, eps=eps, weight_decay=weight_decay, decoupled=decoupled, warmup=warmup)
        super().__init__(params, defaults)
        self.flats: dict[torch.dtype, Flat] | None = None  # built at the first step
        # what the host decides of a step (the frozen members, the buffers): a graph of the step holds one program
        self.program = 0
        self.gathered = False  # this step's gradients are in the flat buffers (a clip gathered them)
        for group in self.param_groups:
            for p in group["params"]:
                if p.shape[0] != self.size:
                    raise ValueError(f"a parameter of shape {tuple(p.shape)} is not stacked for {self.size} members")
            if (group["betas"], group["eps"], group["decoupled"], group["warmup"]) != (
                betas, eps, decoupled, warmup,
            ):  # fmt: skip
                raise ValueError("FusedAdam's parameter groups differ only in their weight decay")
            device = group["params"][0].device
            group["lrs"] = torch.tensor(group["lrs"], dtype=torch.float64, device=device)
        device = self.param_groups[0]["params"][0].device
        self.share(torch.ones(self.size, dtype=torch.bool, device=device), torch.zeros(self.size, dtype=torch.float64,
                   device=device))  # fmt: skip
        # the update over the flat buffers, where the trial's step is compiled or graphed: inductor fuses its dozen
        # ops a buffer into a few kernels. Not under reduce-overhead's graphs (it writes its inputs in place, which
        # they would copy): a graphed trial records it inside its whole step's graph (``GraphedStep``).
        compiled = effective(step, device)[0] != "eager"
        self.update = Compiled(self.step_flat, "compiled" if compiled else "eager", device)

    def share(self, active: torch.Tensor, steps: torch.Tensor) -> None:
        """Every group holds the one ``active`` and ``steps``: the members freeze and step as wholes. Whether all
        are active is also kept on the host (read once here, never in a step): a step with none frozen writes its
        buffers in place, with no mask."""
        for group in self.param_groups:
            group["active"], group["steps"] = active, steps
        self.all_active = bool(active.all())
        self.keep: dict[torch.dtype, torch.Tensor] = {}  # each flat buffer's elements of the active members
        self.program += 1

    def freeze(self, members: Iterable[int]) -> None:
        """From now on these members' parameters, moments and step counts stay as they are."""
        self.active[list(members)] = False
        self.all_active, self.keep = False, {}
        self.program += 1

    @property
    def active(self) -> torch.Tensor:
        """(K,) bool: the members still training."""
        return self.param_groups[0]["active"]

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.gathered = False
        super().zero_grad(set_to_none)

    def rates(self) -> list[float]:
        """Each member's learning rate at its next step, as its LambdaLR would have set it (host floats)."""
        group = self.param_groups[0]
        return (group["lrs"] * torch.clamp((group["steps"] + 1) / group["warmup"], max=1.0)).tolist()

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's, or ``{"members": [K separate trials' Adam(W) state dicts], "active": [K bools]}``: member k's
        learning rate, step count and moments from the k-th (``member_state``'s inverse), with this optimizer's own
        warm-up and parameter groups, which must match the members'."""
        self.flats = None  # rebuilt from the loaded state at the next step
        if "members" not in state_dict:
            super().load_state_dict(state_dict)
            group = self.param_groups[0]
            self.share(group["active"], group["steps"])
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
            for p in group["params"]:
                self.state[p] = {
                    key: torch.stack([m["state"][index][key] for m in members]).to(p)
                    for key in ("exp_avg", "exp_avg_sq")
                }
                index += 1
        device = self.param_groups[0]["params"][0].device
        first = [m["state"][m["param_groups"][0]["params"][0]] for m in members]
        steps = torch.tensor([float(s["step"]) for s in first], dtype=torch.float64, device=device)
        self.share(torch.tensor(active, dtype=torch.bool, device=device), steps)

    def flat(self) -> dict[torch.dtype, Flat]:
        """The flat buffers, built at the first call from the parameters and any state they have."""
        if self.flats is None:
            by_dtype: dict[torch.dtype, tuple[list, list]] = {}
            for g, group in enumerate(self.param_groups):
                for p in group["params"]:
                    params, groups = by_dtype.setdefault(real(p).dtype, ([], []))
                    params.append(p)
                    groups.append(g)
            group = self.param_groups[0]
            for key in ("lrs", "active", "steps"):  # a loaded state_dict's are where the checkpoint was read
                group[key] = group[key].to(group["params"][0].device)
            self.share(group["active"], group["steps"])
            for other in self.param_groups[1:]:
                other["lrs"] = other["lrs"].to(group["lrs"].device)
            self.flats = {
                dtype: Flat(params, groups, self.state, self.size) for dtype, (params, groups) in by_dtype.items()
            }
            decays = [g["weight_decay"] for g in self.param_groups]  # (G,), on the device once: none copied a step
            device = group["lrs"].device
            self.decays = torch.tensor(decays, dtype=torch.float64, device=device) if any(decays) else None
            self.program += 1
        return self.flats

    def gather(self) -> list[Flat]:
        """This step's gradients in the flat buffers, once a step; [] where no parameter has one."""
        params = [p for group in self.param_groups for p in group["params"]]
        have = [p.grad is not None for p in params]
        if not any(have):
            return []
        if not all(have):
            raise ValueError(
                f"{have.count(False)} of {len(params)} stacked parameters have no gradient: FusedAdam steps every "
                "parameter together (torch's Adam would skip those)"
            )
        flats = list(self.flat().values())
        if not self.gathered:
            for flat in flats:
                flat.gather()
            self.gathered = True
        return flats

    @torch.no_grad()
    def clip_per_member(self, max_norm: float) -> torch.Tensor:
        """Scales each member's gradients so that their norm over all its parameters is at most ``max_norm``, as
        torch's ``clip_grad_norm_`` does for one model; returns the norms before (K,).

            total_k = sqrt(sum over member k's elements of g^2),   g <- g * min(1, max_norm / (total_k + 1e-6))"""
        flats = self.gather()
        device = self.active.device
        squares = torch.zeros(self.size, dtype=torch.float64, device=device)
        for flat in flats:
            squares.index_add_(0, flat.member, (flat.grad * flat.grad).to(torch.float64))
        total = squares.sqrt()  # (K,)
        scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for flat in flats:
            flat.grad.mul_(scale.to(flat.grad.dtype)[flat.member])
        return total

    @torch.no_grad()
    def step(self, closure=None):
        """torch's step; a closure that ran this update itself, inside its graph (the trial's whole step graphed,
        ``FusedSequenceModel.graphed_step``), says so by returning ``Stepped``: nothing is stepped twice."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
            if isinstance(loss, Stepped):
                return loss.losses
        flats = self.gather()
        self.gathered = False
        if flats:
            self.update(flats)
        return loss

    def step_flat(self, flats: list[Flat]) -> None:
        """One step of every member over the flat buffers. Per member k (and parameter group g), in float64 as
        torch's Python floats are, then gathered to each element e by its member and group:

            lr_k = base_k min(1, (n_k + 1) / warmup)       n_k: the steps member k has taken (LambdaLR's factor)
            m <- b1 m + (1 - b1) g,   v <- b2 v + (1 - b2) g^2
            p <- p (1 - lr_k wd_g) - lr_k / (1 - b1^(n_k + 1)) * m / (sqrt(v) / sqrt(1 - b2^(n_k + 1)) + eps)

        (Adam: wd_g p added to g instead of the decay); a frozen member's p, m and v are kept bit for bit."""
        group = self.param_groups[0]
        beta1, beta2 = group["betas"]
        steps, active, lrs = group["steps"], group["active"], group["lrs"]
        # LambdaLR's factor of the steps before (none without a warm-up), then the steps taken after this one
        lr = lrs if group["warmup"] == 1 else lrs * torch.clamp((steps + 1) / group["warmup"], max=1.0)  # (K,)
        steps.add_(1 if self.all_active else active)
        factors = torch.stack([lr / (beta1**steps - 1), (1 - beta2**steps).sqrt()])  # (2, K): -step size, root
        wd = self.decays  # (G,), or None without weight decay
        if wd is not None:
            decay = (1 - lr * wd[:, None]) if group["decoupled"] else wd[:, None].expand(-1, self.size)  # (G, K)
        for flat in flats:
            dtype = flat.param.dtype
            param, grad, m, v = flat.param, flat.grad, flat.exp_avg, flat.exp_avg_sq
            step_size, root = factors.to(dtype)[:, flat.member]  # (P,) each
            shrink = decay.to(dtype).flatten()[flat.slot] if wd is not None else None  # AdamW's shrink, or Adam's wd
            if shrink is not None and not group["decoupled"]:
                grad = grad.addcmul(shrink, param)
            if self.all_active:  # in place: nothing to keep
                m.lerp_(grad, 1 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                if shrink is not None and group["decoupled"]:
                    param.mul_(shrink)
                param.add_(step_size * (m / (v.sqrt() / root).add_(group["eps"])))
                continue
            new_m = m.lerp(grad, 1 - beta1)
            new_v = (v * beta2).addcmul_(grad, grad, value=1 - beta2)
            update = step_size * (new_m / (new_v.sqrt() / root).add_(group["eps"]))
            stepped = (param * shrink if shrink is not None and group["decoupled"] else param) + update
            if dtype not in self.keep:  # after a freeze: once, not every step
                self.keep[dtype] = active[flat.member]
            for old, new in ((param, stepped), (m, new_m), (v, new_v)):
                torch.where(self.keep[dtype], new, old, out=old)


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


def member_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(K, B, T, V) logits, (B, T) or (K, B, T) next tokens (``IGNORE`` where none is predicted) -> (K,): each
    member's next-token cross-entropy, averaged over its predicted positions (``SequenceModel.loss``)."""
    K = logits.shape[0]
    targets = targets.expand(K, *targets.shape[-2:])  # (K, B, T)
    each = F.cross_entropy(logits.flatten(0, 2), targets.flatten(), ignore_index=IGNORE, reduction="none")
    predicted = targets != IGNORE
    return each.view(K, -1).sum(1) / predicted.flatten(1).sum(1)


def train_members(optimizer: FusedAdam, losses: Callable[[], torch.Tensor], grad_clip: float | None) -> torch.Tensor:
    """One training step of fused members: ``losses()`` (the forward and each member's loss, (K,)), backward, each
    member's gradient clip, ``FusedAdam``'s step; the losses before the step. Tensors only, nothing read back (a graph
    holds it: ``GraphedStep``); after the forward out of autocast, as Lightning's automatic step runs them."""
    optimizer.zero_grad(set_to_none=True)
    out = losses()  # (K,)
    with torch.autocast(out.device.type, enabled=False):
        out.sum().backward()  # each member's gradient is its own loss's: no gradient crosses members
        if grad_clip:
            optimizer.clip_per_member(grad_clip)
        optimizer.step()
    return out.detach()


@dataclass
class FusedStep:
    """One training step of K fused members (``train_members``), as a fused trial runs it: its forward eager or
    compiled (``forward``), or the whole step graphed (``whole``). Returns the members' losses (K,) before the
    step."""

    model: Fused
    optimizer: FusedAdam
    grad_clip: float | None = None
    forward: StepForward | None = None  # the training forward as sweep.resources.step runs it; None: the eager model
    whole: GraphedStep | None = None  # the whole step as CUDA graphs (sweep.resources.step: graphed, on a GPU)

    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.whole is not None:
            self.optimizer.flat()  # its buffers built before the step's program is read: a graph holds them
            return self.whole(inputs, targets)
        return self.step(inputs, targets)

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        forward = self.forward or self.model
        return train_members(self.optimizer, lambda: member_losses(forward(inputs), targets), self.grad_clip)


def fused_optimizer(
    model: Fused, lrs: Sequence[float], settings: TrainSettings, total_steps: int, step: StepMode | None = None
) -> FusedAdam:
    """``SequenceModel.configure_optimizers_for`` for fused members: plain Adam (``optimizer: adam``, no weight
    decay), else AdamW with weight decay on matrices only; warm-up over ``warmup_fraction`` of ``total_steps``; its
    update compiled where ``step`` (default ``sweep.resources.step``) compiles the step."""
    warmup = warmup_steps(settings, total_steps)
    step = step or settings.resources.step
    if settings.optim.optimizer == "adam":
        return FusedAdam(model.parameters(), lrs, decoupled=False, warmup=warmup, step=step)
    groups = decay_groups(model.parameters(), settings.optim.weight_decay, matrix=3)
    return FusedAdam(groups, lrs, warmup=warmup, step=step)


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
    warm-up over ``total_steps``, gradient clip), its step run ``step`` as a fused trial runs it (its forward compiled,
    ``StepForward``; graphed, on a GPU: the whole step, ``GraphedStep``): call the result with (inputs, targets) to
    train one step."""
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
    device = torch.device(device)
    optimizer = fused_optimizer(fused, lrs, settings, total_steps, step)
    if step == "graphed":  # the whole step, as a graphed fused trial's (on a CPU its eager twin)
        made = FusedStep(fused, optimizer, settings.optim.grad_clip)
        made.whole = GraphedStep(made.step, device, lambda: optimizer.program)
        return made
    forward = StepForward(fused, step, device) if step != "eager" else None
    return FusedStep(fused, optimizer, settings.optim.grad_clip, forward)
