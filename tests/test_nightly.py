"""Nightly comparison: regressions, improvements, new and missing cells; the lock; the night's summary, and the
webhook it goes to (a real HTTP server on loopback); bad input named before anything runs; a failed night's summary
saying why. Slow (integration): real nights on the tiny profile: an injected regression, a night with nothing
changed (DVC skips), one with --force (everything retrains) and one with another version of a training library
installed (it retrains under the new run key)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from pipeline.common.config import NightlyConfig
from pipeline.common.locks import LockBusy, owned
from pipeline.common.urls import redact
from pipeline.nightly import notify, rerun
from pipeline.nightly.comparison import LISTS, compare, html, markdown
from tests.helpers import ROOT
from tests.helpers.browser import report_problems
from tests.helpers.tables import rows
from tests.helpers.webhook import webhook

SECRET = "s3cr3t"  # in the test webhook's path, as a Slack webhook's token is: never printed


def run_nightly(repo: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """``python -m pipeline.nightly --repo repo args...`` with this checkout's code and nothing else in its
    environment but PATH."""
    return subprocess.run([sys.executable, "-m", "pipeline.nightly", "--repo", str(repo), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), **env})


def night(solved_from: dict, accuracy: float = 0.3, seconds: float = 1.0) -> pd.DataFrame:
    table = pd.DataFrame(rows("lis", "standard", 2, solved_from, accuracy=accuracy))
    return table.assign(cell_id=[f"{r.size}-{r.width}" for r in table.itertuples()], train_pflops=1.0,
                        train_seconds=seconds)


def test_compare_finds_verdict_accuracy_width_and_throughput_changes():
    before = night({4: 16, 6: 32})
    after = night({4: 32, 6: 32}, accuracy=0.2, seconds=2.0)  # n=4 D=16 no longer solves; everything slower
    result = compare(before, after, NightlyConfig())
    kinds = {(c["what"], c["where"]) for c in result["regressions"]}
    assert ("verdict", "lis 4 standard D=16 d2 seed 0") in kinds
    assert ("accuracy", "lis 4 standard D=16 d2 seed 0") in kinds
    assert ("min_width", "lis 4 standard d2") in kinds
    assert sum(c["what"] == "throughput" for c in result["regressions"]) == len(after)  # 2x slower > 30%
    assert not result["improvements"] and not result["new"] and not result["missing"]
    back = compare(after, before, NightlyConfig(throughput_drop=0.6))
    assert {c["what"] for c in back["improvements"]} == {"verdict", "accuracy", "min_width", "throughput"}
    assert not back["regressions"]
    same = compare(before, before.assign(train_seconds=1.2), NightlyConfig())
    assert same == {key: [] for key in LISTS}  # within the tolerances
    grown = compare(before, pd.concat([before.iloc[1:], night({8: 64}).iloc[:1].assign(cell_id="x")]), NightlyConfig())
    assert grown["new"] == ["lis 8 standard D=16 d2 seed 0"] and grown["missing"] == ["lis 4 standard D=16 d2 seed 0"]


def test_a_borderline_flip_or_one_to_or_from_undecided_is_no_regression():
    """Neither night fails on noise or on a trial out of steps: such changes are listed apart, not as regressions;
    a flip to a crash still is one."""
    tol = NightlyConfig(accuracy_drop=1.0)  # the verdicts and widths alone
    before = night({4: 16})
    flipped = night({4: 32}).assign(borderline=lambda t: t.width == 16)  # D=16 unsolved, within noise of 0.9
    for result in (compare(before, flipped, tol), compare(flipped, before, tol)):
        assert not result["regressions"] and not result["improvements"] and not result["undecided"]
        assert [(c["what"], c["where"]) for c in result["borderline"]] == [
            ("verdict", "lis 4 standard D=16 d2 seed 0"), ("min_width", "lis 4 standard d2")]
    undecided = night({4: 32}).assign(status=lambda t: t.status.where(t.width != 16, "undecided"))
    result = compare(before, undecided, tol)
    assert not result["regressions"] and not result["borderline"]
    assert [(c["what"], c["before"], c["after"].split(" (")[0]) for c in result["undecided"]] == [
        ("verdict", "solved", "undecided"), ("min_width", "16", "\u2264 32")]
    back = compare(undecided, before, tol)
    assert not back["improvements"] and [c["what"] for c in back["undecided"]] == ["verdict", "min_width"]
    crashed = compare(undecided, undecided.assign(status="failed"), tol)
    assert [c["what"] for c in crashed["regressions"]] == ["verdict"] * 3
    assert [c["what"] for c in crashed["undecided"]] == ["min_width"]  # was an upper bound: no width to lose
    assert "2 changes to or from undecided and 0 borderline flips" in markdown(result, "night")
    assert "<h3>Undecided (not regressions" in html(result) and "<h3>Borderline" not in html(result)


def test_compare_finds_claims_that_stopped_or_started_holding():
    table = night({4: 16})
    before = {"dp_locality": "holds", "dp_width_grows": "fails", "sep_dyck_lstm": "not tested", "gone": "holds"}
    after = {"dp_locality": "fails", "dp_width_grows": "holds", "sep_dyck_lstm": "not tested", "added": "fails"}
    result = compare(table, table, NightlyConfig(), before, after)
    assert [(c["where"], c["before"], c["after"]) for c in result["regressions"]] == [("dp_locality", "holds", "fails")]
    assert [(c["where"], c["what"]) for c in result["improvements"]] == [("dp_width_grows", "claim")]
    assert compare(table, table, NightlyConfig(), before, {**before, "dp_locality": "not tested"})["regressions"]


def test_a_second_nightly_run_stops_with_a_clear_message_while_the_first_holds_the_lock(tmp_path):
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    lock = tmp_path / "nightly" / ".lock"
    busy = f"another nightly run holds {lock} ({{holder}}); this one stops. Rerun with --wait"
    with owned(lock, busy):
        with pytest.raises(LockBusy, match="another nightly run holds .* this one stops. Rerun with --wait"):
            with owned(lock, busy):
                pass
        done = subprocess.run([sys.executable, "-m", "pipeline.nightly", "--repo", str(tmp_path), "--profile", "tiny"],
                              cwd=ROOT, capture_output=True, text=True, timeout=120,
                              env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert done.returncode == 3 and "another nightly run holds" in done.stderr
    summary = done.stdout.split("== nightly summary\n")[1]  # the last thing printed
    assert summary.startswith("Capacity Atlas nightly: did not run, exit 3 (profile tiny, ")
    assert "another nightly run holds" in summary


def test_a_webhook_gets_the_text_as_json_over_real_http():
    """The body chat tools accept, on a real HTTP server: a 5xx is tried again, a 4xx is not; a failure is one line
    naming the webhook by its host only, and raises nothing."""
    with webhook() as hook:
        assert notify.post(hook.url, "Capacity Atlas nightly: no regression\n\n- a -> b") is None
        [post] = hook.posts
        assert SECRET in post.path and post.content_type == "application/json"
        assert post.body == {"text": "Capacity Atlas nightly: no regression\n\n- a -> b"}
        hook.answers = [503, 200]
        assert notify.post(hook.url, "again", backoff_s=0) is None and len(hook.posts) == 3
        hook.answers = [404]
        host = hook.url.split("/hooks")[0]
        refused = notify.post(hook.url, "refused", backoff_s=0)
        assert refused == f"POST to {host}/… failed: HTTP 404 Not Found: no_such_hook"
        assert len(hook.posts) == 4  # a 4xx is the webhook's answer to this message: not tried again
        notify.post(hook.url, "line\n" * 2000)
        assert len(hook.posts[-1].body["text"]) <= notify.MAX_CHARS and "(cut at" in hook.posts[-1].body["text"]
        gone = hook.url
    failed = notify.post(gone, "nobody listens", backoff_s=0)
    assert failed is not None and failed.startswith(f"POST to {host}/… failed after 3 attempts: ")
    assert SECRET not in failed


@pytest.mark.parametrize("url, says", [
    ("ftp://hooks.example.org/x", "is not an http(s) URL (scheme 'ftp')"),
    ("file:///etc/passwd", "is not an http(s) URL (scheme 'file')"),
    ("hooks.example.org/services/T0/B0/x", "is not an http(s) URL (no scheme)"),
    ("https://", "names no host"),
    ("https://hooks.example.org:99999/x", "is not a URL: Port out of range"),
    ("https://hooks.example.org/a b", "holds white space"),
])
def test_a_webhook_url_that_cannot_be_posted_to_is_named(url, says):
    with pytest.raises(notify.WebhookError, match=re.escape(says)) as err:
        notify.check_url(url)
    assert str(err.value).startswith("--notify ") and "/x" not in str(err.value) and "T0" not in str(err.value)
    assert notify.check_url("https://hooks.example.org/services/T0/B0/x") == "https://hooks.example.org/services/T0/B0/x"
    assert redact("https://user:pw@hooks.example.org:8443/services/T0?k=v") == "https://hooks.example.org:8443/…"


def test_bad_input_is_named_before_anything_runs(tmp_path):
    """A --notify URL that is not http(s), a --report-url likewise, a --summary file that cannot be written: exit 2
    with the error named, before the lock, the config's night or DVC; the summary says why."""
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    summary = tmp_path / "summary.md"
    for args, says in (
        (["--notify", f"ftp://hooks.example.org/{SECRET}"], "--notify 'ftp://hooks.example.org/…' is not an http"),
        (["--report-url", "report/index.html"], "--report-url 'report/index…' is not an http(s) URL (no scheme)"),
    ):
        done = run_nightly(tmp_path, "--profile", "tiny", "--summary", str(summary), *args)
        assert done.returncode == 2 and f"error: {says}" in done.stderr, done.stderr
        assert SECRET not in done.stdout + done.stderr + summary.read_text()
        assert not (tmp_path / "nightly").exists()  # not even the lock
        text = summary.read_text().split("Capacity Atlas nightly: ")[-1]
        assert text.startswith("did not run, exit 2 (profile tiny, night ") and f"Bad input: {says}" in text
        assert done.stdout.rstrip().endswith(text.rstrip())
    done = run_nightly(tmp_path, "--profile", "tiny", "--summary", str(tmp_path / "no" / "such" / "dir.md"))
    assert done.returncode == 2 and "error: --summary " in done.stderr and "cannot be written" in done.stderr
    assert not (tmp_path / "nightly").exists()


