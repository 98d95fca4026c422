"""The atlas a team shares: each night a named DVC experiment, pushed to a git remote (its ref) and the DVC remote
(its datasets, results and report); a teammate's clone pulls the nights and sees them in `dvc exp show`, `dvc metrics
diff`, the history figures and `dvc pull`. A remote that is not configured or cannot be reached is named before
anything runs, and the night's summary says why."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.tracking import experiments
from tests.helpers import ROOT
from tests.helpers.repo import pipeline_env
from tests.helpers.upstream import git, upstream_and_clone

SHIPPED_REMOTE = "/srv/capacity-atlas-dvc-remote"  # .dvc/config's: beside the shipped schedules' checkout


def nightly(repo: Path, *args: str, code: Path = ROOT) -> subprocess.CompletedProcess:
    """``python -m pipeline.nightly --repo repo --profile tiny args...`` run in ``code`` (a clone runs its own: the
    MLflow store is its code's), with ``pipeline_env``: this venv's tools on the PATH (DVC's stages run `python -m
    ...`) and no MLflow server an earlier test of this worker left in the environment."""
    return subprocess.run([sys.executable, "-m", "pipeline.nightly", "--repo", str(repo), "--profile", "tiny", *args],
                          cwd=code, capture_output=True, text=True, timeout=600, env=pipeline_env(PYTHONPATH=str(code)))


def dvc(repo: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=repo, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def exp_refs(repo: Path) -> list[str]:
    return git(repo, "for-each-ref", "--format=%(refname)", "refs/exps").split()


@pytest.mark.slow  # over 10 s on 2 cores: the fast tier stays a developer's loop
def test_a_remote_that_cannot_be_reached_is_named_before_anything_runs(tmp_path):
    """No git remote, one that does not answer, a DVC remote directory that does not exist (an NFS share not
    mounted), one given as a relative path in .dvc/config (DVC would push an experiment's outputs to the filesystem's
    root), a DVC remote whose plugin is not installed: exit 2 with the remote named, on stderr and in the night's
    summary, before the lock, DVC or any training; --pull alike. A push the upstream refuses says why."""
    shipped = (ROOT / ".dvc" / "config").read_text()
    assert f"\n    url = {SHIPPED_REMOTE}\n" in shipped and "\n    remote = atlas\n" in shipped
    repo = tmp_path / "checkout"
    (repo / ".dvc").mkdir(parents=True)
    for name in ("params.yaml", "dvc.yaml"):
        shutil.copy2(ROOT / name, repo / name)
    missing = tmp_path / "team-remote"  # nobody made it
    (repo / ".dvc" / "config").write_text(shipped.replace(SHIPPED_REMOTE, str(missing)))
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "a checkout")
    summary = tmp_path / "summary.md"
    bare = tmp_path / "upstream.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(repo), str(bare)], check=True)

    def stopped(args: list[str], says: str) -> None:
        summary.write_text("")
        done = nightly(repo, *args, "--summary", str(summary))
        assert done.returncode == 2 and f"error: {says}" in done.stderr, done.stdout + done.stderr
        text = summary.read_text()
        assert text.startswith("Capacity Atlas nightly: did not run, exit 2 (profile tiny, ")
        assert f"A remote: {says}" in text, text
        assert not (repo / "nightly").exists() and not exp_refs(repo)  # not even the lock; no experiment
        assert "Running stage" not in done.stdout

    with pytest.raises(experiments.RemoteError, match=f"git remote 'origin' is not configured in {repo} "
                       r"\(its remotes: none\): git remote add origin URL"):
        experiments.check(repo, "origin")
    git(repo, "remote", "add", "origin", str(tmp_path / "nowhere.git"))
    stopped(["--push"], f"git remote 'origin' ({tmp_path / 'nowhere.git'}) cannot be reached:")
    git(repo, "remote", "set-url", "origin", str(bare))
    stopped(["--pull", "origin"], f"DVC remote 'atlas' ({missing}) is not a directory: create it")
    assert not missing.exists()  # never created: it may be a share that is not mounted
    missing.mkdir()
    (repo / ".dvc" / "config").write_text(shipped.replace(SHIPPED_REMOTE, "../../team-remote"))  # beside the checkout
    git(repo, "commit", "-qam", "a relative remote")
    with pytest.raises(experiments.RemoteError, match=f"DVC remote 'atlas' is {missing} here but /team-remote in a "
                       "commit: a relative path in .dvc/config"):
        experiments.check(repo, "origin")
    local = repo / ".dvc" / "config.local"  # what `dvc remote modify --local atlas url URL` writes
    local.write_text("['remote \"atlas\"']\n    url = s3://capacity-atlas-test/atlas\n")
    with pytest.raises(experiments.RemoteError, match="the DVC remote cannot be used: ImportError: s3 is supported, "
                       "but requires 'dvc-s3' to be installed"):
        experiments.check(repo, "origin")

    local.write_text(f"['remote \"atlas\"']\n    url = {missing}\n")  # this machine's, absolute
    assert experiments.check(repo, "origin") == f"git remote 'origin' ({bare}) and DVC remote 'atlas' ({missing})"
    assert experiments.push(repo, "origin", "tiny") == []  # no night here
    # a night (as `dvc exp run -n ... -m ...` records one) whose push fails (the upstream cannot store its ref): named;
    # once the upstream takes it, the next push sends it
    meta = {"date": "2026-01-01T023000", "commit": "0123456789ab", "profile": "tiny"}
    head = git(repo, "rev-parse", "HEAD")
    night = git(repo, "commit-tree", "HEAD^{tree}", "-p", "HEAD", "-m", experiments.message(meta))
    git(repo, "update-ref", f"refs/exps/{head[:2]}/{head[2:]}/nightly-tiny-2026-01-01T023000", night)
    git(repo, "update-ref", f"refs/exps/{head[:2]}/{head[2:]}/by-hand", night)  # not a night's name
    [found] = experiments.nights(repo, "tiny")
    assert (found.name, found.rev, found.meta) == ("nightly-tiny-2026-01-01T023000", night, meta)
    blocker = bare / "refs" / "exps"
    blocker.write_text("a file where the experiments' refs would go\n")
    with pytest.raises(experiments.RemoteError, match=r"`dvc exp push origin nightly-tiny-2026-01-01T023000` failed "
                       r"\(exit \d+\):\n    "):
        experiments.push(repo, "origin", "tiny")
    blocker.unlink()
    assert experiments.push(repo, "origin", "tiny") == ["nightly-tiny-2026-01-01T023000"]
    assert experiments.remote_names(repo, "origin", "tiny") == ["nightly-tiny-2026-01-01T023000"]


@pytest.mark.slow
@pytest.mark.integration
def test_two_nights_pushed_from_one_clone_are_seen_in_another(tmp_path):
    """Clone 1 runs two nights with --push, the upstream growing the grid between them; clone 2 pulls them: both
    nights in `dvc exp show`, their metrics in `dvc metrics diff`, both in its history figures; the last night's
    datasets and results come back from the DVC remote with `dvc pull`. Each clone's DVC remote is the team's
    directory, set with --local as each machine sets it."""
    from tests.helpers.repo import copy_repo
    from tests.helpers.upstream import copy_kernels, push_change

    # one task, one trial a width: a night as short as one can be
    src = copy_repo(tmp_path / "src", "sweep: {grid: {architectures: [standard], widths: [8]}}", tasks=["lis"])
    upstream, first = upstream_and_clone(src, tmp_path)
    copy_kernels(src, first)
    remote = tmp_path / "team-remote"
    remote.mkdir()
    dvc(first, "remote", "modify", "--local", "atlas", "url", str(remote))

    started = time.time()
    one = nightly(first, "--push", code=first)
    night1_s = time.time() - started
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-3000:]
    assert "Pushed as experiment nightly-tiny-" in one.stdout and f"DVC remote 'atlas' ({remote})" in one.stdout
    one_kib = sum(f.stat().st_size for f in remote.rglob("*") if f.is_file()) / 1024
    # the upstream grows the grid; the clone comes to its head as ops/nightly brings it
    head = push_change(upstream, tmp_path, {"params.yaml": (src / "params.yaml").read_text().replace(
        "widths: [8]", "widths: [8, 16]")})
    git(first, "checkout", "--", "params.yaml", "dvc.lock")
    git(first, "pull", "-q", "--ff-only")
    started = time.time()
    two = nightly(first, "--push", code=first)
    night2_s = time.time() - started
    assert two.returncode in (0, 1), two.stdout[-3000:] + two.stderr[-3000:]
    names = [e.name for e in experiments.nights(first, "tiny")]
    assert len(names) == 2 and names == experiments.remote_names(first, "origin", "tiny")
    stored = [f.stat().st_size for f in remote.rglob("*") if f.is_file()]
    assert stored and f"Pushed as experiment {names[1]} to " in two.stdout

    # a teammate's clone
    second = tmp_path / "teammate" / "checkout"
    subprocess.run(["git", "clone", "-q", str(upstream), str(second)], check=True)
    assert git(second, "rev-parse", "HEAD") == head
    dvc(second, "remote", "modify", "--local", "atlas", "url", str(remote))
    started = time.time()
    pulled = nightly(second, "--pull", code=second)
    pull_s = time.time() - started
    assert pulled.returncode == 0, pulled.stdout[-3000:] + pulled.stderr[-3000:]
    brief = pulled.stdout.split("== nightly summary\n")[1]
    assert brief.startswith("Capacity Atlas nightly: pulled 2 nights (profile tiny)\n\nFrom git remote 'origin' ("), \
        brief
    assert sorted(e.name for e in experiments.nights(second, "tiny")) == names

    shown = json.loads(dvc(second, "exp", "show", "-A", "--json"))
    found = {exp["name"]: exp for rev in shown for exp in [rev, *[e for x in rev.get("experiments") or [] for e in
                                                                   x.get("revs", [])]] if exp.get("name")}
    cells = {}
    for name in names:
        metrics = found[name]["data"]["metrics"]["results/report.json"]["data"]
        cells[name] = metrics["cells"]
    assert [cells[n] for n in names] == [1, 2]  # night 2 trained width 16 as well
    diff = json.loads(dvc(second, "metrics", "diff", names[0], names[1], "--json"))
    assert diff["results/report.json"]["cells"] == {"old": 1, "new": 2, "diff": 1}

    report = second / "report"
    figures = sorted(p.name for p in report.glob("nightly_history_*.png"))
    assert figures == ["nightly_history_lis_3.png"]
    assert all((report / f).read_bytes().startswith(b"\x89PNG") for f in figures)
    nights = sorted(p for p in (second / "nightly").iterdir() if p.is_dir())
    text = (report / "history.md").read_text()
    assert f"the last {nights[1].name}, against {nights[0].name}\n" in text and "lis 3: 2 nights, " in text
    assert [json.loads((n / "meta.json").read_text())["experiment"] for n in nights] == names
    first_nights = sorted(p.name for p in (first / "nightly").iterdir() if p.is_dir())
    assert [n.name for n in nights] == first_nights
    for night in nights:  # the same tables as the clone that ran them
        assert (night / "sweep.csv").read_bytes() == (first / "nightly" / night.name / "sweep.csv").read_bytes()

    # the datasets and results from the DVC remote: the last night's outputs, no local cache
    dvc(second, "exp", "apply", names[1])
    shutil.rmtree(second / ".dvc" / "cache")
    shutil.rmtree(second / "data")
    dvc(second, "pull")
    assert (second / "data" / "lis").is_dir() and json.loads((second / "results" / "report.json").read_text())[
        "cells"] == 2
    print(f"night 1 {night1_s:.0f} s, night 2 {night2_s:.0f} s, pull {pull_s:.0f} s; the DVC remote holds "
          f"{len(stored)} files, {sum(stored) / 1024:.0f} KiB after two nights ({one_kib:.0f} KiB after the first)\n"
          f"{two.stdout.split('== nightly summary')[1]}\n{brief}")
