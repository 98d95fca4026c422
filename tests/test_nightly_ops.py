"""The nightly's schedules as an operator meets them: ``ops/nightly``, run by the shipped crontab line in cron's
environment (``env -i``, PATH=/usr/bin:/bin, ``sh -c``) in a fresh clone of an upstream repository. Fast, on a stub
checkout whose ``pipeline.nightly`` only records how it was called: bad input named before anything runs, the
checkout brought to the upstream's head past what `dvc exp run` leaves modified, the exit status not masked, the
locks of a run in progress waited for; the night's summary in cron's mail and the CI job's summary, and a night that
did not run said there and to a real webhook on loopback. Slow (integration): two real nights on the tiny profile,
the upstream changing dvc.lock and params.yaml between them."""

from __future__ import annotations

import getpass
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from pipeline.common.locks import owned
from tests.helpers import ROOT
from tests.helpers.upstream import VENV, copy_kernels, git, push_change, upstream_and_clone
from tests.helpers.webhook import webhook

SCRIPT = ROOT / "ops" / "nightly"
SHIPPED_PATH = "/srv/capacity-atlas"  # the checkout's path in ops/crontab.example and the systemd units

STUB_NIGHTLY = """# pipeline.nightly's stand-in: records its call, writes a comparison and a summary (to each --summary
# FILE), exits as nightly/stub-exit says; with nightly/stub-no-summary it stops before its summary, as a crash would
import json, os, pathlib, shutil, subprocess, sys
root = pathlib.Path.cwd()
(root / "report").mkdir(exist_ok=True)
(root / "report" / "nightly.md").write_text("# Nightly stub\\n\\nNo change.\\n")
head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True).stdout
call = {"argv": sys.argv[1:], "python": shutil.which("python"), "dvc": shutil.which("dvc"), "head": head,
        "dirty": dirty.split(), "identity": os.environ.get("GIT_AUTHOR_EMAIL")}
with open(root / "nightly" / "calls.jsonl", "a") as f:
    f.write(json.dumps(call) + "\\n")
print("stub nightly", json.dumps(call))
stub_exit = root / "nightly" / "stub-exit"
code = int(stub_exit.read_text()) if stub_exit.exists() else 0
args = sys.argv[1:]
if not (root / "nightly" / "stub-no-summary").exists():
    for name in [args[i + 1] for i, arg in enumerate(args) if arg == "--summary"]:
        with open(name, "a") as f:
            f.write(f"Capacity Atlas nightly (stub): exit {code}\\n\\n- verdict: lis 4 lstm D=8: solved -> failed\\n")
sys.exit(code)
"""
SECRET = "s3cr3t"  # in the test webhook's path, as a Slack webhook's token is: never printed


def crontab_command(checkout: Path, profile: str) -> str:
    """The command of ops/crontab.example's one job line, for ``checkout`` and ``profile``."""
    jobs = [line for line in (ROOT / "ops" / "crontab.example").read_text().splitlines()
            if line.strip() and not line.startswith("#") and "=" not in line.split()[0]]
    assert len(jobs) == 1, jobs
    command = jobs[0].split(None, 5)[5]
    assert "%" not in command  # cron would turn it into a newline
    assert SHIPPED_PATH in command and "--profile laptop" in command
    return command.replace(SHIPPED_PATH, str(checkout)).replace("--profile laptop", f"--profile {profile}")


