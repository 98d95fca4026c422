"""The atlas over time (pipeline/nightly/history.py): three synthetic nights read back as the long tables, and
their figures, the last night's regressions ringed in red."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image
import numpy as np
import pandas as pd

from pipeline.common.config import NightlyConfig
from pipeline.nightly import history
from pipeline.nightly.comparison import compare
from pipeline.reporting.figures import save
from tests.helpers.tables import rows

PNG = b"\x89PNG\r\n\x1a\n"


def sweep(standard_from: int, lstm_from: int | None, undecided=(), failed=()) -> pd.DataFrame:
    """lis n=4 and n=6, standard and lstm at depth 2, widths 16-64, two seeds (seed 1's accuracy 0.02 below seed
    0's); n=6 the same every night. ``undecided`` and ``failed``: lstm's (size, width) cells that ended so."""
    table = pd.DataFrame(rows("lis", "standard", 2, {4: standard_from, 6: 32}, seeds=(0, 1))
                         + rows("lis", "lstm", 2, {4: lstm_from, 6: None}, seeds=(0, 1), undecided=undecided))
    table = table.assign(final_accuracy=table.final_accuracy - 0.02 * table.seed, train_pflops=1.0, train_seconds=1.0,
                         cell_id=[f"{r.arch}-{r.size}-{r.width}-{r.seed}" for r in table.itertuples()])
    crashed = (table.arch == "lstm") & pd.Series(list(zip(table["size"], table.width))).isin(failed)
    table.loc[crashed, ["status", "final_accuracy"]] = ["failed", np.nan]
    return table


def record(nightly: Path, date: str, commit: str, table: pd.DataFrame, profile: str = "laptop") -> Path:
    """A night as pipeline/nightly/rerun.py keeps it."""
    night = nightly / f"{date}_{commit}"
    night.mkdir(parents=True)
    table.to_csv(night / "sweep.csv", index=False)
    (night / "report.json").write_text(json.dumps({"claims": {}, "mlflow_parent_run": "p"}))
    meta = {"date": date, "commit": commit, "profile": profile, "mlflow_parent_run": "p"}
    (night / "meta.json").write_text(json.dumps(meta))
    return night


def red_pixels(path: Path, columns: slice = slice(None)) -> int:
    """Pixels of pure red, the rings' colour (no other line of the figure is: tab:red is (0.84, 0.15, 0.16))."""
    image = matplotlib.image.imread(path)[:, columns]
    return int(((image[..., 0] > 0.9) & (image[..., 1] < 0.1) & (image[..., 2] < 0.1)).sum())


def rings(ax) -> list[tuple[int, float]]:
    """Where a panel rings a point in red: (night, value)."""
    return sorted((round(float(line.get_xdata()[0])), round(float(line.get_ydata()[0]), 2)) for line in ax.lines
                  if line.get_markeredgecolor() == "red")


def test_three_nights_read_back_per_night_and_drawn_with_the_last_nights_regressions_in_red(tmp_path, monkeypatch):
    nightly, out = tmp_path / "nightly", tmp_path / "report"
    out.mkdir()
    # night 2: lstm's n=4 D=16 undecided (its width an upper bound); night 3: standard's n=4 D=16 stops solving,
    # lstm's n=4 solves nowhere (D=64 failed)
    tables = [sweep(16, 32), sweep(16, 32, undecided={(4, 16)}), sweep(32, None, failed={(4, 64)})]
    dates = ["2026-05-01T020000", "2026-05-02T020000", "2026-05-03T020000"]
    commits = ["0123456789ab", "0123456789ab-dirty", "fedcba987654"]
    for date, commit, table in zip(reversed(dates), reversed(commits), reversed(tables)):  # read in date order
        record(nightly, date, commit, table)
    record(nightly, "2026-05-02T030000", "0123456789ab", sweep(64, 64), profile="tiny")  # another profile's night
    (nightly / "2026-05-04T020000_0123456789ab").mkdir()  # a night that never finished recording: no meta.json
    past = history.load(nightly, "laptop")

    assert list(past.nights.night) == [f"{d}_{c}" for d, c in zip(dates, commits)]
    assert list(past.nights.label) == ["2026-05-01 02:00\n0123456", "2026-05-02 02:00\n0123456*",
                                       "2026-05-03 02:00\nfedcba9"]
    widths = past.widths.pivot_table(index=["arch", "size"], columns="night", values="min_width", dropna=False)
    assert widths.loc[("standard", 4)].tolist() == [16, 16, 32] and widths.loc[("standard", 6)].tolist() == [32] * 3
    assert widths.loc[("lstm", 4)].iloc[:2].tolist() == [32, 32] and np.isnan(widths.loc[("lstm", 4)].iloc[2])
    assert widths.loc[("lstm", 6)].isna().all()
    lstm4 = past.widths[(past.widths.arch == "lstm") & (past.widths["size"] == 4)]
    assert [u != "" for u in lstm4.undecided] == [False, True, False]  # night 2's is an upper bound
    cells = past.cells[past.cells["size"] == 4].groupby(["arch", "width", "night"]).final_accuracy.mean().round(4)
    assert cells.loc["standard", 16].tolist() == [0.94, 0.94, 0.29]
    assert cells.loc["lstm", 32].tolist() == [0.94, 0.94, 0.29] and cells.loc["lstm", 64].iloc[2:].isna().all()
    assert len(past.cells) == 3 * len(tables[0])

    result = compare(tables[1], tables[2], NightlyConfig())
    red_cells, red_rows = history.regressed(past, result)
    # lstm's n=4 width went from an upper bound to none: an undecided change, not a regression
    assert red_rows == {("lis", 4, "standard", 2)}
    assert red_cells == {("lis", 4, "standard", 16, 2), ("lis", 4, "lstm", 32, 2), ("lis", 4, "lstm", 64, 2)}

    drawn = {}  # the figures as drawn, by file name, to read their rings back

    def keep(fig, path: Path) -> None:
        drawn[path.name] = fig
        save(fig, path)

    monkeypatch.setattr(history, "save", keep)
    figures = history.draw(past, result, 0.9, out)
    assert [f.name for f in figures] == ["nightly_history_lis_4.png", "nightly_history_lis_6.png"]
    for f in figures:
        assert f.section == history.SECTION and (out / str(f.name)).read_bytes().startswith(PNG)
        assert matplotlib.image.imread(out / str(f.name)).shape[:2] == (418, 1100)  # decodes: 10 x 3.8 in at 110 dpi
    assert figures[0].caption == ("lis 4: 3 nights, 2026-05-01 02:00 to 2026-05-03 02:00; ringed in red, the last "
                                  "night's regressions: 1 of minimum width, 3 of verdict or accuracy")
    assert "ringed" not in figures[1].caption
    left, right = drawn["nightly_history_lis_4.png"].axes
    assert rings(left) == [(2, 32)]  # standard's width 16 -> 32
    assert rings(right) == [(2, history.FAILED_Y), (2, 0.29), (2, 0.29)]  # lstm D=64 failed; D=16 and D=32 fell
    assert red_pixels(out / "nightly_history_lis_4.png", slice(0, 550)) > 100  # the left panel's ring, drawn
    assert not any(map(rings, drawn["nightly_history_lis_6.png"].axes))
    assert red_pixels(out / "nightly_history_lis_6.png") == 0  # nor a legend entry for one
    text = history.markdown(figures)
    assert text.startswith(f"## {history.SECTION}") and "![lis 4: 3 nights" in text
    assert "(nightly_history_lis_6.png)" in text


def test_one_night_is_drawn_as_one_point_per_line_and_no_night_as_nothing(tmp_path):
    nightly, out = tmp_path / "nightly", tmp_path / "report"
    out.mkdir()
    record(nightly, "2026-05-01T020000", "0123456789ab", sweep(16, 32))
    first = history.load(nightly, "laptop")
    nothing = {key: [] for key in ("regressions", "improvements", "undecided", "borderline", "new", "missing")}
    figures = history.draw(first, nothing, 0.9, out)
    assert [f.caption for f in figures] == ["lis 4: 1 night, 2026-05-01 02:00 to 2026-05-01 02:00",
                                            "lis 6: 1 night, 2026-05-01 02:00 to 2026-05-01 02:00"]
    assert all((out / str(f.name)).read_bytes().startswith(PNG) for f in figures)
    assert red_pixels(out / "nightly_history_lis_4.png") == 0
    assert history.draw(history.load(tmp_path / "none", "laptop"), nothing, 0.9, out) == []