def test_a_failed_night_says_why_in_its_summary_and_to_the_webhook(tmp_path):
    """DVC fails (here: no DVC repository): the summary quotes its last lines, goes to the webhook and the summary
    file, and the night exits 2. A webhook that refuses the POST is said in the printed summary, not in the exit
    status."""
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    summary = tmp_path / "summary.md"
    with webhook() as hook, webhook("/refused/" + SECRET) as refusing:
        refusing.answers = [404]
        done = run_nightly(tmp_path, "--profile", "tiny", "--summary", str(summary), "--notify", hook.url,
                           "--notify", refusing.url)
    assert done.returncode == 2, done.stdout + done.stderr
    [post] = hook.posts
    text = post.body["text"]
    assert text.startswith("Capacity Atlas nightly: FAILED, exit 2 (profile tiny, commit unknown, night ")
    assert re.search(r"`dvc exp run -S profile=tiny -n nightly-tiny-[0-9T-]+` failed \(exit ", text)  # named
    assert "ERROR" in text  # DVC's own last lines
    assert "No comparison was made" in text
    refused = refusing.url.split("/refused")[0] + "/…"
    not_notified = f"Not notified: POST to {refused} failed: HTTP 404 Not Found: no_such_hook."
    assert summary.read_text() == f"{text}\n{not_notified}\n\n"
    assert done.stdout.endswith(summary.read_text()[:-1]) and SECRET not in done.stdout + done.stderr


