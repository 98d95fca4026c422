"""Nightly comparison: regressions, improvements, new and missing cells; the lock; two real nights with an
injected regression (slow, integration)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from pipeline.common.config import NightlyConfig
from pipeline.common.locks import LockBusy, owned
from pipeline.reporting.comparison import LISTS, compare, html, markdown
from tests.helpers import ROOT
from tests.helpers.browser import report_problems
from tests.helpers.tables import rows


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


@pytest.mark.slow
@pytest.mark.integration
def test_two_nights_with_an_injected_regression(tmp_path):
    """Night 1 on a narrowed tiny profile; night 2 after an LSTM that raises: its cells regress, exit 1. No retries:
    an LSTM that always raises would be retried twice per trial (sweep.max_failures), which tests/test_resume.py
    covers, for nothing here."""
    from tests.helpers.repo import copy_repo, run

    repo = copy_repo(tmp_path, "sweep: {architectures: [standard, lstm], widths: [8, 16], max_failures: 0}")
    first = run([sys.executable, "-m", "pipeline.nightly", "--profile", "tiny"], repo)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "First night of profile tiny" in (repo / "report" / "nightly.md").read_text()
    lstm = repo / "models" / "lstm.py"
    source = lstm.read_text()
    lstm.write_text(source.replace("    def forward(", "    def forward(*a, **k):\n        raise RuntimeError("
                                   "'injected regression')\n\n    def _forward(", 1))
    second = run([sys.executable, "-m", "pipeline.nightly", "--profile", "tiny"], repo)
    assert second.returncode == 1, second.stdout[-3000:] + second.stderr[-3000:]
    nights = sorted(p for p in (repo / "nightly").iterdir() if p.is_dir())
    assert len(nights) == 2
    result = json.loads((nights[1] / "comparison.json").read_text())
    verdicts = [c for c in result["regressions"] if c["what"] == "verdict"]
    assert len(verdicts) == 4 and all(" lstm " in c["where"] and c["after"].startswith("failed") for c in verdicts)
    assert not result["new"] and not result["missing"]
    page = (repo / "report" / "index.html").read_text()
    assert "Nightly comparison" in page and "injected regression" in page
    # the atlas over time: a figure per (task, size) over both nights, on the page, in nightly.md and the night's copy
    drawn = ["nightly_history_arithmetic_2.png", "nightly_history_lis_3.png"]
    assert sorted(p.name for p in (repo / "report").glob("nightly_history_*.png")) == drawn
    section = page.index("<h2>Nightly comparison</h2>")
    assert section < page.index("<h3>The atlas over time</h3>") < page.index("<h2>", section + 1)  # in the section
    assert all(f"<img src='{name}'" in page and (nights[1] / name).read_bytes().startswith(b"\x89PNG")
               for name in drawn)
    for task in ("arithmetic 2", "lis 3"):  # lstm's D=8 and D=16 ringed
        assert re.search(f"<figcaption>{task}: 2 nights, [^<]*, 2 of verdict or accuracy</figcaption>", page)
    assert "(nightly_history_lis_3.png)" in (repo / "report" / "nightly.md").read_text()
    assert report_problems(repo / "report") == []  # every figure shown and loaded in Chromium, the page not too wide
    meta = json.loads((nights[1] / "meta.json").read_text())
    assert meta["commit"].endswith("-dirty") and meta["profile"] == "tiny"
