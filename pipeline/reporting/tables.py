"""The DP paper's Table 2 from the sweep's results: per (task, size, architecture, depth) the smallest width
solved by every seed, and what it costs in three conventions.

- paper GFLOPs: the DP paper's thop-style forward count over L + 2 tokens (``Backbone.paper_flops``);
- exact GFLOPs: every matmul of one forward pass over L tokens under the real attention pattern;
- training PFLOPs to the threshold: the compute a trial had spent when its validation accuracy first stayed at
  the threshold (``solve_pflops``), the mean over the seeds measured at that width.

An undecided trial (its budget ran out while it was still improving) is no verdict: a minimum width with undecided
cells below it is an upper bound, and a row no width solved with undecided cells is undecided, never unsolved.

The table is at the sweep's threshold (``report.accuracy_threshold``, Table 2's 90%); ``at_threshold`` reads the
same results at another one from what each trial recorded (the accuracy its validation held, whether it had
converged): `python -m pipeline.report --table-at 0.99` prints the table at 99%.

For arithmetic the paper states its lengths (``PAPER_LENGTHS``, from each task's ``paper_lengths``); our data's
longest sequence differs (random expressions), so the paper-convention count is also given at the paper's L. The
count is 2 (L+2) x (per-token MACs), linear in L + 2, so  paper_gflops(L') = paper_gflops(L) (L'+2) / (L+2)  exactly.
"""

from __future__ import annotations

import pandas as pd

from pipeline.common.cell import Cell
from pipeline.common.status import Status, borderline_rows
from pipeline.reporting.findings import TABLE2_GFLOPS, TABLE2_LAYERS, TABLE2_LENGTHS, table2_widths
from pipeline.search.frontier import MinWidth, Outcome, min_widths, searched
from tasks import TASKS

# The lengths L a paper states, per task and size: each task's own ``paper_lengths`` (today arithmetic's only)
PAPER_LENGTHS = {name: dict(task.paper_lengths) for name, task in TASKS.items() if task.paper_lengths}
BASELINE = "standard"  # the ratio column: cost of the cheapest architecture over the standard Transformer's
CONVENTIONS = {
    "min_paper_gflops": "paper-convention forward GFLOPs",
    "min_exact_gflops": "exact forward GFLOPs",
    "min_train_pflops": "training PFLOPs spent until solved",
}


def at_threshold(table: pd.DataFrame, threshold: float, swept_at: float) -> pd.DataFrame:
    """``table`` (results/sweep.csv, its verdicts at ``swept_at``) with its verdicts at ``threshold``: a measured
    trial is solved if its validation held ``threshold`` at ``patience`` checks (``sustained_accuracy``), unsolved if
    it held less and had converged, else undecided: it stopped first (at its target, or its budget). An inferred
    cell keeps its verdict where the threshold's direction preserves it (unsolved at 90%: unsolved at 99%), else is
    undecided. Training PFLOPs to solve are known at ``swept_at`` only; borderline is read at ``threshold``."""
    if abs(threshold - swept_at) < 1e-9:
        return table
    missing = [c for c in ("sustained_accuracy", "converged") if c not in table]
    if missing:
        raise ValueError(f"the results lack {missing}: written before trials recorded them (run the sweep again)")
    out = table.copy()
    out["reason"] = out.get("reason", pd.Series("", index=out.index)).astype(object)  # all-empty reads as float
    verdicts = out.status.isin([Status.SOLVED, Status.UNSOLVED, Status.UNDECIDED])
    measured = verdicts & out.measured.astype(bool)
    held = out.sustained_accuracy >= threshold - 1e-6
    converged = out.converged.fillna(0).astype(bool)
    out.loc[measured & held, "status"] = Status.SOLVED
    out.loc[measured & ~held & converged, "status"] = Status.UNSOLVED
    short = measured & ~held & ~converged & (out.status != Status.UNDECIDED)  # an undecided one keeps its reason
    out.loc[short, "status"] = Status.UNDECIDED
    out.loc[short, "reason"] = [
        f"at {threshold:.0%}: validation held {s:.1%} when the trial stopped, not converged (it trained toward {t:.0%})"
        for s, t in zip(out.sustained_accuracy[short], out.get("target", pd.Series(swept_at, index=out.index))[short])
    ]
    lost = Status.SOLVED if threshold > swept_at else Status.UNSOLVED  # what an inferred cell can no longer claim
    unsure = verdicts & ~out.measured.astype(bool) & (out.status == lost)
    out.loc[unsure, "status"] = Status.UNDECIDED
    out.loc[unsure, "reason"] = f"inferred at {swept_at:.0%}, not at {threshold:.0%}"
    out["solve_pflops"] = float("nan")
    if "borderline" in out:
        out["borderline"] = borderline_rows(out, threshold)
    return out