def test_the_summary_lists_each_regression_before_and_after_and_links_the_report(tmp_path):
    changes = [{"kind": "regression", "what": "verdict", "where": f"lis 4 lstm D={w} d1 seed 0", "before": "solved",
                "after": "failed (RuntimeError: boom)"} for w in range(17)]
    changes.append({"kind": "regression", "what": "min_width", "where": "lis 4 lstm d1", "before": "16", "after": "32"})
    result = {key: [] for key in LISTS} | {"regressions": changes[::-1], "undecided": changes[:2]}
    night = rerun.Night(tmp_path, "laptop", "https://ci.example.org/runs/7", date="2026-01-02T023000",
                        commit="0123456789ab")
    before = tmp_path / "nightly" / "2026-01-01T023000_fedcba987654"
    text = rerun.summary(night, result, before, ["commit fedcba987654 -> 0123456789ab", "torch 2.13.0 -> 2.14.0"],
                         "The sweep trained 3 trials and reused 5.")
    lines = text.splitlines()
    assert lines[0] == ("Capacity Atlas nightly: REGRESSION, 18 regressions (profile laptop, commit 0123456789ab, "
                        "night 2026-01-02T023000)")
    assert ("Against night 2026-01-01T023000_fedcba987654. Since then: commit fedcba987654 -> 0123456789ab; torch "
            "2.13.0 -> 2.14.0.") in lines
    assert lines[lines.index("Regressions:") + 1] == "- minimum width: lis 4 lstm d1: 16 -> 32"
    assert "- verdict: lis 4 lstm D=16 d1 seed 0: solved -> failed (RuntimeError: boom)" in lines
    assert "- and 3 more (in the report)" in lines and sum(line.startswith("- ") for line in lines) == 16
    assert ("Not regressions: 0 improvements, 2 changes to or from undecided, 0 borderline flips, 0 new cells, 0 "
            "missing cells.") in lines
    assert "The sweep trained 3 trials and reused 5." in lines
    assert lines[-1].startswith("Report: https://ci.example.org/runs/7. Took ")
    first = rerun.summary(rerun.Night(tmp_path, "laptop"), {key: [] for key in LISTS}, None, [], "The sweep ...")
    assert first.startswith("Capacity Atlas nightly: first night (profile laptop, night ")
    assert f"Report: {tmp_path.resolve()}/report/nightly.md and {tmp_path.resolve()}/report/index.html." in first


