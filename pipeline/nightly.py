"""Nightly rerun: the pipeline on a named profile, compared cell by cell with the previous night's run.

    python -m pipeline.nightly --profile laptop        # dvc exp run -S profile=laptop, then the comparison
    python -m pipeline.nightly                         # dvc repro on params.yaml's profile

Each night is kept in ``nightly/<date>_<commit>/`` (``nightly.history``): the sweep and report tables, the
metrics and claim checks, and ``meta.json`` (date, commit, profile, MLflow parent run, which is tagged
``nightly.date`` / ``nightly.commit``). The comparison with the latest earlier night of the same profile
(``pipeline.reporting.comparison``: accuracy, verdict, minimum width, training throughput, the papers' claim checks)
goes to ``report/nightly.md``, into the night's directory and into a section of ``report/index.html``. Changes to
or from undecided and borderline verdict flips are listed apart, and are not regressions. With it, the atlas over
time (``pipeline.reporting.history``): per (task, size), every recorded night's minimum width and test accuracy,
the last night's regressions ringed in red.

Exit status: 0 no regression (or the first night), 1 a regression beyond the ``nightly`` tolerances in params
(a scheduler alerts on it; the undecided and borderline lists never fail a night), 2 the pipeline or the config
failed, 3 another nightly run holds the lock (``--wait`` waits for it instead).
"""

from __future__ import annotations

import argparse
import html
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
from mlflow.tracking import MlflowClient

from pipeline.common.config import ROOT, Config, ConfigError, load_config
from pipeline.common.locks import LockBusy, owned
from pipeline.common.provenance import git_commit
from pipeline.report import NIGHTLY_MARKER, figures_html
from pipeline.reporting import comparison, history

SNAPSHOT = ("results/sweep.csv", "results/trials.csv", "results/sweep.json", "results/report.json")


def previous_night(nights_dir: Path, profile: str, current: Path) -> Path | None:
    nights = [d for d in history.nights(nights_dir, profile) if d.name < current.name]
    return nights[-1] if nights else None


def tag_runs(uri: str, parent: str, tags: dict) -> None:
    """The night's date and commit on the sweep's parent run and its children; a run an earlier night already
    tagged (DVC restored the results unchanged) keeps its own night."""
    client = MlflowClient(uri)
    run = client.get_run(parent)
    if "nightly.date" in run.data.tags:
        return
    children = client.search_runs(
        [run.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent}'", max_results=50_000
    )
    for run_id in [parent] + [c.info.run_id for c in children]:
        for key, value in tags.items():
            client.set_tag(run_id, key, value)


def keep_night(repo: Path, night: Path, cfg: Config, date: str, commit: str) -> None:
    """The night's tables and report into ``night``, with where it came from; its MLflow runs tagged with it."""
    night.mkdir(parents=True)
    for name in SNAPSHOT:
        shutil.copy2(repo / name, night / Path(name).name)
    parent = json.loads((repo / "results" / "report.json").read_text())["mlflow_parent_run"]
    meta = {"date": date, "commit": commit, "profile": cfg.profile, "mlflow_parent_run": parent}
    (night / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    tag_runs(cfg.cluster.mlflow(), parent, {"nightly.date": date, "nightly.commit": commit})


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


def nightly(repo: Path, profile: str | None, wait: bool) -> int:
    cfg = load_config(repo / "params.yaml", profile=profile)
    nights_dir = repo / cfg.nightly.history
    lock = nights_dir / ".lock"
    busy = f"another nightly run holds {lock} ({{holder}}); this one stops. Rerun with --wait to queue behind it"
    with owned(lock, busy, wait):
        date, commit = time.strftime("%Y-%m-%dT%H%M%S"), str(git_commit(repo))
        cmd = [sys.executable, "-m", "dvc"] + (["exp", "run", "-S", f"profile={profile}"] if profile else ["repro"])
        print(f"nightly {date} commit {commit}: {' '.join(cmd[2:])}", flush=True)
        if subprocess.run(cmd, cwd=repo).returncode != 0:
            print(f"error: `{' '.join(cmd[2:])}` failed (its output is above)", file=sys.stderr)
            return 2
        night = nights_dir / f"{date}_{commit}"
        keep_night(repo, night, cfg, date, commit)
        before = previous_night(nights_dir, cfg.profile, night)
        title = f"Nightly {date}, commit {commit}, profile {cfg.profile}"
        result, text = against(before, night, cfg, title)
        (night / "comparison.json").write_text(json.dumps(result, indent=2) + "\n")
        heading = f"{title}, against {before.name if before else 'nothing (first night)'}"
        print(publish(repo, nights_dir, night, cfg, result, text, heading))
        return 1 if result["regressions"] else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m pipeline.nightly", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--profile", help="profile in conf/ to run (default: params.yaml's)")
    ap.add_argument("--repo", default=str(ROOT), help="the checkout to run in (default: %(default)s)")
    ap.add_argument("--wait", action="store_true", help="wait for a nightly run in progress instead of stopping")
    args = ap.parse_args(argv)
    try:
        return nightly(Path(args.repo), args.profile, args.wait)
    except LockBusy as err:
        print(f"error: {err}", file=sys.stderr)
        return 3
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
