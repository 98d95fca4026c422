"""Nightly rerun: the pipeline on a profile as a named DVC experiment, compared cell by cell with the previous night.

    python -m pipeline.nightly --profile laptop        # dvc exp run -S profile=laptop -n nightly-laptop-<date>
    python -m pipeline.nightly --profile laptop --push  # shared: the remotes' nights pulled, this one pushed
    python -m pipeline.nightly --profile laptop --pull  # no run: a teammate's view of the shared nights
    python -m pipeline.nightly --profile laptop --force                    # from scratch: every stage and trial
    python -m pipeline.nightly --profile laptop --notify https://hooks.example.org/...  # the summary to a chat

Each night is kept in nightly/<date>_<commit>/ and compared with the latest earlier night of its profile
(report/nightly.md, a section of report/index.html, each cell's history across nights); it ends with a short summary,
printed, appended to --summary FILE and POSTed to each --notify URL. Exit status: 0 no regression, 1 a regression,
2 bad input or a failed pipeline or push, 3 another nightly holds the lock. What a night compares, reruns and costs,
its summary and the shared remotes: docs/report.md, "Nightly reruns".
"""

from __future__ import annotations

import argparse
import html
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from mlflow.tracking import MlflowClient

from pipeline.common import signals
from pipeline.common.config import RETRAIN_ENV, ROOT, Config, ConfigError, load_config
from pipeline.common.locks import NIGHTLY_LOCK, LockBusy, owned
from pipeline.common.provenance import git_commit, library_versions
from pipeline.common.urls import redact
from pipeline.nightly import comparison, history, notify
from pipeline.reporting.page import NIGHTLY_MARKER, figures_html
from pipeline.tracking import experiments

SNAPSHOT = ("results/sweep.csv", "results/trials.csv", "results/sweep.json", "results/report.json")
LISTED = 15  # changes a summary lists of each kind; the rest are counted (the report has them all)
TAIL_LINES = 15  # a failed night's summary quotes the last lines of what failed
TAIL_BYTES = 64 * 1024  # of DVC's output, kept to find them
STOP_SECONDS = 90  # a stopped night's `dvc exp run`: from SIGINT to its process group to SIGTERM
WHAT = {"min_width": "minimum width"}  # a change's ``what`` as the summary says it


class BadInput(ValueError):
    """An argument the night cannot run with (a --summary file that cannot be written): named before it runs."""


@dataclass
class Night:
    """What a summary says of where and when the night ran, filled in as it goes."""

    repo: Path
    profile: str | None
    report_url: str | None = None
    date: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H%M%S"))
    commit: str = ""
    started: float = field(default_factory=time.time)

    def headline(self, verdict: str) -> str:
        where = [f"profile {self.profile}" if self.profile else "", f"commit {self.commit}" if self.commit else ""]
        return f"Capacity Atlas nightly: {verdict} ({', '.join(filter(None, [*where, f'night {self.date}']))})"

    def report(self) -> str:
        if self.report_url:
            return f"Report: {self.report_url}"
        folder = self.repo.resolve() / "report"
        return f"Report: {folder / 'nightly.md'} and {folder / 'index.html'}"

    def took(self) -> str:
        seconds = round(time.time() - self.started)
        return f"Took {seconds // 60} min {seconds % 60} s."


def busy(nights_dir: Path) -> str:
    """What a second nightly run says while another holds the lock."""
    lock = nights_dir / NIGHTLY_LOCK
    return f"another nightly run holds {lock} ({{holder}}); this one stops. Rerun with --wait to queue behind it"


def latest_night(nights_dir: Path, profile: str) -> Path | None:
    """The last recorded night of ``profile``: the one a new night compares with."""
    nights = history.nights(nights_dir, profile)
    return nights[-1] if nights else None


def library_changes(before: dict | None, now: dict) -> dict[str, tuple[str, str]]:
    """Library -> (before, now) for each training library whose installed version differs from the night
    ``before``'s (its meta.json's ``libraries``; none recorded there: nothing to compare)."""
    if not before:
        return {}
    return {
        k: (before.get(k, "unrecorded"), now.get(k, "unrecorded"))
        for k in sorted(before.keys() | now.keys())
        if before.get(k) != now.get(k)
    }