@pytest.mark.slow
@pytest.mark.integration
def test_nights_with_an_injected_regression_no_change_force_and_a_library_bump(tmp_path):
    """Night 1 on a narrowed tiny profile (one task, two architectures at two widths: four trials a night); night 2
    after an LSTM that raises: its cells regress, exit 1, and the summary names each (before -> after) on stdout, in
    the --summary file and at the webhook. Night 3, nothing changed: DVC skips, no trial runs. Night 4, the LSTM
    mended, --force: everything reruns, nothing reused; a webhook that refuses is said in the summary, the exit
    status stays the night's. Night 5, another numba installed: DVC forced, every trial retrains under its new run
    key. No retries: an LSTM that always raises would be retried twice per trial (sweep.runs.max_failures), which
    tests/test_resume.py covers, for nothing here."""
    from tests.helpers.repo import copy_repo, run

    repo = copy_repo(tmp_path,
                     "sweep: {grid: {architectures: [standard, lstm], widths: [8, 16]}, runs: {max_failures: 0}}",
                     tasks=["lis"])
    first = run([sys.executable, "-m", "pipeline.nightly", "--profile", "tiny"], repo)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "First night of profile tiny" in (repo / "report" / "nightly.md").read_text()
    assert "== nightly summary\nCapacity Atlas nightly: first night (profile tiny, commit " in first.stdout
    lstm = repo / "models" / "lstm.py"
    source = lstm.read_text()
    lstm.write_text(source.replace("    def forward(", "    def forward(*a, **k):\n        raise RuntimeError("
                                   "'injected regression')\n\n    def _forward(", 1))
    summary = tmp_path / "summary.md"
    with webhook() as hook:
        second = run([sys.executable, "-m", "pipeline.nightly", "--profile", "tiny", "--notify", hook.url,
                      "--summary", str(summary), "--report-url", "https://ci.example.org/runs/7"], repo)
    assert second.returncode == 1, second.stdout[-3000:] + second.stderr[-3000:]
    nights = sorted(p for p in (repo / "nightly").iterdir() if p.is_dir())
    assert len(nights) == 2
    result = json.loads((nights[1] / "comparison.json").read_text())
    verdicts = [c for c in result["regressions"] if c["what"] == "verdict"]
    assert len(verdicts) == 2 and all(" lstm " in c["where"] and c["after"].startswith("failed") for c in verdicts)
    assert not result["new"] and not result["missing"]
    # the summary: at the webhook, in the file (with the webhook named by its host), last on stdout, in the night
    [post] = hook.posts
    text = post.body["text"]
    assert text.startswith(f"Capacity Atlas nightly: REGRESSION, {len(result['regressions'])} regression")
    assert f"Against night {nights[0].name}. Since then: commit " in text  # the copy's commit -> its -dirty tree
    for c in verdicts:  # each cell, before -> after
        assert f"- verdict: {c['where']}: {c['before']} -> failed (" in text
    done = json.loads((nights[1] / "sweep.json").read_text())
    assert done["reused"] == 0  # the LSTM's code is training code: every trial's run key changed
    assert f"The sweep trained {done['trained']} trials and reused 0 (their data, " in text
    assert "Report: https://ci.example.org/runs/7. Took " in text
    assert summary.read_text() == f"{text}\nNotified: {hook.url.split('/hooks')[0]}/….\n\n"
    assert second.stdout.endswith(summary.read_text()[:-1]) and (nights[1] / "summary.md").read_text() == text
    assert SECRET not in second.stdout + second.stderr + summary.read_text()

    page = (repo / "report" / "index.html").read_text()
    assert "Nightly comparison" in page and "injected regression" in page
    # the atlas over time: a figure per (task, size) over both nights, on the page, in nightly.md and the night's copy
    drawn = ["nightly_history_lis_3.png"]
    assert sorted(p.name for p in (repo / "report").glob("nightly_history_*.png")) == drawn
    section = page.index("<h2>Nightly comparison</h2>")
    assert section < page.index("<h3>The atlas over time</h3>") < page.index("<h2>", section + 1)  # in the section
    assert all(f"<img src='{name}'" in page and (nights[1] / name).read_bytes().startswith(b"\x89PNG")
               for name in drawn)
    # lstm's D=8 and D=16 ringed
    assert re.search("<figcaption>lis 3: 2 nights, [^<]*, 2 of verdict or accuracy</figcaption>", page)
    assert "(nightly_history_lis_3.png)" in (repo / "report" / "nightly.md").read_text()
    assert report_problems(repo / "report") == []  # every figure shown and loaded in Chromium, the page not too wide
    meta = json.loads((nights[1] / "meta.json").read_text())
    assert meta["commit"].endswith("-dirty") and meta["profile"] == "tiny"

    # night 3, nothing changed: DVC skips every stage, no trial runs; the same results, no regression
    third = run([sys.executable, "-m", "pipeline.nightly", "--profile", "tiny"], repo)
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    assert "Running stage 'sweep'" not in third.stdout
    brief = third.stdout.split("== nightly summary\n")[1]
    assert brief.startswith("Capacity Atlas nightly: no regression (profile tiny, ")
    assert "Since then: nothing (the same commit and training libraries)." in brief
    assert "No trial ran: DVC did not rerun the sweep" in brief

    # night 4, the LSTM mended, --force: every stage, every trial anew (without --force its trials would be night
    # 1's, reused); a webhook that refuses does not change the exit status. Mended, no trial fails: a failed trial's
    # Ray worker dies and a new one starts, importing torch again (about 10 s a night on 2 cores)
    lstm.write_text(source)
    with webhook() as refusing:
        refusing.answers = [404]
        fourth = run([sys.executable, "-m", "pipeline.nightly", "--profile", "tiny", "--force", "--notify",
                      refusing.url], repo)
    night4 = sorted(p for p in (repo / "nightly").iterdir() if p.is_dir())[-1]
    regressed = json.loads((night4 / "comparison.json").read_text())["regressions"]  # throughput: a busy machine's
    assert fourth.returncode == (1 if regressed else 0), fourth.stdout[-3000:] + fourth.stderr[-3000:]
    assert "Running stage 'generate@lis'" in fourth.stdout and "CAPACITY_ATLAS_RETRAIN=1" in fourth.stdout
    done = json.loads((night4 / "sweep.json").read_text())
    assert done["reused"] == 0 and done["trained"] == done["trials"] > 0
    assert f"The sweep trained {done['trained']} trials and reused 0 (their data, settings, code and libraries " \
        "unchanged) (--force: nothing reused)." in fourth.stdout
    assert f"Not notified: POST to {refusing.url.split('/hooks')[0]}/… failed: HTTP 404" in fourth.stdout
    assert json.loads((night4 / "meta.json").read_text())["forced"] is True

    # night 5, another numba installed (a distribution ahead of the venv's on the path): DVC forced, all retrain
    bumped = tmp_path / "bumped"
    installed = json.loads((night4 / "meta.json").read_text())["libraries"]["numba"]
    (bumped / "numba-0.0.1.dist-info").mkdir(parents=True)
    (bumped / "numba-0.0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: numba\nVersion: 0.0.1\n")
    fifth = run([sys.executable, "-m", "pipeline.nightly", "--profile", "tiny"], repo, PYTHONPATH=str(bumped))
    night5 = sorted(p for p in (repo / "nightly").iterdir() if p.is_dir())[-1]
    regressed = json.loads((night5 / "comparison.json").read_text())["regressions"]
    assert fifth.returncode == (1 if regressed else 0), fifth.stdout[-3000:] + fifth.stderr[-3000:]
    assert f"training libraries changed since {night4.name}: numba {installed} -> 0.0.1" in fifth.stdout
    assert f"Since then: numba {installed} -> 0.0.1." in fifth.stdout
    done = json.loads((night5 / "sweep.json").read_text())
    assert done["reused"] == 0 and done["trained"] == done["trials"] > 0
    assert json.loads((night5 / "meta.json").read_text())["libraries"]["numba"] == "0.0.1"
