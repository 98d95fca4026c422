"""One night's sweep against the previous night's, cell by cell (``cell_id``: task, size, architecture, width,
depth, seed and data hash): test accuracy, verdict, minimum solved width and training throughput.

A change is a *regression* when
- the verdict falls (solved > undecided > unsolved > diverged > failed, ``Status``),
- test accuracy drops by more than ``nightly.accuracy_drop``,
- the minimum width every seed solves grows (or no width solves any more), per (task, size, arch, depth),
- training throughput (training PFLOPs per second of training) drops by more than ``nightly.throughput_drop``,
- a claim check of the papers (``pipeline.reporting.claims``) falls (holds > not tested > fails);
the same moves the other way are *improvements*. Two kinds of change are neither, each listed apart:
- *undecided*: a verdict that moves between undecided and solved or unsolved, or a minimum width that moves
  while either night's is undecided (an upper bound, or none solved yet). An undecided trial ran out of steps
  while still improving: no verdict of capacity, so its coming or going says nothing of the model's;
- *borderline*: a flip between solved and unsolved where either night's test accuracy is borderline (its 95%
  interval contains the threshold): within noise, another draw of the test set could flip it back; and so a
  minimum width that moves across a cell borderline on either night.
A flip to or from diverged or failed stays a regression or improvement. Cells only one night has are *new* or
*missing*. ``pipeline.nightly`` fails the night on regressions only.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from html import escape

import pandas as pd

from pipeline.common.config import NightlyConfig
from pipeline.common.status import Status
from pipeline.reporting.claims import ClaimStatus
from pipeline.reporting.tables import BOUND, borderline_cells, min_gflops

# the result's lists of changes, by the kind of change they hold, and their section titles
KINDS = {
    "regressions": "regression",
    "improvements": "improvement",
    "undecided": "undecided",
    "borderline": "borderline",
}
TITLES = {
    "regressions": "Regressions",
    "improvements": "Improvements",
    "undecided": "Undecided (not regressions: to or from a trial out of steps while still improving)",
    "borderline": "Borderline (not regressions: a test accuracy whose 95% interval contains the threshold)",
}
LISTS = (*KINDS, "new", "missing")  # the keys of every result (the first night's: all empty)
CAPACITY = (Status.SOLVED, Status.UNDECIDED, Status.UNSOLVED)  # verdicts of the model, not of a crash


@dataclass(frozen=True)
class Change:
    kind: str  # regression | improvement | undecided | borderline
    what: str  # verdict | accuracy | min_width | throughput | claim
    where: str  # the cell (or the row of the minimum-width table, or the claim's id)
    before: str
    after: str


def cell_name(r) -> str:
    """``r``: a row as a Series or a named tuple (a Series' ``.size`` is its length, hence the getattr)."""
    size = r["size"] if isinstance(r, pd.Series) else r.size
    return f"{r.task} {size} {r.arch} D={r.width} d{r.depth} seed {r.seed}"


def row_name(task: str, size, arch: str, depth) -> str:
    """A row of the minimum-width table, as a ``min_width`` change names it."""
    return f"{task} {size} {arch} d{depth}"


def throughput(r) -> float:
    """PFLOP/s of training; NaN for a cell that did not train (inferred)."""
    seconds = getattr(r, "train_seconds", math.nan)
    return r.train_pflops / seconds if r.measured and seconds and seconds > 0 else math.nan


def verdict_change(a, b) -> str:
    """The kind of a verdict flip from cell ``a`` to cell ``b`` (rows with ``status`` and ``borderline``)."""
    if a.status in CAPACITY and b.status in CAPACITY:
        if Status.UNDECIDED in (a.status, b.status):
            return "undecided"
        if a.borderline or b.borderline:
            return "borderline"
    return "regression" if Status(b.status).rank > Status(a.status).rank else "improvement"


def width_change(a: float, b: float, undecided: bool, crossed_borderline: bool) -> str:
    """The kind of a minimum width's move from ``a`` to ``b`` (inf: none solved): ``undecided`` on either night,
    across a cell borderline on either night, else by which is narrower."""
    if undecided:
        return "undecided"
    if crossed_borderline:
        return "borderline"
    return "regression" if b > a else "improvement"


def width_shown(width: float, undecided: str) -> str:
    if width == math.inf:
        return "undecided" if undecided else "none"
    return f"{BOUND} {width:.0f}" if undecided else f"{width:.0f}"


def cell_changes(old: pd.DataFrame, new: pd.DataFrame, tol: NightlyConfig) -> list[Change]:
    """Per cell in both nights (indexed by cell id): a changed verdict, an accuracy or a throughput moved past its
    tolerance."""
    changes: list[Change] = []
    for cell_id in old.index.intersection(new.index):
        a, b = old.loc[cell_id], new.loc[cell_id]
        where = cell_name(b)
        if a.status != b.status:
            changes.append(Change(verdict_change(a, b), "verdict", where, a.status, f"{b.status} ({b.reason})"))
        if a.measured and b.measured and pd.notna(a.final_accuracy) and pd.notna(b.final_accuracy):
            delta = b.final_accuracy - a.final_accuracy
            if abs(delta) > tol.accuracy_drop:
                kind = "regression" if delta < 0 else "improvement"
                changes.append(Change(kind, "accuracy", where, f"{a.final_accuracy:.3f}", f"{b.final_accuracy:.3f}"))
        speed_a, speed_b = throughput(a), throughput(b)
        if speed_a > 0 and speed_b > 0:
            ratio = speed_b / speed_a
            if abs(ratio - 1) > tol.throughput_drop:
                shown = f"{speed_a * 1e3:.3g} TFLOP/s", f"{speed_b * 1e3:.3g} TFLOP/s ({ratio:.2f}x)"
                changes.append(Change("regression" if ratio < 1 else "improvement", "throughput", where, *shown))
    return changes


def width_changes(before: pd.DataFrame, after: pd.DataFrame, old: pd.DataFrame, new: pd.DataFrame) -> list[Change]:
    """Per (task, size, arch, depth): a changed minimum width, told apart by whether undecided cells or borderline
    cells (``old``, ``new``: the nights with their ``borderline`` column) explain it."""
    keys = ["task", "size", "arch", "depth"]
    widths = (
        min_gflops(before)
        .set_index(keys)[["width", "undecided"]]
        .join(min_gflops(after).set_index(keys)[["width", "undecided"]], how="inner", lsuffix="_a", rsuffix="_b")
    )
    near = {(r.task, r.size, r.arch, r.depth, r.width) for t in (old, new) for r in t[t.borderline].itertuples()}
    changes = []
    for (task, size, arch, depth), w in widths.iterrows():
        a, b = (math.inf if pd.isna(v) else v for v in (w.width_a, w.width_b))
        if a != b:
            crossed = any(k[:4] == (task, size, arch, depth) and min(a, b) <= k[4] < max(a, b) for k in near)
            kind = width_change(a, b, bool(w.undecided_a or w.undecided_b), crossed)
            shown = width_shown(a, w.undecided_a), width_shown(b, w.undecided_b)
            changes.append(Change(kind, "min_width", row_name(task, size, arch, depth), *shown))
    return changes


def claim_changes(before: dict, after: dict) -> list[Change]:
    """Claims (id -> status) whose status moved: toward *fails* is a regression."""
    changes = []
    for claim in sorted(before.keys() & after.keys()):
        a, b = before[claim], after[claim]
        if a != b:
            worse = ClaimStatus(b).rank > ClaimStatus(a).rank
            changes.append(Change("regression" if worse else "improvement", "claim", claim, a, b))
    return changes


def compare(
    before: pd.DataFrame,
    after: pd.DataFrame,
    tol: NightlyConfig,
    claims_before: dict | None = None,
    claims_after: dict | None = None,
) -> dict:
    """{'regressions', 'improvements', 'undecided', 'borderline': [Change as dict], 'new', 'missing': [cell
    names]}; ``claims_*``: claim id -> status, as ``results/report.json`` holds them."""
    old, new = (t.assign(borderline=borderline_cells(t)).set_index("cell_id") for t in (before, after))
    changes = [
        *cell_changes(old, new, tol),
        *width_changes(before, after, old, new),
        *claim_changes(claims_before or {}, claims_after or {}),
    ]
    return {key: [asdict(c) for c in changes if c.kind == kind] for key, kind in KINDS.items()} | {
        "new": sorted(cell_name(r) for r in after[~after.cell_id.isin(before.cell_id)].itertuples()),
        "missing": sorted(cell_name(r) for r in before[~before.cell_id.isin(after.cell_id)].itertuples()),
    }


def headline(result: dict) -> str:
    return (
        f"{len(result['regressions'])} regressions, {len(result['improvements'])} improvements, "
        f"{len(result['undecided'])} changes to or from undecided and {len(result['borderline'])} borderline flips "
        f"(neither a regression), {len(result['new'])} new cells, {len(result['missing'])} missing cells."
    )


def markdown(result: dict, title: str) -> str:
    lines = [f"# {title}", "", headline(result), ""]
    for kind, heading in TITLES.items():
        if result[kind]:
            frame = pd.DataFrame(result[kind]).drop(columns="kind")
            lines += [f"## {heading}", "", frame.to_markdown(index=False), ""]
    for kind in ("new", "missing"):
        if result[kind]:
            lines += [f"## {kind.capitalize()} cells", ""] + [f"- {name}" for name in result[kind]] + [""]
    return "\n".join(lines)


def html(result: dict) -> str:
    parts = [f"<p>{headline(result)}</p>"]
    for kind, heading in TITLES.items():
        if result[kind]:
            parts += [
                f"<h3>{escape(heading)}</h3>",
                pd.DataFrame(result[kind]).drop(columns="kind").to_html(index=False),
            ]
    for kind in ("new", "missing"):
        if result[kind]:
            items = "".join(f"<li>{escape(name)}</li>" for name in result[kind])
            parts.append(f"<h3>{kind.capitalize()} cells</h3><ul>{items}</ul>")
    return "".join(parts)