def tag_runs(uri: str, parent: str, tags: dict) -> str | None:
    """The night's date and commit on the sweep's parent run and its children; a run an earlier night already
    tagged (DVC skipped the sweep, or restored its results) keeps its own night, whose date is returned."""
    client = MlflowClient(uri)
    run = client.get_run(parent)
    if "nightly.date" in run.data.tags:
        return run.data.tags["nightly.date"]
    children = client.search_runs(
        [run.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent}'", max_results=50_000
    )
    for run_id in [parent] + [c.info.run_id for c in children]:
        for key, value in tags.items():
            client.set_tag(run_id, key, value)
    return None


def keep_night(repo: Path, night: Path, cfg: Config, meta: dict) -> str | None:
    """The night's tables and report into ``night``, with where it came from (``meta``: date, commit, ...); its
    MLflow runs tagged with it. Returns the date of the earlier night whose sweep these results are, if any."""
    night.mkdir(parents=True)
    for name in SNAPSHOT:
        shutil.copy2(repo / name, night / Path(name).name)
    parent = json.loads((repo / "results" / "report.json").read_text())["mlflow_parent_run"]
    meta = {**meta, "profile": cfg.profile, "mlflow_parent_run": parent}
    (night / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return tag_runs(cfg.cluster.mlflow(), parent, {"nightly.date": meta["date"], "nightly.commit": meta["commit"]})


def against(before: Path | None, night: Path, cfg: Config, title: str) -> tuple[dict, str]:
    """The night compared with the one ``before`` (none: the first night), as data and as Markdown."""
    if before is None:
        empty: dict[str, list] = {key: [] for key in comparison.LISTS}
        return empty, f"# {title}\n\nFirst night of profile {cfg.profile}: nothing to compare with.\n"
    claims = [json.loads((d / "report.json").read_text()).get("claims", {}) for d in (before, night)]
    result = comparison.compare(
        pd.read_csv(before / "sweep.csv"), pd.read_csv(night / "sweep.csv"), cfg.nightly, *claims
    )
    return result, comparison.markdown(result, f"{title}, against {before.name}")


def publish(repo: Path, nights_dir: Path, night: Path, cfg: Config, result: dict, text: str, heading: str) -> str:
    """Each cell's history drawn into the report and the night, the comparison written beside them and into the
    report's page (``heading`` above it); returns the whole Markdown."""
    report_dir = repo / "report"
    for stale in report_dir.glob(f"{history.PREFIX}*.png"):  # an earlier night's, if DVC restored report/
        stale.unlink()
    drawn = history.draw(history.load(nights_dir, cfg.profile), result, cfg.report.accuracy_threshold, report_dir)
    for name in (f.name for f in drawn if f.name):
        shutil.copy2(report_dir / name, night / name)
    text += "\n" + history.markdown(drawn)
    for path in (night / "nightly.md", report_dir / "nightly.md"):
        path.write_text(text)
    page = report_dir / "index.html"
    section = (
        f"<h2>Nightly comparison</h2><p>{heading}.</p>"
        + comparison.html(result)
        + figures_html(drawn)
        + f"<p>{html.escape(history.NOTE)}</p>"
    )
    page.write_text(page.read_text().replace(NIGHTLY_MARKER, section, 1))
    return text


def dvc_command(profile: str | None, force: bool, meta: dict) -> list[str]:
    """The night's DVC run: an experiment named for the night (``experiments.name``), its commit message ``meta``,
    on ``profile`` if given (else params.yaml's); every stage if ``force``."""
    named = ["-n", experiments.name(meta["profile"], meta["date"]), "-m", experiments.message(meta)]
    profiled = ["-S", f"profile={profile}"] if profile else []
    return experiments.dvc("exp", "run", *profiled, *named, *(["--force"] if force else []))


def shown(cmd: list[str]) -> str:
    """A DVC command as the summary quotes it: ``dvc exp run -S profile=laptop -n nightly-...`` (no message)."""
    args = cmd[2:]
    if "-m" in args:
        args = args[: args.index("-m")] + args[args.index("-m") + 2 :]
    return " ".join(args)


def record_experiments(repo: Path, nights_dir: Path, profile: str) -> list[Path]:
    """Each night of ``profile`` this clone holds as an experiment (its own, and those pulled from a remote) and
    lacks in ``nights_dir``, recorded there from the experiment: its tables and metrics (from DVC's cache, else the
    DVC remote) and its meta.json (its commit message). Returns the nights recorded."""
    recorded = []
    for exp in experiments.nights(repo, profile):
        night = nights_dir / f"{exp.meta['date']}_{exp.meta['commit']}"
        if (night / "meta.json").is_file():
            continue
        try:
            files = experiments.read(repo, exp.rev, list(SNAPSHOT))
        except experiments.RemoteError as err:  # its outputs gone from the cache and no remote has them
            print(f"nightly: warning: night {exp.name} left out of the history: {err}", file=sys.stderr)
            continue
        night.mkdir(parents=True, exist_ok=True)
        for path, data in files.items():
            (night / Path(path).name).write_bytes(data)
        parent = json.loads(files["results/report.json"])["mlflow_parent_run"]
        meta = {**exp.meta, "experiment": exp.name, "mlflow_parent_run": parent}
        (night / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        recorded.append(night)
    return recorded


def run_passing_on(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, list[str]]:
    """Runs ``cmd`` in a process group of its own, its output (stderr with it) passed on to ours as it comes;
    returns its exit status and its last TAIL_LINES lines (a progress bar's last state for a line it rewrote). A
    SIGTERM or SIGINT to this process stops the whole group (``signals.run_group``): DVC passes no signal to its
    stage."""
    kept = b""
    read, write = os.pipe()

    def pass_on() -> None:
        nonlocal kept
        while chunk := os.read(read, 65536):  # whatever has come, at once
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
            kept = (kept + chunk)[-TAIL_BYTES:]

    reader = threading.Thread(target=pass_on, name="dvc-output")
    reader.start()
    try:
        code = signals.run_group(cmd, STOP_SECONDS, cwd=cwd, env=env, stdout=write, stderr=subprocess.STDOUT)
    finally:
        os.close(write)  # the group's copies are closed with it: the reader sees the end
        reader.join()
        os.close(read)
    lines = [line.rsplit("\r", 1)[-1].rstrip() for line in kept.decode(errors="replace").split("\n")]
    return code, [line for line in lines if line][-TAIL_LINES:]


def quoted(lines: list[str]) -> str:
    """Lines as a Markdown code block (indented: mail and chat show it as it is)."""
    return "\n".join(f"    {line}" for line in lines)


def listed(changes: list[dict]) -> list[str]:
    """The first LISTED changes, one line each: what, where, before -> after."""
    lines = [
        notify.shorten(f"- {WHAT.get(c['what'], c['what'])}: {c['where']}: {c['before']} -> {c['after']}", 240)
        for c in changes[:LISTED]
    ]
    more = len(changes) - LISTED
    return lines + ([f"- and {more} more (in the report)"] if more > 0 else [])


def count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def summary(night: Night, result: dict, before: Path | None, changed: list[str], sweep: str) -> str:
    """A compared night in a few lines: its verdict, the regressions listed, the other changes counted, what
    changed since ``before`` (``changed``), what the sweep did, where the report is."""
    regressions = result["regressions"]
    if before is None:
        verdict = "first night"
    elif regressions:
        verdict = f"REGRESSION, {count(len(regressions), 'regression', 'regressions')}"
    else:
        verdict = "no regression"
    parts = [night.headline(verdict)]
    if before is None:
        parts.append("Nothing to compare with yet: the next night compares with this one.")
    else:
        since = "; ".join(changed) or "nothing (the same commit and training libraries)"
        parts.append(f"Against night {before.name}. Since then: {since}.")
    if regressions:
        parts.append("\n".join(["Regressions:", *listed(regressions)]))
    if result["improvements"] and not regressions:
        parts.append("\n".join(["Improvements:", *listed(result["improvements"])]))
    if before is not None:
        others = [
            count(len(result["improvements"]), "improvement", "improvements") if regressions else "",
            count(len(result["undecided"]), "change to or from undecided", "changes to or from undecided"),
            count(len(result["borderline"]), "borderline flip", "borderline flips"),
            count(len(result["new"]), "new cell", "new cells"),
            count(len(result["missing"]), "missing cell", "missing cells"),
        ]
        parts.append(f"Not regressions: {', '.join(filter(None, others))}.")
    parts.append(sweep)
    parts.append(f"{night.report()}. {night.took()}")
    return "\n\n".join(parts) + "\n"


def failure(night: Night, code: int, why: str, lines: list[str] | None = None) -> str:
    """A night that ended without a comparison: why, with the last ``lines`` of what failed."""
    verdict = "did not run" if code == 3 or not night.commit else "FAILED"
    parts = [night.headline(f"{verdict}, exit {code}"), why]
    if lines:
        parts.append(quoted(lines))
    parts.append(f"No comparison was made: report/ is an earlier night's, if any. {night.took()}")
    return "\n\n".join(parts) + "\n"


def sweep_line(night_dir: Path, earlier: str | None, forced: str) -> str:
    """What the night's sweep trained: from its sweep.json, or the earlier night whose results DVC kept."""
    if earlier is not None:
        return (
            "No trial ran: DVC did not rerun the sweep (nothing it depends on changed since a run it keeps), so the "
            f"results are those of the night of {history.when(earlier)}."
        )
    done = json.loads((night_dir / "sweep.json").read_text())
    return (
        f"The sweep trained {count(done.get('trained', 0), 'trial', 'trials')} and reused "
        f"{done.get('reused', 0)} (their data, settings, code and libraries unchanged){forced}."
    )


def nightly(
    repo: Path, profile: str | None, wait: bool, force: bool, push: str | None, night: Night
) -> tuple[int, str]:
    """Runs the night; returns its exit status and summary. With ``push`` (a git remote): both remotes checked
    first, the nights they hold pulled, and the night pushed (``experiments``)."""
    cfg = load_config(repo / "params.yaml", profile=profile)
    night.profile = cfg.profile
    remotes = experiments.check(repo, push) if push else ""
    nights_dir = repo / cfg.nightly.history
    with owned(nights_dir / NIGHTLY_LOCK, busy(nights_dir), wait):
        night.date, night.commit = time.strftime("%Y-%m-%dT%H%M%S"), str(git_commit(repo))
        if push:
            pulled = experiments.pull(repo, push, cfg.profile)
            print(f"nightly: pulled {count(len(pulled), 'night', 'nights')} of profile {cfg.profile} from {remotes}")
        record_experiments(repo, nights_dir, cfg.profile)
        before = latest_night(nights_dir, cfg.profile)
        prior = json.loads((before / "meta.json").read_text()) if before else {}
        libraries = library_versions()
        bumped = library_changes(prior.get("libraries"), libraries)
        meta = dict(date=night.date, commit=night.commit, profile=cfg.profile, libraries=libraries, forced=force)
        cmd = dvc_command(profile, force or bool(bumped), meta)
        print(f"nightly {night.date} commit {night.commit}: {shown(cmd)}", flush=True)
        if bumped and not force:
            since = f"since {before.name if before else ''}: {', '.join(bumps(bumped))}"
            print(f"nightly: training libraries changed {since}; DVC forced: the sweep retrains under the new run key")
        env = os.environ | ({RETRAIN_ENV: "1"} if force else {})
        code, tail = run_passing_on(cmd, repo, env)
        if code != 0:
            print(f"error: `{shown(cmd)}` failed (its output is above)", file=sys.stderr)
            return 2, failure(night, 2, f"`{shown(cmd)}` failed (exit {code}); its last lines:", tail)
        night_dir = nights_dir / f"{night.date}_{night.commit}"
        experiment = experiments.name(cfg.profile, night.date)
        earlier = keep_night(repo, night_dir, cfg, meta | {"experiment": experiment})
        title = f"Nightly {night.date}, commit {night.commit}, profile {cfg.profile}"
        result, text = against(before, night_dir, cfg, title)
        (night_dir / "comparison.json").write_text(json.dumps(result, indent=2) + "\n")
        heading = f"{title}, against {before.name if before else 'nothing (first night)'}"
        print(publish(repo, nights_dir, night_dir, cfg, result, text, heading))
        why = " (--force: nothing reused)" if force else (" (the training libraries changed)" if bumped else "")
        changed = changes_since(prior, night.commit, bumped)
        brief = summary(night, result, before, changed, sweep_line(night_dir, earlier, why))
        code = 1 if result["regressions"] else 0
        if push:
            pushed, ok = push_night(repo, push, cfg.profile, experiment, remotes)
            brief, code = brief + pushed, code if ok else 2
        (night_dir / "summary.md").write_text(brief)
        return code, brief


def bumps(bumped: dict[str, tuple]) -> list[str]:
    """Each library's change, as "name before -> after"."""
    return [f"{name} {a} -> {b}" for name, (a, b) in bumped.items()]


def changes_since(prior: dict, commit: str, bumped: dict[str, tuple]) -> list[str]:
    """What changed since the night ``prior`` recorded: the commit, and the training libraries ``bumped``."""
    changed = [f"commit {prior['commit']} -> {commit}"] if prior and prior["commit"] != commit else []
    changed += bumps(bumped)
    if prior and "libraries" not in prior:
        changed.append("the training libraries (that night did not record them)")
    return changed


def push_night(repo: Path, push: str, profile: str, experiment: str, remotes: str) -> tuple[str, bool]:
    """Pushes the night's experiment (and the earlier ones not pushed yet); returns the summary's line and whether
    it went."""
    try:
        pushed = experiments.push(repo, push, profile)
    except experiments.RemoteError as err:
        print(f"error: {err}", file=sys.stderr)
        return f"\nNOT PUSHED (exit 2): {err}\n", False
    also = f", with {count(len(pushed) - 1, 'earlier night', 'earlier nights')} not pushed before"
    return f"\nPushed as experiment {experiment}{also if len(pushed) > 1 else ''} to {remotes}.\n", True


def pull_history(repo: Path, profile: str | None, wait: bool, git_remote: str, night: Night) -> tuple[int, str]:
    """No night run: the nights of the profile that ``git_remote`` and the DVC remote hold, pulled and recorded,
    the last compared with the one before, the atlas over time drawn into report/ (``history.md`` and its
    figures); returns the exit status and a summary."""
    cfg = load_config(repo / "params.yaml", profile=profile)
    night.profile = cfg.profile
    remotes = experiments.check(repo, git_remote)
    nights_dir = repo / cfg.nightly.history
    with owned(nights_dir / NIGHTLY_LOCK, busy(nights_dir), wait):
        pulled = experiments.pull(repo, git_remote, cfg.profile)
        record_experiments(repo, nights_dir, cfg.profile)
        found = history.nights(nights_dir, cfg.profile)
        head = night.headline(f"pulled {count(len(pulled), 'night', 'nights')}").replace(f", night {night.date}", "")
        if not found:
            return 0, f"{head}\n\nNo night of profile {cfg.profile} in {remotes} nor here.\n"
        title = f"The nights of profile {cfg.profile}, the last {found[-1].name}"
        result, text = against(found[-2] if len(found) > 1 else None, found[-1], cfg, title)
        report_dir = repo / "report"
        report_dir.mkdir(exist_ok=True)
        for stale in report_dir.glob(f"{history.PREFIX}*.png"):
            stale.unlink()
        drawn = history.draw(history.load(nights_dir, cfg.profile), result, cfg.report.accuracy_threshold, report_dir)
        (report_dir / "history.md").write_text(text + "\n" + history.markdown(drawn))
        lines = [
            head,
            f"From {remotes}: {count(len(found), 'night', 'nights')} of profile {cfg.profile} in all, "
            f"{found[0].name} to {found[-1].name} (nightly/).",
            f"The last against the one before, and the atlas over time: {(report_dir / 'history.md').resolve()} "
            f"({count(len(drawn), 'figure', 'figures')}). dvc exp show -A: their metrics.",
        ]
        return 0, "\n\n".join(lines) + "\n"


def deliver(text: str, summary_files: list[Path], urls: list[str]) -> None:
    """The summary POSTed to each webhook, then printed and appended to each of ``summary_files``, with what failed
    to post (the exit status stays the night's)."""
    failed = [why for url in urls if (why := notify.post(url, text))]
    if failed:
        text += "\n" + "\n".join(f"Not notified: {why}." for why in failed) + "\n"
    elif urls:
        text += f"\nNotified: {', '.join(map(redact, urls))}.\n"
    print(f"\n== nightly summary\n{text}", end="", flush=True)
    for path in summary_files:
        with path.open("a") as f:
            f.write(text + "\n")


def checked_summary_file(path: str) -> Path:
    """``--summary FILE`` if it can be appended to (created if absent), else BadInput naming it."""
    try:
        with open(path, "a"):
            pass
    except OSError as err:
        raise BadInput(f"--summary {path!r} cannot be written: {err.strerror}") from None
    return Path(path)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m pipeline.nightly", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--profile", help="profile in conf/ to run (default: params.yaml's)")
    ap.add_argument("--repo", default=str(ROOT), help="the checkout to run in (default: %(default)s)")
    ap.add_argument("--wait", action="store_true", help="wait for a nightly run in progress instead of stopping")
    ap.add_argument(
        "--force",
        action="store_true",
        help="rerun from scratch: every DVC stage (dvc ... --force) and every trial (no run reused from MLflow)",
    )
    shared = ap.add_mutually_exclusive_group()
    shared.add_argument(
        "--push",
        metavar="GIT_REMOTE",
        nargs="?",
        const="origin",
        help="share the night: pull the nights GIT_REMOTE (default origin) and DVC's default remote hold first, then "
        "push this one (dvc exp push); a remote that cannot be reached stops the night before it runs",
    )
    shared.add_argument(
        "--pull",
        metavar="GIT_REMOTE",
        nargs="?",
        const="origin",
        help="run no night: pull the nights of the profile that GIT_REMOTE (default origin) and DVC's default remote "
        "hold, and draw the atlas over time into report/history.md",
    )
    ap.add_argument(
        "--notify",
        metavar="URL",
        action="append",
        default=[],
        help='POST the summary as JSON {"text": ...} to this http(s) webhook (Slack, Mattermost, Teams); repeatable',
    )
    ap.add_argument(
        "--summary",
        metavar="FILE",
        action="append",
        default=[],
        help="append the summary to FILE as well, e.g. $GITHUB_STEP_SUMMARY in CI; repeatable",
    )
    ap.add_argument(
        "--report-url",
        metavar="URL",
        help="the summary's link to the report, e.g. where report/ is served or the CI run that keeps it "
        "(default: the path of report/ in the checkout)",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    night = Night(Path(args.repo), args.profile, args.report_url)
    summary_files: list[Path] = []
    try:  # bad input is named before anything runs
        summary_files += [checked_summary_file(path) for path in args.summary]
        urls = [notify.check_url(url) for url in args.notify]
        if args.report_url is not None:
            notify.check_url(args.report_url, "--report-url")
    except (BadInput, notify.WebhookError) as err:
        print(f"error: {err}", file=sys.stderr)
        deliver(failure(night, 2, f"Bad input: {err}."), summary_files, [])
        return 2
    try:
        if args.pull:
            code, text = pull_history(Path(args.repo), args.profile, args.wait, args.pull, night)
        else:
            code, text = nightly(Path(args.repo), args.profile, args.wait, args.force, args.push, night)
    except experiments.RemoteError as err:
        print(f"error: {err}", file=sys.stderr)
        code, text = 2, failure(night, 2, f"A remote: {err}")
    except LockBusy as err:
        print(f"error: {err}", file=sys.stderr)
        code, text = 3, failure(night, 3, f"{err}.")
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        code, text = 2, failure(night, 2, f"The config: {err}.")
    except Exception as err:  # a failed night must still say why, and never exit 1 (a regression)
        traceback.print_exc()
        code, text = 2, failure(night, 2, f"pipeline.nightly stopped on {type(err).__name__}: {err}.")
    deliver(text, summary_files, urls)
    return code
