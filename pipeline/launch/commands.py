"""What the launchers (``ops/slurm/capacity-atlas.sbatch``, ``ops/kuberay/rayjob.yaml``) check and do around
``dvc repro``, before any compute:

    python -m pipeline.launch slurm --nodes 2 --cpus-per-node 32 --gpus-per-node 4 [--profile paper]
    python -m pipeline.launch rayjob ops/kuberay/rayjob.yaml
    python -m pipeline.launch wait --nodes 2 [--timeout 300]      # Ray nodes joined to $RAY_ADDRESS
    python -m pipeline.launch use-profile paper                    # params.yaml's profile, checked first
    python -m pipeline.launch keep NAME                            # the outputs to <storage>/outputs/NAME/
    python -m pipeline.launch dvc-state                            # DVC at the cluster's cache and remote
    python -m pipeline.launch save-experiment NAME [STAGES]        # the run as DVC experiment NAME, pushed

``slurm`` and ``rayjob`` ask whether some node of the allocation holds one trial of the profile (its CPUs and GPUs
times its data-parallel workers), else stop naming the profile, what a trial needs and what the nodes have;
``rayjob`` also checks the manifest against this checkout (the entrypoint, the profile, the Ray version, an MLflow
server, the storage mounted on every pod). Details: docs/cluster.md, "Launching it: Slurm and KubeRay".
Exit status 0; 2 for input that cannot run (a ``LaunchError``, a ``ConfigError`` or a ``ServiceError``, one line).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

from pipeline.common.config import ROOT, ConfigError, load_config
from pipeline.launch.allocation import LaunchError, amount, check_slurm, trial_need
from pipeline.launch.job import dvc_state, keep, save_experiment, set_profile, wait_for_nodes
from pipeline.launch.rayjob import check_rayjob, read_manifest
from pipeline.tracking.services import ServiceError


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m pipeline.launch", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--params", default=str(ROOT / "params.yaml"), help="params file (default: %(default)s)")
    sub = ap.add_subparsers(dest="command", required=True)
    slurm = sub.add_parser("slurm", help="can a Slurm allocation hold one trial of the profile?")
    slurm.add_argument("--profile", help="default: params.yaml's")
    slurm.add_argument("--nodes", type=int, required=True)
    slurm.add_argument("--cpus-per-node", type=float, required=True)
    slurm.add_argument("--gpus-per-node", type=float, default=0)
    rayjob = sub.add_parser("rayjob", help="check a KubeRay RayJob manifest against the profile it names")
    rayjob.add_argument("manifest", type=Path)
    wait = sub.add_parser("wait", help="wait for Ray nodes to join the head at $RAY_ADDRESS")
    wait.add_argument("--address", help="default: $RAY_ADDRESS")
    wait.add_argument("--nodes", type=int, required=True)
    wait.add_argument("--timeout", type=float, default=300, help="seconds (default: %(default)s)")
    use = sub.add_parser("use-profile", help="set params.yaml's profile, after checking it loads")
    use.add_argument("profile")
    kept = sub.add_parser("keep", help="copy params.yaml, dvc.lock, results/ and report/ to <storage>/outputs/NAME")
    kept.add_argument("name")
    sub.add_parser("dvc-state", help="point DVC at the cluster's shared cache and remote, check them, restore outputs")
    saved = sub.add_parser("save-experiment", help="`dvc exp save -n NAME`, pushed to $CAPACITY_ATLAS_GIT_REMOTE")
    saved.add_argument("name")
    saved.add_argument("targets", nargs="*", help="the stages `dvc repro` was given (default: all)")
    return ap


def slurm(args: argparse.Namespace) -> str:
    cfg = load_config(args.params, profile=args.profile)
    slots = check_slurm(cfg, args.nodes, args.cpus_per_node, args.gpus_per_node)
    return (
        f"profile {cfg.profile}: {amount(args.nodes, 'Slurm node')} of {amount(args.cpus_per_node, 'CPU')} "
        f"and {amount(args.gpus_per_node, 'GPU')} run {amount(slots, 'trial')} at once (each {trial_need(cfg)})"
    )


def rayjob(args: argparse.Namespace) -> str:
    job = check_rayjob(read_manifest(args.manifest), args.params)
    cfg = load_config(args.params, profile=job.profile)
    groups = "; ".join(g.describe() for g in job.groups)
    said = (
        f"{args.manifest}: a RayJob of KubeRay {job.kuberay}, profile {job.profile}, "
        f"`{shlex.join(job.command)}`; {groups}: {amount(job.slots, 'trial')} at once (each {trial_need(cfg)})"
    )
    note = job.slots_note(cfg)
    return said + (f"\n{note}" if note else "")


def wait(args: argparse.Namespace) -> str:
    address = args.address or os.environ.get("RAY_ADDRESS")
    if not address:
        raise LaunchError("no Ray address: give --address or set RAY_ADDRESS")
    alive = wait_for_nodes(address, args.nodes, args.timeout)
    listing = ", ".join(
        f"{n['NodeManagerAddress']} ({n['Resources'].get('CPU', 0):g} CPUs, {n['Resources'].get('GPU', 0):g} GPUs)"
        for n in alive
    )
    return f"Ray at {address}: {len(alive)} nodes: {listing}"


def use_profile(args: argparse.Namespace) -> str:
    set_profile(Path(args.params), args.profile)
    return ""


def keep_outputs(args: argparse.Namespace) -> str:
    return f"outputs kept in {keep(load_config(args.params).cluster.storage(), args.name)}"


# subcommand -> what it does, returning what it prints ("": nothing)
COMMANDS: dict[str, Callable[[argparse.Namespace], str]] = {
    "slurm": slurm,
    "rayjob": rayjob,
    "wait": wait,
    "use-profile": use_profile,
    "keep": keep_outputs,
    "dvc-state": lambda args: dvc_state(dict(os.environ)),
    "save-experiment": lambda args: save_experiment(args.name, args.targets, dict(os.environ)),
}


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        said = COMMANDS[args.command](args)
    except (LaunchError, ConfigError, ServiceError) as err:
        print(f"error: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    if said:
        print(said)
    return 0


if __name__ == "__main__":
    sys.exit(main())
