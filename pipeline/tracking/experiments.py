"""The nights as named DVC experiments, shared through a git remote (the experiments' refs) and a DVC remote (their
outputs: datasets, results, report).

A night is ``dvc exp run -n nightly-<profile>-<date>``, its commit message holding what the night knew before it ran
(``message``: date, commit, profile, the training libraries' versions) as one line of JSON; ``dvc exp push
<git remote> <name>`` sends the ref to the git remote and the outputs to DVC's default remote (``.dvc/config``, or
``.dvc/config.local`` on this machine). A clone pulls them (``pull``: ``dvc exp pull``) and reads them back
(``nights``, ``read``) from its refs and DVC's cache, which falls back on the remote.

``check`` probes both remotes before a night runs: a remote that is not configured, does not answer, or (a local
directory, the default) is not an existing writable directory, is a ``RemoteError`` naming it. A local directory
that is missing is never created: an NFS share that is not mounted would otherwise fill the local disk. A relative
path in the committed ``.dvc/config`` is one too: DVC resolves it against the root of the experiment's commit
(``../remote`` becomes ``/remote``) when it pushes or pulls one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from pipeline.common.urls import redact

PREFIX = "nightly-"  # a night's experiment: nightly-<profile>-<date>
REFS = "refs/exps/"  # where DVC keeps experiments: refs/exps/<baseline[:2]>/<baseline[2:]>/<name>
TIMEOUT_S = 60  # a remote that has not answered a probe by then is unreachable
TAIL_LINES = 8  # of a failed dvc or git command, quoted in the error


class RemoteError(RuntimeError):
    """A git or DVC remote that is not configured or cannot be reached, or a push or pull that failed."""


@dataclass(frozen=True)
class Experiment:
    """A night's experiment: its name, its commit, and what its commit message recorded (``message``)."""

    name: str
    rev: str
    meta: dict


def name(profile: str, date: str) -> str:
    return f"{PREFIX}{profile}-{date}"


def message(meta: dict) -> str:
    """The experiment's commit message: a subject, then ``meta`` as one line of JSON (``nights`` reads it back)."""
    subject = f"nightly {meta['date']}: profile {meta['profile']}, commit {meta['commit']}"
    return f"{subject}\n\n{json.dumps(meta, sort_keys=True)}\n"


def run(cmd: list[str], repo: Path, timeout: float | None = None) -> subprocess.CompletedProcess:
    """A git or dvc command in ``repo`` that never asks for a password (it would wait forever under cron)."""
    env = os.environ | {
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_SSH_COMMAND": os.environ.get("GIT_SSH_COMMAND", "ssh -o BatchMode=yes"),
    }
    return subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=timeout)


def dvc(*args: str) -> list[str]:
    return [sys.executable, "-m", "dvc", *args]