def cron(command: str, home: Path, timeout: int = 120) -> subprocess.CompletedProcess:
    """``command`` as cron runs it: /bin/sh -c, in HOME, with cron's environment only."""
    env = [f"HOME={home}", "PATH=/usr/bin:/bin", "SHELL=/bin/sh", f"LOGNAME={getpass.getuser()}"]
    home.mkdir(exist_ok=True)
    return subprocess.run(["env", "-i", *env, "sh", "-c", command], cwd=home, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def stub(tmp_path) -> tuple[Path, Path]:
    """(upstream, clone) of a stub checkout: ops/nightly, the .gitignore, params.yaml, dvc.yaml and dvc.lock, the
    webhook notifier and its URL helper, the locks' module, and a pipeline.nightly that only records its calls."""
    src = tmp_path / "src"
    for name in ("ops/nightly", ".gitignore", "params.yaml", "dvc.yaml", "dvc.lock", "README.md",
                 "pipeline/nightly/notify.py", "pipeline/common/urls.py", "pipeline/common/locks.py"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    (src / "pipeline" / "__init__.py").write_text("")
    (src / "pipeline" / "nightly" / "__main__.py").write_text(STUB_NIGHTLY)
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=src, check=True)
    git(src, "add", "-A")
    git(src, "commit", "-qm", "stub")
    return upstream_and_clone(src, tmp_path)


def calls(clone: Path) -> list[dict]:
    path = clone / "nightly" / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_outside_a_checkout_it_stops_with_a_named_error(tmp_path):
    (tmp_path / "ops").mkdir()
    shutil.copy2(SCRIPT, tmp_path / "ops" / "nightly")
    done = cron(f"{tmp_path}/ops/nightly --profile tiny", tmp_path / "home")
    assert done.returncode == 2 and "is not in a git checkout" in done.stderr, done.stderr
    assert not (tmp_path / "nightly").exists()


def test_without_a_venv_it_stops_with_a_named_error(tmp_path, stub):
    _, clone = stub
    (clone / ".venv").unlink()
    done = cron(crontab_command(clone, "tiny"), tmp_path / "home")
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"no .venv in {clone}" in done.stdout  # --quiet: the error is in cron's mail
    assert f"no .venv in {clone}" in (clone / "nightly" / "cron.log").read_text() and not calls(clone)


def test_a_modified_tracked_file_stops_it_named_and_untouched(tmp_path, stub):
    """Someone's edit in the nightly's checkout: named, left as it is, nothing pulled, nothing run; a local commit
    the upstream lacks likewise."""
    upstream, clone = stub
    new_head = push_change(upstream, tmp_path, {"README.md": "upstream's README\n"})
    head = git(clone, "rev-parse", "HEAD")
    (clone / "params.yaml").write_text("profile: tiny\n")  # as `dvc exp run` leaves it: not the problem
    (clone / "dvc.yaml").write_text("someone's edit\n")
    done = cron(crontab_command(clone, "tiny"), tmp_path / "home")
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"tracked files are modified in {clone}: dvc.yaml.\n" in done.stdout  # not params.yaml
    assert (clone / "dvc.yaml").read_text() == "someone's edit\n"
    assert (clone / "params.yaml").read_text() == "profile: tiny\n"
    assert git(clone, "rev-parse", "HEAD") == head != new_head and not calls(clone)

    git(clone, "checkout", "--", "dvc.yaml")
    git(clone, "commit", "-qam", "a local commit")
    done = cron(crontab_command(clone, "tiny"), tmp_path / "home")
    assert done.returncode == 2 and "has commits that origin/main lacks" in done.stdout, done.stdout
    assert "a local commit" in done.stdout and not calls(clone)


def test_the_crontab_line_updates_the_checkout_and_passes_the_exit_status_on(tmp_path, stub):
    """Two nights of the shipped crontab line on the stub: the first's regression (exit 1) reaches cron; between
    them the upstream changes dvc.lock and params.yaml, which the first night's `dvc exp run` left modified here;
    the second night runs on the upstream's head, clean."""
    upstream, clone = stub
    command = crontab_command(clone, "tiny")
    (clone / "nightly").mkdir()
    (clone / "nightly" / "stub-exit").write_text("1")
    first = cron(command, tmp_path / "home")
    assert first.returncode == 1, first.stdout + first.stderr
    assert first.stdout.startswith("== ops/nightly summary: exit 1, REGRESSION, after ")  # the mail: the summary
    assert "\n\nCapacity Atlas nightly (stub): exit 1\n\n- verdict: lis 4 lstm D=8: solved -> failed\n" in first.stdout
    assert "stub nightly" not in first.stdout  # the night's summary, not its log
    night = calls(clone)[-1]
    assert night["python"] == str(clone / ".venv" / "bin" / "python") and night["dvc"].startswith(str(clone))
    argv = night["argv"]  # the night's summary to a file of this night's, read into the mail, then removed
    assert argv[:4] == ["--wait", "--repo", str(clone), "--summary"] and argv[5:] == ["--profile", "tiny"]
    assert argv[4].startswith(str(clone / "nightly" / ".summary.")) and not Path(argv[4]).exists()
    assert night["identity"]  # no git identity in this HOME: the nightly's own, for the experiments' commits

    for name in ("params.yaml", "dvc.lock"):  # what `dvc exp run` leaves
        (clone / name).write_text((clone / name).read_text() + "# the night's\n")
    (clone / "untracked-notes.txt").write_text("someone's notes\n")
    (clone / "nightly" / "stub-exit").write_text("0")
    head = push_change(upstream, tmp_path, {"dvc.lock": "# upstream's lock\n", "params.yaml": "profile: tiny\n"})
    second = cron(command, tmp_path / "home")
    assert second.returncode == 0, second.stdout + second.stderr
    assert "summary: exit 0, no regression" in second.stdout and "stub nightly" not in second.stdout
    night = calls(clone)[-1]
    assert night["head"] == head and night["dirty"] == []
    assert git(clone, "rev-parse", "HEAD") == head and (clone / "dvc.lock").read_text() == "# upstream's lock\n"
    assert (clone / "untracked-notes.txt").exists()
    log = (clone / "nightly" / "cron.log").read_text()
    assert log.count("stub nightly") == 2 and "put back as committed" in log and "main at " in log


def test_it_waits_for_dvc_and_a_sweep_in_progress(tmp_path, stub):
    """Someone's `dvc repro` holds DVC's repo lock (DVC's own Lock), a sweep its lock: the night waits, names them,
    and runs once they are let go; still held after --wait-minutes, it stops with exit 3."""
    from dvc.lock import Lock

    _, clone = stub
    (clone / ".dvc" / "tmp").mkdir(parents=True)
    (clone / "results").mkdir()
    env = os.environ | {"NIGHTLY_POLL_SECONDS": "1"}
    script = [str(clone / "ops" / "nightly"), "--profile", "tiny"]
    dvc_lock = Lock(str(clone / ".dvc" / "tmp" / "lock"))
    dvc_lock.lock()
    try:
        with owned(clone / "results" / ".sweep.lock", "busy"):
            done = subprocess.run([*script, "--wait-minutes", "0"], env=env, capture_output=True, text=True,
                                  timeout=60)
            assert done.returncode == 3, done.stdout + done.stderr
            assert "still held after 0 minutes: .dvc/tmp/lock" in done.stdout
            assert "results/.sweep.lock (pid" in done.stdout
            assert not calls(clone)
            waiting = subprocess.Popen([*script, "--wait-minutes", "1"], env=env, stdout=subprocess.PIPE, text=True)
            time.sleep(3)
            assert waiting.poll() is None and not calls(clone)
    finally:
        dvc_lock.unlock()
    out = waiting.communicate(timeout=60)[0]
    assert waiting.returncode == 0, out
    assert "waiting for .dvc/tmp/lock" in out and len(calls(clone)) == 1


def test_the_ci_job_summary_gets_the_nights_and_the_night_gets_force_notify_and_report_url(tmp_path, stub):
    """As the workflow calls it: --force, --notify and --report-url passed on to pipeline.nightly; the headline and
    the night's summary appended to $GITHUB_STEP_SUMMARY; the log ends with the headline."""
    _, clone = stub
    job = tmp_path / "step-summary.md"
    url = f"https://hooks.example.org/services/T0/B0/{SECRET}"
    done = subprocess.run([str(clone / "ops" / "nightly"), "--profile", "tiny", "--no-update", "--force",
                           "--notify", url, "--report-url", "https://ci.example.org/runs/7"],
                          env=os.environ | {"GITHUB_STEP_SUMMARY": str(job)}, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    argv = calls(clone)[-1]["argv"]
    assert argv[5:] == ["--profile", "tiny", "--force", "--notify", url, "--report-url", "https://ci.example.org/runs/7"]
    text = job.read_text()
    assert text.startswith("== ops/nightly summary: exit 0, no regression, after ")
    assert text.endswith("\n\nCapacity Atlas nightly (stub): exit 0\n\n- verdict: lis 4 lstm D=8: solved -> failed\n\n")
    assert done.stdout.splitlines()[-1].startswith("== ops/nightly summary: exit 0, no regression")
    assert SECRET not in done.stdout.replace(json.dumps(calls(clone)[-1]), "")  # but for the stub's record of argv


def test_a_night_that_does_not_run_says_why_in_the_mail_and_to_the_webhook(tmp_path, stub):
    """Stopped by ops/nightly itself (a modified checkout; no venv, with the system's Python to post), or by a
    pipeline.nightly that crashed before its summary: why, in cron's mail and POSTed to the webhook (pipeline.nightly
    posts only what it summarised). A --notify URL that is not http(s) stops it before it updates the checkout."""
    upstream, clone = stub
    (clone / "dvc.yaml").write_text("someone's edit\n")
    with webhook() as hook:
        done = cron(crontab_command(clone, "tiny") + f" --notify {hook.url}", tmp_path / "home")
        assert done.returncode == 2 and not calls(clone), done.stdout + done.stderr
        [post] = hook.posts
        text = post.body["text"]
        assert text.startswith("== ops/nightly summary: exit 2, the night did not run, after ")
        assert f"ops/nightly: error: tracked files are modified in {clone}: dvc.yaml." in text
        assert done.stdout.startswith(text) and f"notify: posted to {hook.url.split('/hooks')[0]}/…" in done.stdout
        assert SECRET not in done.stdout + (clone / "nightly" / "cron.log").read_text()
        git(clone, "checkout", "--", "dvc.yaml")

        (clone / ".venv").unlink()  # the system's python3 posts
        done = cron(crontab_command(clone, "tiny") + f" --notify={hook.url}", tmp_path / "home")
        assert done.returncode == 2 and len(hook.posts) == 2, done.stdout + done.stderr
        assert f"no .venv in {clone}" in hook.posts[1].body["text"]
        (clone / ".venv").symlink_to(VENV)

        (clone / "nightly" / "stub-exit").write_text("2")
        (clone / "nightly" / "stub-no-summary").write_text("")
        done = cron(crontab_command(clone, "tiny") + f" --notify {hook.url}", tmp_path / "home")
        assert done.returncode == 2 and len(calls(clone)) == 1 and len(hook.posts) == 3, done.stdout + done.stderr
        text = hook.posts[2].body["text"]
        assert text.startswith("== ops/nightly summary: exit 2, the pipeline or its config failed, after ")
        assert "pipeline.nightly wrote no summary; the night's last lines" in text and "    stub nightly " in text
        assert done.stdout.startswith(text)

    head = git(clone, "rev-parse", "HEAD")
    new_head = push_change(upstream, tmp_path, {"README.md": "upstream's README\n"})
    done = cron(crontab_command(clone, "tiny") + f" --notify ftp://hooks.example.org/{SECRET}", tmp_path / "home")
    assert done.returncode == 2 and len(calls(clone)) == 1, done.stdout + done.stderr
    assert "ops/nightly: error: --notify 'ftp://hooks.example.org/…' is not an http(s) URL" in done.stdout
    assert git(clone, "rev-parse", "HEAD") == head != new_head and SECRET not in done.stdout


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_the_systemd_units_verify_and_the_timer_catches_up(tmp_path):
    service, timer = ((ROOT / "ops" / f"capacity-atlas-nightly.{kind}").read_text() for kind in ("service", "timer"))
    for line in ("Type=oneshot", f"WorkingDirectory={SHIPPED_PATH}",
                 f"ExecStart={SHIPPED_PATH}/ops/nightly --profile laptop"):
        assert f"\n{line}\n" in service
    assert "\nOnCalendar=*-*-* 02:30\n" in timer and "\nPersistent=true\n" in timer
    for kind, text in (("service", service), ("timer", timer)):  # ExecStart's program must exist
        (tmp_path / f"capacity-atlas-nightly.{kind}").write_text(text.replace(SHIPPED_PATH, str(ROOT)))
    done = subprocess.run(["systemd-analyze", "verify", *sorted(str(p) for p in tmp_path.iterdir())],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr


def test_the_workflow_sets_what_dvc_exp_run_needs_before_it_calls_ops_nightly():
    import yaml

    steps = yaml.safe_load((ROOT / ".github" / "workflows" / "nightly.yml").read_text())["jobs"]["nightly"]["steps"]
    runs = [step.get("run", "") for step in steps]
    night = next(i for i, run in enumerate(runs) if run.startswith("ops/nightly "))
    before = "\n".join(runs[:night])
    assert "git config user.name" in before and "git config user.email" in before
    assert 'echo "$PWD/.venv/bin" >> "$GITHUB_PATH"' in before
    assert "--profile laptop" in runs[night] and "||" not in runs[night]
    # the step's line as the runner's bash runs it, with ops/nightly replaced by a printer of its arguments: the
    # webhook only where the secret is set, --force only where the dispatch asked for it
    env = steps[night]["env"]
    assert env["NIGHTLY_WEBHOOK"] == "${{ secrets.NIGHTLY_WEBHOOK }}" and "github.run_id" in env["RUN_URL"]
    line = runs[night].replace("ops/nightly ", "printf '%s\\n' ", 1)
    common = ["--profile", "laptop", "--no-update", "--report-url", "https://github.com/o/r/actions/runs/7"]
    for given, expected in (({}, common), ({"NIGHTLY_WEBHOOK": "https://hooks.example.org/a b"},
                                           [*common, "--notify", "https://hooks.example.org/a b"]),
                            ({"FORCE": "--force"}, [*common, "--force"])):
        done = subprocess.run(["bash", "-e", "-c", line], capture_output=True, text=True, check=True,
                              env={"PATH": os.environ["PATH"], "RUN_URL": common[-1], "NIGHTLY_WEBHOOK": "",
                                   "FORCE": "", **given})
        assert done.stdout.splitlines() == expected


@pytest.mark.slow
@pytest.mark.integration
def test_two_nights_of_the_crontab_line_in_a_fresh_clone(tmp_path):
    """The operator's case, end to end: a fresh clone of an upstream, the shipped crontab line run by cron's
    /bin/sh with cron's environment, two nights on a narrowed tiny profile; between them the upstream commits a
    change to dvc.lock and one to params.yaml, both of which the first night's `dvc exp run` left modified in the
    clone (a `git pull` would refuse). Both nights end with a comparison, the second against the first, on the
    upstream's head."""
    from tests.helpers.repo import copy_repo

    src = copy_repo(tmp_path / "src", "sweep: {grid: {architectures: [standard], widths: [8]}}", tasks=["lis"])
    upstream, clone = upstream_and_clone(src, tmp_path)
    copy_kernels(src, clone)
    command = crontab_command(clone, "tiny")
    home = tmp_path / "home"
    started = time.time()
    first = cron(command, home, timeout=900)
    first_s = time.time() - started
    assert first.returncode in (0, 1), (clone / "nightly" / "cron.log").read_text()[-5000:]
    # what `dvc exp run` left modified, and the upstream changes next: a `git pull` would refuse
    assert git(clone, "diff", "--name-only").split() == ["dvc.lock", "params.yaml"]

    lock = (clone / "dvc.lock").read_text()
    params = (upstream_params := (src / "params.yaml").read_text()).replace("# The one setting", "# The setting")
    assert params != upstream_params
    head = push_change(upstream, tmp_path, {"dvc.lock": "# the upstream's lock\n" + (src / "dvc.lock").read_text(),
                                            "params.yaml": params})
    assert lock != (tmp_path / "upstream-work" / "dvc.lock").read_text()
    started = time.time()
    second = cron(command, home, timeout=900)
    second_s = time.time() - started
    log = (clone / "nightly" / "cron.log").read_text()
    assert second.returncode in (0, 1), log[-5000:]

    nights = sorted(p for p in (clone / "nightly").iterdir() if p.is_dir())
    assert len(nights) == 2 and all((n / "comparison.json").exists() for n in nights), nights
    assert "First night of profile tiny" in (nights[0] / "nightly.md").read_text()
    assert f"against {nights[0].name}" in (nights[1] / "nightly.md").read_text()
    assert f"Against night {nights[0].name}." in second.stdout  # the mail: the night's summary
    meta = json.loads((nights[1] / "meta.json").read_text())
    assert meta["commit"] == head[:12]  # the upstream's head, clean: not "-dirty"
    assert git(clone, "rev-parse", "HEAD") == head == git(upstream, "rev-parse", "HEAD")
    assert log.count("== ops/nightly summary") == 2 and "put back as committed" in log
    print(f"first night {first_s:.0f} s (exit {first.returncode}), second {second_s:.0f} s (exit "
          f"{second.returncode})\n{first.stdout}\n{second.stdout}")
