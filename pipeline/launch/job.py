"""What a cluster job does around `dvc repro`: the profile set in params.yaml, the Ray nodes waited for, the outputs
kept on the storage (for a checkout deleted with its pod), and DVC's state for a checkout that lives as long as its
job (a Ray job's copy, a pod's image): the cluster's cache and remotes, the outputs restored, the run saved as a DVC
experiment.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pyarrow.fs as pafs

from pipeline.common.config import ROOT, load_config
from pipeline.data.storage import filesystem, location_of
from pipeline.launch.allocation import LaunchError
from pipeline.scheduling.cluster import check_ray_token
from pipeline.tracking import experiments

OUTPUTS = ("params.yaml", "dvc.lock", "results", "report")  # what `keep` copies


def set_profile(params: Path, profile: str) -> None:
    """Writes ``profile`` into ``params`` (its ``profile:`` line, comments kept) once it loads with its overrides,
    as `dvc exp run -S profile=...` would: DVC tracks the choice there."""
    load_config(params, profile=profile)
    text = params.read_text()
    new, found = re.subn(r"(?m)^profile:.*$", f"profile: {profile}", text, count=1)
    if not found:
        raise LaunchError(f"{params}: no top-level `profile:` line to set")
    if new != text:
        params.write_text(new)


def wait_for_nodes(address: str, nodes: int, timeout: float) -> list[dict]:
    """The alive nodes of the Ray cluster at ``address`` once there are ``nodes`` of them; a ``LaunchError`` if
    they are not all there within ``timeout`` seconds (``ServiceError`` at once for a token the head rejects)."""
    import ray  # only here: the other commands never start a driver

    deadline = time.monotonic() + timeout
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise LaunchError(f"RAY_ADDRESS {address!r}: expected host:port (the head's GCS)")
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
            break
        except OSError as err:
            if time.monotonic() > deadline:
                raise LaunchError(
                    f"the Ray head at {address} did not open its port within {timeout:.0f} s ({err})"
                ) from None
            time.sleep(1)
    check_ray_token(address)
    alive: list[dict] = []
    while True:
        try:
            if not ray.is_initialized():
                ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
            alive = [n for n in ray.nodes() if n.get("Alive")]
        except (ConnectionError, RuntimeError, TimeoutError):  # the head's raylet not registered yet
            ray.shutdown()
        if len(alive) >= nodes:
            ray.shutdown()
            return alive
        if time.monotonic() > deadline:
            ray.shutdown()
            joined = ", ".join(n["NodeManagerAddress"] for n in alive) or "none"
            raise LaunchError(
                f"{len(alive)} of {nodes} Ray nodes joined the head at {address} within {timeout:.0f} s "
                f"(joined: {joined}); the others' `ray start` output is in the job's log"
            )
        time.sleep(1)


def keep(storage: str, name: str, root: Path = ROOT) -> str:
    """Copies this checkout's outputs (``OUTPUTS``) to ``<storage>/outputs/<name>/`` (a path or a URI), for a
    checkout that is deleted with its pod; returns where. On a path the folder appears whole or not at all: copied
    beside it under a hidden name, then renamed (a copy that fails or is stopped removes it; one killed, as `ray job
    stop` kills a job a while after its signal, leaves only that hidden folder); on an object store each file is
    whole once written."""
    fs, base = filesystem(storage)
    outputs = f"{base.rstrip('/')}/outputs"
    dest = f"{outputs}/{name}"
    local = isinstance(fs, pafs.LocalFileSystem)
    into = f"{outputs}/.{name}.{uuid.uuid4().hex}" if local else dest
    try:
        fs.create_dir(into)
        for item in OUTPUTS:
            if (root / item).is_dir():
                fs.create_dir(f"{into}/{item}")  # pyarrow makes the folders below it, not this one
            if (root / item).exists():
                pafs.copy_files(str(root / item), f"{into}/{item}", destination_filesystem=fs)
        if local:
            if os.path.exists(dest):  # another job of this profile ended in the same second: beside it, not over it
                dest = f"{dest}-{uuid.uuid4().hex[:8]}"
            os.rename(into, dest)
    except OSError as err:  # pyarrow's errors are OSErrors
        raise LaunchError(f"cannot copy the outputs to {storage}: {err}") from None
    finally:  # a copy that failed or was stopped leaves nothing; a renamed one is gone from here
        if local:
            shutil.rmtree(into, ignore_errors=True)
    return location_of(dest, storage)


# ---- DVC's state, for a checkout that lives as long as its job (a Ray job's copy, a pod's image)

DVC_CACHE, DVC_REMOTE, GIT_REMOTE = "CAPACITY_ATLAS_DVC_CACHE", "CAPACITY_ATLAS_DVC_REMOTE", "CAPACITY_ATLAS_GIT_REMOTE"


def dvc(args: list[str], root: Path) -> subprocess.CompletedProcess:
    return experiments.run(experiments.dvc(*args), root)


# filesystems that many nodes mount, where flock is unreliable (NFSv3, Lustre without -o flock, ...)
NETWORK_FS = {"nfs", "nfs4", "lustre", "cifs", "smb3", "smbfs", "gpfs", "beegfs", "ceph", "glusterfs",
              "fuse.glusterfs", "fuse.sshfs", "panfs", "wekafs", "9p"}  # fmt: skip


def mount_type(path: Path) -> str:
    """The type of the filesystem holding ``path`` (the longest mount point above it in /proc/mounts; "" if none)."""
    path = path.resolve()
    best, kind = "", ""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return ""
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        if (path == Path(point) or Path(point) in path.parents) and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def shared_cache(cache: str, root: Path) -> list[list[str]]:
    """``dvc config --local`` commands for a cache many users and nodes share: files group-writable
    (``cache.shared group``), linked into the workspace instead of copied out of it (``cache.type``), DVC's own
    site cache on this node's disk, and, where the cache or the checkout is on a network filesystem, a lock that
    works without flock (``core.hardlink_lock``)."""
    site = Path(tempfile.gettempdir()) / f"dvc-site-{os.getuid()}"
    commands = [
        ["cache.shared", "group"],
        ["cache.type", "reflink,hardlink,symlink,copy"],
        ["core.site_cache_dir", str(site)],
    ]
    if {mount_type(Path(cache)), mount_type(root)} & NETWORK_FS:
        commands.append(["core.hardlink_lock", "true"])
    return [["config", "--local", *c] for c in commands]


def dvc_state(env: dict[str, str], root: Path = ROOT) -> str:
    """Points this checkout's DVC at the cluster's shared state (``.dvc/config.local``): ``$CAPACITY_ATLAS_DVC_CACHE``
    a cache directory every job shares (``shared_cache``: group-writable, linked, a node-local site cache, a hardlink
    lock on a network filesystem), ``$CAPACITY_ATLAS_DVC_REMOTE`` the default remote; checks the remotes the results
    will be pushed to (``$CAPACITY_ATLAS_GIT_REMOTE`` and DVC's default remote) before anything runs; then restores
    what ``dvc.lock`` records from them (``dvc pull``, else ``dvc checkout``), so that `dvc repro` reruns only what
    changed instead of generating the datasets again. Returns what it did, in a line."""
    done = []
    for key, args in ((DVC_CACHE, ["cache", "dir", "--local"]), (DVC_REMOTE, ["remote", "add", "--local", "-f", "-d"])):
        if value := env.get(key):
            cmds = [[*args, value], *shared_cache(value, root)] if key == DVC_CACHE else [[*args, "cluster", value]]
            for cmd in cmds:
                if (run := dvc(cmd, root)).returncode != 0:
                    raise LaunchError(f"${key} {value!r}: `dvc {' '.join(cmd)}` failed:\n{experiments.last_lines(run)}")
            done.append(f"{'cache' if key == DVC_CACHE else 'remote'} {value}")
            if key == DVC_CACHE:
                done.append(f"shared ({', '.join(' '.join(c[2:]) for c in cmds[1:])})")
    if env.get(GIT_REMOTE):
        try:
            done.append(f"results pushed to {experiments.check(root, env[GIT_REMOTE])}")
        except experiments.RemoteError as err:
            raise LaunchError(f"${GIT_REMOTE}: {err}") from None
    remote = dvc(["remote", "default"], root).stdout.strip()
    restore = ["pull", "--run-cache", "--allow-missing"] if remote else ["checkout", "--allow-missing"]
    run = dvc(restore, root)
    if run.returncode != 0:  # nothing is lost: the stages that lack their outputs run
        print(
            f"warning: `dvc {' '.join(restore)}` failed; `dvc repro` runs what it lacks:\n"
            f"{experiments.last_lines(run)}",
            file=sys.stderr,
        )
    done.append(f"outputs restored with `dvc {' '.join(restore)}`")
    return "DVC: " + "; ".join(done)


def save_experiment(name: str, targets: list[str], env: dict[str, str], root: Path = ROOT) -> str:
    """The workspace a `dvc repro [TARGETS]` left (its params, dvc.lock, the outputs of ``targets``, else of every
    stage) as the DVC experiment ``name`` (`dvc exp save`, committed as the job where the account has no git
    identity), pushed to ``$CAPACITY_ATLAS_GIT_REMOTE`` (its ref) and DVC's default remote (its outputs) when set, as
    the nightly's nights are (``pipeline.tracking.experiments``): where `dvc exp show` finds it once a clone pulls it
    (`dvc exp pull <remote> <name>`)."""
    identity = experiments.run(["git", "config", "user.email"], root).stdout.strip() or env.get("GIT_AUTHOR_EMAIL")
    if not identity:  # a pod's or a job's account often has none: the experiment's commit is the job's
        name_, email = "Capacity Atlas job", f"job@{socket.gethostname()}"
        for role in ("AUTHOR", "COMMITTER"):
            os.environ.update({f"GIT_{role}_NAME": name_, f"GIT_{role}_EMAIL": email})
    run = dvc(["exp", "save", "-n", name, *targets], root)
    if run.returncode != 0:
        raise LaunchError(f"`dvc exp save -n {name} {' '.join(targets)}` failed:\n{experiments.last_lines(run)}")
    if not (remote := env.get(GIT_REMOTE)):
        return f"experiment {name} saved in this checkout (${GIT_REMOTE} not set: not pushed)"
    try:
        experiments.push_named(root, remote, [name])
    except experiments.RemoteError as err:
        raise LaunchError(str(err)) from None
    return f"experiment {name} pushed to git remote {remote!r} and DVC's default remote"
