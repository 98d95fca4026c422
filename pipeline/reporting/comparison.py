"""One night's sweep against the previous night's, cell by cell (``cell_id``: task, size, architecture, width,
depth, seed and data hash): test accuracy, verdict, minimum solved width and training throughput.

A change is a *regression* when
- the verdict falls (solved > unsolved > diverged > failed),
- test accuracy drops by more than ``nightly.accuracy_drop``,
- the minimum width every seed solves grows (or no width solves any more), per (task, size, arch, depth),
- training throughput (training PFLOPs per second of training) drops by more than ``nightly.throughput_drop``,
- a claim check of the papers (``pipeline/reporting/claims.py``) falls (holds > not tested > fails);
the same moves the other way are *improvements*. Cells only one night has are *new* or *missing*.
"""

from __future__ import annotations

import html as html_mod
import math
from dataclasses import asdict, dataclass

import pandas as pd

from pipeline.common.config import NightlyConfig
from pipeline.reporting.claims import ClaimStatus
from pipeline.reporting.tables import min_gflops
from pipeline.training.verdict import Status


@dataclass(frozen=True)
class Change:
    kind: str  # regression | improvement
    what: str  # verdict | accuracy | min_width | throughput | claim
    where: str  # the cell (or the row of the minimum-width table, or the claim's id)
    before: str
    after: str


def cell_name(r) -> str:
    """``r``: a row as a Series or a named tuple (a Series' ``.size`` is its length, hence the getattr)."""
    size = r["size"] if isinstance(r, pd.Series) else r.size
    return f"{r.task} {size} {r.arch} D={r.width} d{r.depth} seed {r.seed}"


def throughput(r) -> float:
    """PFLOP/s of training; NaN for a cell that did not train (inferred)."""
    seconds = getattr(r, "train_seconds", math.nan)
    return r.train_pflops / seconds if r.measured and seconds and seconds > 0 else math.nan


def compare(
    before: pd.DataFrame,
    after: pd.DataFrame,
    tol: NightlyConfig,
    claims_before: dict | None = None,
    claims_after: dict | None = None,
) -> dict:
    """{'regressions', 'improvements': [Change as dict], 'new', 'missing': [cell names]}; ``claims_*``: claim id ->
    status, as ``results/report.json`` holds them."""
    old, new = before.set_index("cell_id"), after.set_index("cell_id")
    changes: list[Change] = []
    for cell_id in old.index.intersection(new.index):
        a, b = old.loc[cell_id], new.loc[cell_id]
        where = cell_name(b)
        if a.status != b.status:
            kind = "regression" if Status(b.status).rank > Status(a.status).rank else "improvement"
            changes.append(Change(kind, "verdict", where, a.status, f"{b.status} ({b.reason})"))
        if a.measured and b.measured and pd.notna(a.final_accuracy) and pd.notna(b.final_accuracy):
            delta = b.final_accuracy - a.final_accuracy
            if abs(delta) > tol.accuracy_drop:
                changes.append(
                    Change(
                        "regression" if delta < 0 else "improvement",
                        "accuracy",
                        where,
                        f"{a.final_accuracy:.3f}",
                        f"{b.final_accuracy:.3f}",
                    )
                )
        speed_a, speed_b = throughput(a), throughput(b)
        if speed_a > 0 and speed_b > 0:
            ratio = speed_b / speed_a
            if abs(ratio - 1) > tol.throughput_drop:
                changes.append(
                    Change(
                        "regression" if ratio < 1 else "improvement",
                        "throughput",
                        where,
                        f"{speed_a * 1e3:.3g} TFLOP/s",
                        f"{speed_b * 1e3:.3g} TFLOP/s ({ratio:.2f}x)",
                    )
                )
    keys = ["task", "size", "arch", "depth"]
    widths = (
        min_gflops(before)
        .set_index(keys)
        .width.to_frame("before")
        .join(min_gflops(after).set_index(keys).width.to_frame("after"), how="inner")
    )
    for (task, size, arch, depth), w in widths.iterrows():
        a, b = (math.inf if pd.isna(v) else v for v in (w.before, w.after))
        if a != b:
            show = [("none" if v == math.inf else f"{v:.0f}") for v in (a, b)]
            changes.append(
                Change("regression" if b > a else "improvement", "min_width", f"{task} {size} {arch} d{depth}", *show)
            )
    claims_before, claims_after = claims_before or {}, claims_after or {}
    for claim in sorted(claims_before.keys() & claims_after.keys()):
        a, b = claims_before[claim], claims_after[claim]
        if a != b:
            worse = ClaimStatus(b).rank > ClaimStatus(a).rank
            changes.append(Change("regression" if worse else "improvement", "claim", claim, a, b))
    return {
        "regressions": [asdict(c) for c in changes if c.kind == "regression"],
        "improvements": [asdict(c) for c in changes if c.kind == "improvement"],
        "new": sorted(cell_name(r) for r in after[~after.cell_id.isin(before.cell_id)].itertuples()),
        "missing": sorted(cell_name(r) for r in before[~before.cell_id.isin(after.cell_id)].itertuples()),
    }


def markdown(result: dict, title: str) -> str:
    lines = [
        f"# {title}",
        "",
        f"{len(result['regressions'])} regressions, {len(result['improvements'])} improvements, "
        f"{len(result['new'])} new cells, {len(result['missing'])} missing cells.",
        "",
    ]
    for kind in ("regressions", "improvements"):
        if result[kind]:
            frame = pd.DataFrame(result[kind]).drop(columns="kind")
            lines += [f"## {kind.capitalize()}", "", frame.to_markdown(index=False), ""]
    for kind in ("new", "missing"):
        if result[kind]:
            lines += [f"## {kind.capitalize()} cells", ""] + [f"- {name}" for name in result[kind]] + [""]
    return "\n".join(lines)


def html(result: dict) -> str:
    parts = [
        f"<p>{len(result['regressions'])} regressions, {len(result['improvements'])} improvements, "
        f"{len(result['new'])} new cells, {len(result['missing'])} missing cells.</p>"
    ]
    for kind in ("regressions", "improvements"):
        if result[kind]:
            parts += [
                f"<h3>{kind.capitalize()}</h3>",
                pd.DataFrame(result[kind]).drop(columns="kind").to_html(index=False),
            ]
    for kind in ("new", "missing"):
        if result[kind]:
            items = "".join(f"<li>{html_mod.escape(name)}</li>" for name in result[kind])
            parts.append(f"<h3>{kind.capitalize()} cells</h3><ul>{items}</ul>")
    return "".join(parts)