def borderline_cells(table: pd.DataFrame) -> pd.Series:
    """Per row: a measured cell whose test accuracy's 95% interval contains the threshold (the sweep's
    ``borderline`` column; False where a table from before it lacks the column)."""
    if "borderline" not in table:
        return pd.Series(False, index=table.index)
    return table.borderline.eq(True) & table.measured.astype(bool)  # NaN: a row from before the column


def cell_means(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (task, size, arch, width, depth): test accuracy averaged over the seeds that were measured
    (NaN where the search inferred every seed), its spread, how the seeds ended (``undecided``: how many seeds
    are), and whether any seed is borderline."""
    keys = ["task", "size", "max_len", "arch", "width", "depth"]
    solved = table.status == "solved"
    return (
        table.assign(
            scored=table.final_accuracy.where(table.measured),
            solve_cost=table.solve_pflops.where(solved & table.measured) if "solve_pflops" in table else float("nan"),
            near=borderline_cells(table),
            is_solved=solved.astype(int),
            is_undecided=(table.status == "undecided").astype(int),
        )
        .groupby(keys, as_index=False)
        .agg(
            accuracy=("scored", "mean"),
            accuracy_std=("scored", "std"),
            accuracy_min=("scored", "min"),
            accuracy_max=("scored", "max"),
            seeds=("seed", "nunique"),
            measured=("measured", "sum"),
            solved=("is_solved", "sum"),
            undecided=("is_undecided", "sum"),
            borderline=("near", "any"),
            statuses=("status", lambda st: ",".join(sorted(set(st)))),
            paper_gflops=("paper_gflops", "first"),
            exact_gflops=("exact_gflops", "first"),
            solve_pflops=("solve_cost", "mean"),
        )
    )


def paper_length(task: str, size: int) -> int | None:
    return PAPER_LENGTHS.get(task, {}).get(int(size))


# min_gflops's columns, in order
MIN_GFLOPS_COLUMNS = (
    "task size L paper_L depth arch min_paper_gflops paper_gflops_at_paper_L min_exact_gflops min_train_pflops width "
    "accuracy best_accuracy statuses undecided borderline"
).split()


def min_gflops(table: pd.DataFrame) -> pd.DataFrame:
    """Per (task, size, arch, depth): the smallest width solved by every seed (``frontier.min_widths``, the same
    rule the search uses) and its cost in the three conventions; ``paper_L`` and ``paper_gflops_at_paper_L``
    where the paper states its own length; ``undecided``: the undecided cells that could make the width narrower,
    or make one solve where none did ("; "-joined, "" when the row is decided); ``borderline``: a seed's test
    accuracy at the minimum width is borderline."""
    cells = cell_means(table).set_index(["task", "size", "arch", "width", "depth"])
    rows = [
        min_width_row(task, size, arch, depth, found, cells.loc[(task, size, arch)].xs(depth, level="depth"))
        for (task, size, arch, depth), found in sorted(smallest_widths(table).items())
    ]
    return pd.DataFrame(rows).reindex(columns=MIN_GFLOPS_COLUMNS)


def smallest_widths(table: pd.DataFrame) -> dict[tuple[str, int, str, int], MinWidth]:
    """Per (task, size, arch, depth): the smallest width solved by every seed and the undecided cells that bound it
    (``frontier.min_widths``, the search's rule), without ``min_gflops``'s costs."""
    outcomes = {
        Cell(r.task, r.size, r.arch, r.width, r.depth, r.seed): Outcome(searched(Status(r.status)), bool(r.measured))
        for r in table.itertuples()
    }
    return min_widths(outcomes)


def min_width_row(task: str, size: int, arch: str, depth: int, found: MinWidth, group: pd.DataFrame) -> dict:
    """One row of ``min_gflops``: ``group`` is the (task, size, arch, depth)'s cells by width (seed means)."""
    data_len, paper_len = int(group.max_len.iloc[0]), paper_length(task, size)
    row: dict = {
        "task": task,
        "size": size,
        "L": data_len,
        "paper_L": paper_len,
        "depth": depth,
        "arch": arch,
        "best_accuracy": round(float(group.accuracy.max()), 4) if group.accuracy.notna().any() else None,
        "statuses": ",".join(sorted(set(",".join(group.statuses).split(",")))),
        "undecided": "; ".join(found.undecided),
        "borderline": False,
    }
    if found.width is not None:
        best = group.loc[found.width]
        row.update(
            min_paper_gflops=float(best.paper_gflops),
            min_exact_gflops=float(best.exact_gflops),
            min_train_pflops=None if pd.isna(best.solve_pflops) else float(best.solve_pflops),
            width=int(found.width),
            accuracy=None if pd.isna(best.accuracy) else round(float(best.accuracy), 4),
            borderline=bool(best.borderline),
        )
        if paper_len is not None:
            row["paper_gflops_at_paper_L"] = float(best.paper_gflops) * (paper_len + 2) / (data_len + 2)
    return row


def cheapest(best: pd.DataFrame, column: str) -> pd.DataFrame:
    """Per (task, size, depth): the architecture with the smallest ``column`` among those solved, and its cost
    over the standard Transformer's (NaN when standard did not solve, or is absent). A tie with standard goes to
    standard (no saving); other ties are all named, comma-separated. None while an entry of the row is undecided:
    it could still turn out the cheapest, or move the ratio."""
    rows = []
    for (task, size, depth), group in best.groupby(["task", "size", "depth"]):
        costs = group.set_index("arch")[column].dropna()
        if costs.empty or (group.undecided != "").any():
            continue
        tied = sorted(costs.index[costs <= costs.min() * (1 + 1e-9)])
        archs = [BASELINE] if BASELINE in tied else tied
        base = costs.get(BASELINE)
        rows.append(
            {
                "task": task,
                "size": size,
                "depth": depth,
                "cheapest": ", ".join(archs),
                "ratio_to_standard": float(costs.min() / base) if base else float("nan"),
            }
        )
    return pd.DataFrame(rows, columns=["task", "size", "depth", "cheapest", "ratio_to_standard"])


def fmt_cost(value: float) -> str:
    return f"{value:.3g}"


BELOW = "\u2020"  # a width solved on validation whose mean test accuracy is below the threshold
BORDERLINE = "\u2248"  # a seed's test accuracy is within noise of the threshold (its 95% interval contains it)
BOUND = "\u2264"  # an upper bound: a narrower cell is undecided


def convention_table(best: pd.DataFrame, depth: int, column: str, threshold: float | None = None) -> pd.DataFrame:
    """One depth, one convention: a row per (task, size, L), a column per architecture with the cost, the width
    and mean test accuracy (marked ``BELOW`` when under ``threshold``, ``BORDERLINE`` when a seed's is within
    noise of it); ``BOUND`` and "undecided below" where a narrower cell is undecided; '-' where no width solved
    and "undecided" where none did but a cell is undecided (the best accuracy and what the trials ended as); the
    cheapest architecture of the row in bold with its ratio to standard."""
    mine = best[best.depth == depth]
    marks = cheapest(mine, column).set_index(["task", "size"])

    def fmt(r) -> str:
        if pd.isna(r.width):
            best_acc = "n/a" if pd.isna(r.best_accuracy) else f"{r.best_accuracy:.0%}"
            failed = ", failed" if "failed" in str(r.statuses) else ""
            return f"{'undecided' if r.undecided else '-'} (best {best_acc}{failed})"
        if pd.isna(r[column]):
            text = f"n/a (D={r.width:.0f})"
        elif pd.isna(r.accuracy):  # every seed inferred: no test accuracy
            text = f"{fmt_cost(r[column])} (D={r.width:.0f})"
        else:
            near = BORDERLINE if r.borderline else ""
            below = BELOW if threshold is not None and r.accuracy < threshold - 1e-9 else ""
            text = f"{fmt_cost(r[column])} (D={r.width:.0f}, {near}{r.accuracy:.0%}{below})"
        if r.undecided:
            return f"{BOUND} {text} undecided below"
        mark = marks.loc[(r.task, r["size"])] if (r.task, r["size"]) in marks.index else None
        if mark is not None and r.arch in mark.cheapest.split(", "):
            ratio = "" if pd.isna(mark.ratio_to_standard) else f", {mark.ratio_to_standard:.2f}x standard"
            text = f"**{text}**{ratio}"
        return text

    index = ["task", "size", "L"]
    if column == "min_paper_gflops" and mine.paper_L.notna().any():
        mine = mine.assign(
            **{
                "paper L": mine.paper_L.map(lambda v: "" if pd.isna(v) else f"{v:.0f}"),
                "at paper L": [("" if pd.isna(g) else fmt_cost(g)) for g in mine.paper_gflops_at_paper_L],
            }
        )
    shown = mine.assign(cell=mine.apply(fmt, axis=1))
    pivot = shown.pivot_table(index=index, columns="arch", values="cell", aggfunc="first")
    if "at paper L" in shown:
        # the paper-length figure of each architecture beside the data's own
        extra = shown.pivot_table(index=index, columns="arch", values="at paper L", aggfunc="first")
        extra = extra[(extra != "").any(axis=1)]
        paper_l = shown.groupby(index)["paper L"].first()
        for arch in extra.columns:
            pivot[f"{arch} @ paper L"] = extra[arch]
        pivot.insert(0, "paper L", paper_l)
    return pivot.rename_axis(columns=None).reset_index().fillna("")


def note(threshold: float) -> str:
    return (
        f"The smallest width D solved by every seed (validation accuracy at or above {threshold:.0%}), with its "
        "mean test accuracy; one table per depth and cost convention. '-' = no width solved (best measured test "
        "accuracy in brackets). 'undecided' = no width solved, but a trial ran out of steps while still "
        "improving: no evidence that the model cannot solve it. "
        f"'{BOUND} ... undecided below' = an upper bound: a narrower width is undecided and might still solve. "
        "Bold: the cheapest architecture of the row, with its cost over the standard Transformer's (a tie with "
        "standard marks standard alone; no mark while an entry of the row is undecided). Training PFLOPs: compute "
        "spent until the trial was solved, mean over the seeds measured at that width. '@ paper L': the "
        "paper-convention count at the length the paper states (paper L), beside ours at the data's longest "
        f"sequence (L). {BELOW}: solved on validation, but the mean test accuracy is below {threshold:.0%}. "
        f"{BORDERLINE}: borderline, the 95% interval of a seed's test accuracy contains {threshold:.0%} (another "
        "draw of the test set could put it on the other side). The validation samples are drawn as the test "
        "samples are (for index lookup, string equality and arithmetic, length or operators exactly N, unlike "
        "the training mix), from a stream of their own, and fewer: a width can still pass on them and miss on "
        f"the test set, which {BELOW} marks and the headline counts (solved_below_threshold_on_test)."
    )


def tables_markdown(best: pd.DataFrame, threshold: float) -> str:
    parts = [note(threshold)]
    for depth in sorted(best.depth.unique()):
        for column, title in CONVENTIONS.items():
            parts.append(
                f"\n### Depth {depth}: {title}\n\n"
                + convention_table(best, depth, column, threshold).to_markdown(index=False)
            )
    return "\n".join(parts) + "\n"


def against_table2(best: pd.DataFrame) -> pd.DataFrame:
    """The DP paper's Table 2 beside this run's: per architecture and arithmetic size, the paper's minimum width and
    GFLOPs at its L against ours (``min_gflops``'s row at the paper's depth, its paper-convention GFLOPs taken to the
    paper's L), and how they compare; a cell this run did not train, or did not decide, says so."""
    rows = []
    widths = table2_widths()
    for arch, by_length in TABLE2_GFLOPS.items():
        for size, length in TABLE2_LENGTHS.items():
            mine = best[(best.task == "arithmetic") & (best["size"] == size) & (best.arch == arch)]
            mine = mine[mine.depth == TABLE2_LAYERS]
            paper_width = widths[arch][length]
            width, gflops = None, None
            if mine.empty:
                verdict = f"not run (arithmetic {size} at depth {TABLE2_LAYERS})"
            elif pd.isna(mine.width.iloc[0]):
                undecided = mine.undecided.iloc[0]
                verdict = f"undecided ({undecided})" if undecided else "no width tried solves"
            else:
                r = mine.iloc[0]
                width, gflops = int(r.width), float(r.paper_gflops_at_paper_L)
                verdict = "same width" if width == paper_width else f"{width / paper_width:g}x the paper's width"
                if r.undecided:
                    verdict += f", an upper bound ({r.undecided})"
            rows.append(
                {
                    "arch": arch,
                    "operators": size,
                    "paper_L": length,
                    "paper_width": paper_width,
                    "paper_gflops": by_length[length],
                    "width": width,
                    "gflops_at_paper_L": gflops,
                    "verdict": verdict,
                }
            )
    return pd.DataFrame(rows)