def last_lines(done: subprocess.CompletedProcess) -> str:
    lines = [line.rstrip() for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    return "\n".join(f"    {line}" for line in lines[-TAIL_LINES:])


def git_remote_url(repo: Path, remote: str) -> str:
    """The URL of git remote ``remote``, credentials and paths of a URL left out; RemoteError if there is none."""
    done = run(["git", "remote", "get-url", remote], repo)
    if done.returncode != 0:
        known = run(["git", "remote"], repo).stdout.split()
        raise RemoteError(
            f"git remote {remote!r} is not configured in {repo} (its remotes: {', '.join(known) or 'none'}): "
            f"git remote add {remote} URL"
        )
    url = done.stdout.strip()
    return redact(url) if "://" in url else url


def check(repo: Path, git_remote: str) -> str:
    """Both remotes probed: ``git_remote`` answers, and DVC's default remote answers (a local one: an existing
    writable directory). Returns them as a summary names them; RemoteError naming the one that does not."""
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    url = git_remote_url(repo, git_remote)
    try:
        done = run(["git", "ls-remote", "--heads", git_remote], repo, TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RemoteError(f"git remote {git_remote!r} ({url}) did not answer in {TIMEOUT_S} s") from None
    if done.returncode != 0:
        raise RemoteError(f"git remote {git_remote!r} ({url}) cannot be reached:\n{last_lines(done)}")
    try:
        with Repo(str(repo)) as project:
            remote = project.cloud.get_remote()
            where = remote.fs.unstrip_protocol(remote.path)
        with Repo(str(repo), rev="HEAD") as commit:  # how `dvc exp push` and `dvc exp pull` see it
            seen = commit.cloud.get_remote(remote.name)
        if seen.path != remote.path:
            raise RemoteError(
                f"DVC remote {remote.name!r} is {remote.path} here but {seen.path} in a commit: a relative path in "
                f".dvc/config, which DVC resolves against the commit's root when it pushes or pulls an experiment; "
                f"give it an absolute one (dvc remote modify --local {remote.name} url /absolute/path)"
            )
        if remote.fs.protocol == "local":
            path = Path(remote.path)
            if not path.is_dir():
                raise RemoteError(
                    f"DVC remote {remote.name!r} ({path}) is not a directory: create it (mkdir -p {path}), mount "
                    f"the share it is on, or point the remote elsewhere on this machine (dvc remote modify --local "
                    f"{remote.name} url /absolute/path); docs/report.md#sharing-the-atlas-a-dvc-remote"
                )
            if not os.access(path, os.W_OK | os.X_OK):
                raise RemoteError(f"DVC remote {remote.name!r} ({path}) cannot be written by this user")
        else:
            remote.fs.exists(remote.path)  # raises when the remote cannot be reached
    except RemoteError:
        raise
    except Exception as err:  # DVC's errors and the filesystems' (credentials, DNS, refused connections)
        kind = "" if isinstance(err, DvcException) else f"{type(err).__name__}: "
        raise RemoteError(f"the DVC remote cannot be used: {kind}{err}") from None
    return f"git remote {git_remote!r} ({url}) and DVC remote {remote.name!r} ({where})"


def push(repo: Path, git_remote: str, profile: str) -> list[str]:
    """``dvc exp push``: each night of ``profile`` here that ``git_remote`` lacks (this one, and any whose push
    failed before), its ref to ``git_remote``, its outputs to DVC's default remote; returns their names."""
    there = set(remote_names(repo, git_remote, profile))
    names = [e.name for e in nights(repo, profile) if e.name not in there]
    push_named(repo, git_remote, names)
    return names


def push_named(repo: Path, git_remote: str, names: list[str]) -> None:
    """``dvc exp push``: the experiments ``names``, their refs to ``git_remote``, their outputs to DVC's default
    remote."""
    if names:
        done = run(dvc("exp", "push", git_remote, *names), repo)
        if done.returncode != 0:
            pushing = " ".join(names) if len(names) < 4 else f"{names[0]} ... ({len(names)} experiments)"
            raise RemoteError(
                f"`dvc exp push {git_remote} {pushing}` failed (exit {done.returncode}):\n{last_lines(done)}"
            )


def remote_names(repo: Path, git_remote: str, profile: str) -> list[str]:
    """The names of the nights of ``profile`` that ``git_remote`` holds."""
    done = run(["git", "ls-remote", git_remote, f"{REFS}*"], repo, TIMEOUT_S)
    if done.returncode != 0:
        raise RemoteError(f"git ls-remote {git_remote} failed:\n{last_lines(done)}")
    refs = [line.split("\t")[-1] for line in done.stdout.splitlines()]
    return sorted({ref.rsplit("/", 1)[-1] for ref in refs if ref.rsplit("/", 1)[-1].startswith(f"{PREFIX}{profile}-")})


def pull(repo: Path, git_remote: str, profile: str) -> list[str]:
    """The nights of ``profile`` that ``git_remote`` holds and this clone lacks, pulled with their outputs
    (``dvc exp pull``); returns their names."""
    have = {e.name for e in nights(repo, profile)}
    missing = [n for n in remote_names(repo, git_remote, profile) if n not in have]
    if missing:
        done = run(dvc("exp", "pull", git_remote, *missing), repo)
        if done.returncode != 0:
            raise RemoteError(f"`dvc exp pull {git_remote} ...` ({len(missing)} nights) failed:\n{last_lines(done)}")
    return missing


def nights(repo: Path, profile: str) -> list[Experiment]:
    """This clone's nights of ``profile`` (its own and those pulled), oldest first; an experiment whose message is
    not a night's (named so by hand) is left out."""
    done = run(["git", "for-each-ref", "--format=%(refname)%00%(objectname)%00%(contents:body)", REFS], repo)
    found = []
    for record in done.stdout.split("\n"):
        ref, _, rest = record.partition("\0")
        experiment = ref.rsplit("/", 1)[-1]
        if not experiment.startswith(f"{PREFIX}{profile}-"):
            continue
        rev, _, body = rest.partition("\0")
        try:
            meta = json.loads(body)
        except json.JSONDecodeError:
            continue
        if isinstance(meta, dict) and meta.get("profile") == profile:
            found.append(Experiment(experiment, rev, meta))
    return sorted(found, key=lambda e: e.meta["date"])


def read(repo: Path, rev: str, paths: list[str]) -> dict[str, bytes]:
    """Files of the experiment ``rev``, DVC's outputs among them (from the cache, else the DVC remote)."""
    from dvc.api import DVCFileSystem

    fs = DVCFileSystem(str(repo), rev=rev)
    try:
        return {path: fs.read_bytes(path) for path in paths}
    except Exception as err:  # noqa: BLE001 (DVC's and the remote's errors alike: the remote lacks it)
        raise RemoteError(f"cannot read the outputs of experiment {rev[:12]}: {type(err).__name__}: {err}") from None
