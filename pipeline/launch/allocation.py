"""Whether an allocation holds one trial of a profile: Slurm's nodes (``check_slurm``), or any node groups alike
(``check_nodes``, which the RayJob check uses for its pods), each counted by its scarcest resource as the sweep counts
them; and the errors of the launchers' input.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.common.config import Config
from pipeline.scheduling.cluster import slots_on


class LaunchError(RuntimeError):
    """A launcher's input cannot run the pipeline; the message names the file, field or variable."""


class AllocationError(LaunchError):
    """No node of an allocation (Slurm nodes, a RayJob's pods) holds one trial of the profile."""


@dataclass(frozen=True)
class Nodes:
    """``count`` nodes alike, each offering Ray ``cpus`` CPUs and ``gpus`` GPUs; ``name`` says which, in errors."""

    name: str
    count: int
    cpus: float
    gpus: float

    def describe(self) -> str:
        each = f"{amount(self.cpus, 'CPU')} and {amount(self.gpus, 'GPU')}"
        return f"{self.name}: {amount(self.count, 'node')} of {each}{' each' * (self.count > 1)}"


def amount(x: float, unit: str) -> str:
    """``4 CPUs``, ``1 GPU``, ``0.5 GPU``."""
    return f"{x:g} {unit}{'s' * (x > 1 or x == 0)}"


def check_nodes(cfg: Config, groups: list[Nodes], where: str, hint: str = "") -> int:
    """The trials ``groups`` run at once on the profile of ``cfg`` (as the sweep counts them, each node by its
    scarcest resource); an ``AllocationError`` if that is none."""
    need = cfg.sweep.resources.trial_resources()
    slots = sum(g.count * slots_on([(g.cpus, g.gpus)], need["cpu"], need["gpu"]) for g in groups)
    if slots < 1:
        have = "; ".join(g.describe() for g in groups) or "no nodes"
        raise AllocationError(
            f"{where} cannot hold one trial of profile {cfg.profile!r}: a trial needs {trial_need(cfg)} on one node "
            "(sweep.resources.cpus_per_trial, gpus_per_trial, workers_per_trial), "
            f"and there are {have}"
            f"{'; ' + hint if hint else ''}"
        )
    return slots


def trial_need(cfg: Config) -> str:
    r = cfg.sweep.resources.trial_resources()
    return f"{amount(r['cpu'], 'CPU')} and {amount(r['gpu'], 'GPU')}"


def check_slurm(cfg: Config, nodes: int, cpus: float, gpus: float) -> int:
    """An allocation of ``nodes`` nodes, each with ``cpus`` CPUs and ``gpus`` GPUs for Ray."""
    if nodes < 1:
        raise AllocationError(f"the Slurm allocation has {nodes} nodes (SLURM_JOB_NODELIST)")
    r = cfg.sweep.resources.trial_resources()
    hints = []
    if r["gpu"] and gpus < r["gpu"]:
        hints.append(
            "request GPUs with `#SBATCH --gpus-per-node=N` (or --gres=gpu:N): the job sees "
            + ("none (SLURM_GPUS_ON_NODE and SLURM_GPUS_PER_NODE unset)" if not gpus else f"{gpus:g} per node")
        )
    if cpus < r["cpu"]:
        hints.append(f"request at least {r['cpu']:g} CPUs per node (`#SBATCH --cpus-per-task=N`, one task per node)")
    group = Nodes("Slurm nodes", nodes, cpus, gpus)
    return check_nodes(cfg, [group], "the Slurm allocation", "; ".join(hints))
