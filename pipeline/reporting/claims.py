"""The two papers' claims that a sweep can test, written once as data, and their evaluation on a results table.

Each ``Claim`` names what it says, which results decide it and a rule. A rule reads the ``Evidence`` (the
minimum-width table of ``pipeline.reporting.tables`` and the per-cell accuracies) and returns a ``ClaimCheck``: the
claim *holds*, *fails*, or is *not tested* at this scale, with the reason (e.g. "needs index_lookup lengths > 100").
A failed or diverged trial counts as unsolved, as in the tables; a check over tasks with failed trials says so.

Claims rest on decided cells only. An undecided trial (its step budget ran out while it was still improving) is
no evidence either way, so ``Evidence`` notes every undecided cell a rule's answer depends on: the cells narrower
than a minimum width it reads (all of them where no width solved), those under a best accuracy it reads, those
at a width it checks. A check that consulted any is *not tested*, naming them (``evaluate``).

The report shows the checks at the top of its page, writes them to ``results/report.json`` (so ``dvc metrics
diff`` shows a claim that changed) and tags the MLflow parent run with them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

import pandas as pd

from pipeline.reporting.tables import cell_means, min_gflops


class ClaimStatus(StrEnum):
    """A claim check's result, best first (a nightly run whose claim moves down the order regressed)."""

    HOLDS = "holds"
    NOT_TESTED = "not tested"
    FAILS = "fails"

    @property
    def rank(self) -> int:
        return list(ClaimStatus).index(self)


TRANSFORMERS = ("transformer", "standard")  # softmax attention: the separations paper's and the DP paper's
RECURRENT = ("lstm", "dss", "mamba", "retnet", "linear_nofm")  # the separations paper's non-attention models
EFFICIENT = ("sparse", "linear")  # the DP paper's efficient Transformers
GENERAL_DP = ("arithmetic", "ed", "lis")  # DP tasks without the locality assumption
SHOWN_UNDECIDED = 3  # a not-tested check names this many undecided cells, then counts the rest
TIE = 0.05  # unsolved on both sides: best test accuracies closer than this are no ordering
NEAR_CHANCE = 0.10  # index lookup: "near chance" = test accuracy below 10% (chance is 1/64 = 1.6%)
INF = math.inf


@dataclass(frozen=True)
class ClaimCheck:
    status: ClaimStatus
    detail: str


def holds_if(failures: list[str], passes: list[str], untested: str) -> ClaimCheck:
    """The usual verdict: fails if any case failed, holds if some case passed, else not tested."""
    if failures:
        return ClaimCheck(ClaimStatus.FAILS, "; ".join(failures))
    if passes:
        return ClaimCheck(ClaimStatus.HOLDS, "; ".join(passes))
    return ClaimCheck(ClaimStatus.NOT_TESTED, untested)


def select(frame: pd.DataFrame, task: str, size: int, arch: str, depths: Iterable[int] | None) -> pd.DataFrame:
    """The rows of ``frame`` of (task, size, arch) at ``depths`` (all: None)."""
    mine = frame[(frame.task == task) & (frame["size"] == size) & (frame.arch == arch)]
    return mine if depths is None else mine[mine.depth.isin(list(depths))]


class Evidence:
    """What the rules read: per (task, size, arch, depth) the smallest width every seed solved (None: no width
    solved), and per cell the mean test accuracy over the measured seeds. The lookups a rule decides on note the
    undecided cells their answer depends on in ``undecided`` (cell -> the trial's reason), which ``evaluate``
    empties before each claim; ``smallest_width``, ``top_accuracy`` and ``shown`` read the same numbers for the
    text beside a verdict, noting nothing."""

    def __init__(self, table: pd.DataFrame):
        self.table = table
        self.best = min_gflops(table)
        self.cells = cell_means(table)
        self.pending = table[table.status == "undecided"]  # the rows with no verdict yet
        self.undecided: dict[str, str] = {}

    def consult(self, cells: pd.DataFrame) -> None:
        """Note the undecided rows of ``cells`` (rows of ``pending``) as ones the check depends on."""
        for r in cells.itertuples():
            name = f"{r.task} n={r.size} {r.arch} d{r.depth}: seed {r.seed} D={r.width}"
            self.undecided[name] = str(r.reason).split(";")[0]  # the verdict's words, not the curve's numbers

    def sizes(self, task: str) -> list[int]:
        return sorted(int(s) for s in self.best[self.best.task == task]["size"].unique())

    def depths(self, task: str, arch: str) -> list[int]:
        mine = self.best[(self.best.task == task) & (self.best.arch == arch)]
        return sorted(int(d) for d in mine.depth.unique())

    def narrowest(self, task: str, arch: str) -> int:
        return int(self.cells[(self.cells.task == task) & (self.cells.arch == arch)].width.min())

    def smallest_width(self, task: str, size: int, arch: str, depths: Iterable[int] | None) -> float:
        """``min_width`` without noting anything."""
        mine = select(self.best, task, size, arch, depths)
        if mine.empty:
            return math.nan
        widths = mine.width.dropna()
        return float(widths.min()) if len(widths) else INF

    def min_width(self, task: str, size: int, arch: str, depths: Iterable[int] | None = None) -> float:
        """The smallest width solved at any of ``depths`` (all: None); inf where none solved; NaN if not run.
        Depends on the undecided cells narrower than it: any of them might solve."""
        width = self.smallest_width(task, size, arch, depths)
        mine = select(self.pending, task, size, arch, depths)
        self.consult(mine[mine.width < width])
        return width

    def solved(self, task: str, size: int, arch: str, depths: Iterable[int] | None = None) -> bool | None:
        """Solved at some width (None: not run). A solved cell settles it; an unsolved answer depends on every
        undecided cell."""
        width = self.smallest_width(task, size, arch, depths)
        if width == INF:
            self.consult(select(self.pending, task, size, arch, depths))
        return None if math.isnan(width) else width < INF

    def cost(self, task: str, size: int, arch: str, depth: int) -> float:
        """The minimum width's paper-convention GFLOPs: inf where none solved, NaN if not run; depends as
        ``min_width``."""
        if self.min_width(task, size, arch, [depth]) == INF:
            return INF
        mine = select(self.best, task, size, arch, [depth])
        return float(mine.min_paper_gflops.iloc[0]) if len(mine) else math.nan

    def best_accuracy(
        self, task: str, size: int, arch: str, depths: Iterable[int] | None = None, below: float = INF
    ) -> float:
        """The best mean test accuracy over widths narrower than ``below`` (and depths); NaN if none was measured.
        Depends on the undecided cells among them: one still improving might do better."""
        mine = select(self.pending, task, size, arch, depths)
        self.consult(mine[mine.width < below])
        return self.top_accuracy(task, size, arch, depths, below)

    def top_accuracy(self, task: str, size: int, arch: str, depths: Iterable[int] | None, below: float) -> float:
        """``best_accuracy`` without noting anything: for the text beside a verdict decided otherwise."""
        mine = select(self.cells, task, size, arch, depths)
        mine = mine[mine.width < below]
        return float(mine.accuracy.max()) if mine.accuracy.notna().any() else math.nan

    def solved_at(self, task: str, size: int, arch: str, width: int, depths: Iterable[int] | None) -> bool | None:
        """Some seed solved ``width`` (None: not run); as ``solved``, an unsolved answer depends on the undecided
        seeds there."""
        mine = select(self.cells, task, size, arch, depths)
        mine = mine[mine.width == width]
        solved = None if mine.empty else bool((mine.solved > 0).any())
        if solved is False:
            pending = select(self.pending, task, size, arch, depths)
            self.consult(pending[pending.width == width])
        return solved

    def shown(self, task: str, size: int, arch: str, depths: Iterable[int] | None = None) -> str:
        """The minimum width and best accuracy as shown beside a verdict the rule decided otherwise."""
        width = self.smallest_width(task, size, arch, depths)
        return f"D={width_text(width)}, best {self.top_accuracy(task, size, arch, depths, INF):.0%}"

    def failed_trials(self, tasks: Iterable[str]) -> int:
        return int(((self.table.status == "failed") & self.table.task.isin(list(tasks))).sum())


def width_text(width: float) -> str:
    return "none" if width == INF else f"{width:.0f}"


# ---- rules -------------------------------------------------------------------------------------------------


def width_grows(min_depth: int) -> Callable[[Evidence], ClaimCheck]:
    """Sparse and linear: on each general DP task and depth >= min_depth, the minimum width never shrinks with
    size and is larger at the largest size than at the smallest. A chain solved at its narrowest width at every
    size, or at no size, cannot tell and is skipped."""

    def rule(ev: Evidence) -> ClaimCheck:
        failures: list[str] = []
        passes: list[str] = []
        for task in GENERAL_DP:
            sizes = ev.sizes(task)
            for arch in EFFICIENT:
                for depth in (d for d in ev.depths(task, arch) if d >= min_depth):
                    widths = [ev.min_width(task, s, arch, [depth]) for s in sizes]
                    if (
                        len(sizes) < 2
                        or all(w == INF for w in widths)
                        or all(w == ev.narrowest(task, arch) for w in widths)
                    ):
                        continue
                    chain = f"{task} {arch} d{depth}: " + ", ".join(
                        f"n={s} D={width_text(w)}" for s, w in zip(sizes, widths)
                    )
                    grows = all(a <= b for a, b in zip(widths, widths[1:])) and widths[-1] > widths[0]
                    (passes if grows else failures).append(chain)
        deeper = f" at depth >= {min_depth}" if min_depth > 1 else ""
        return holds_if(
            failures,
            passes,
            f"needs two sizes of arithmetic, ed or lis with sparse or linear{deeper}, "
            "solved at some size above the narrowest width",
        )

    return rule


def no_savings_general(ev: Evidence) -> ClaimCheck:
    """ed and lis: at the largest size the standard Transformer solved, sparse and linear need at least its
    paper-convention GFLOPs (or do not solve)."""
    failures: list[str] = []
    passes: list[str] = []
    for task in ("ed", "lis"):
        for depth in ev.depths(task, "standard"):
            solved = [s for s in ev.sizes(task) if ev.solved(task, s, "standard", [depth])]
            if not solved:
                continue
            size = solved[-1]
            base = ev.cost(task, size, "standard", depth)
            for arch in EFFICIENT:
                cost = ev.cost(task, size, arch, depth)
                if math.isnan(cost):
                    continue
                case = (
                    f"{task} n={size} d{depth}: {arch} {cost:.3g} vs standard {base:.3g} GFLOPs"
                    if cost < INF
                    else f"{task} n={size} d{depth}: {arch} unsolved, standard {base:.3g} GFLOPs"
                )
                (failures if cost < base else passes).append(case)
    return holds_if(failures, passes, "needs ed or lis solved by the standard Transformer, with sparse or linear")


def locality(ev: Evidence) -> ClaimCheck:
    """Sparse and linear need no wider a model on ed_local than on ed at the same n and depth."""
    failures: list[str] = []
    passes: list[str] = []
    for size in sorted(set(ev.sizes("ed")) & set(ev.sizes("ed_local"))):
        for arch in EFFICIENT:
            for depth in sorted(set(ev.depths("ed", arch)) & set(ev.depths("ed_local", arch))):
                plain, local = (ev.min_width(t, size, arch, [depth]) for t in ("ed", "ed_local"))
                if plain == local == INF:
                    continue
                case = f"n={size} {arch} d{depth}: ed_local D={width_text(local)}, ed D={width_text(plain)}"
                (passes if local <= plain else failures).append(case)
    return holds_if(failures, passes, "needs ed and ed_local at a common n with sparse or linear, solved at one")


def standard_first_on_arithmetic(ev: Evidence) -> ClaimCheck:
    """On arithmetic the standard Transformer ranks first: its minimum width is no larger than sparse's and
    linear's; at the widths neither solves (all of them if neither does, else those below their common minimum),
    its best test accuracy is no lower. A difference below TIE is a tie: it holds where both solve at the same
    width, and decides nothing where neither solves."""
    failures: list[str] = []
    passes: list[str] = []
    for size in ev.sizes("arithmetic"):
        for depth in ev.depths("arithmetic", "standard"):
            width = ev.min_width("arithmetic", size, "standard", [depth])
            for arch in EFFICIENT:
                if depth not in ev.depths("arithmetic", arch):
                    continue
                other = ev.min_width("arithmetic", size, arch, [depth])
                if math.isnan(width) or math.isnan(other):
                    continue
                case = f"{size} ops d{depth}: standard D={width_text(width)} vs {arch} D={width_text(other)}"
                first = width <= other
                if width == other:  # the same minimum: the narrower widths, which neither solves, rank them
                    accuracy, other_accuracy = (
                        ev.best_accuracy("arithmetic", size, a, [depth], below=width) for a in ("standard", arch)
                    )
                    if not (math.isnan(accuracy) or math.isnan(other_accuracy)):
                        if width == INF and abs(accuracy - other_accuracy) < TIE:
                            continue  # neither solves and their accuracies are within noise: no ordering to check
                        first = accuracy > other_accuracy - TIE
                        where = "at every width" if width == INF else f"below D={width:.0f}"
                        case += f"; {where}: best {accuracy:.0%} vs {other_accuracy:.0%}"
                (passes if first else failures).append(case)
    return holds_if(failures, passes, "needs arithmetic with standard and sparse or linear at one depth")


def transformer_solves(
    task: str, depths: tuple[int, ...] | None, min_size: int = 0
) -> Callable[[Evidence], ClaimCheck]:
    """A Transformer (at ``depths``; None: any) solves ``task`` at every size >= min_size."""

    def rule(ev: Evidence) -> ClaimCheck:
        failures: list[str] = []
        passes: list[str] = []
        for arch in TRANSFORMERS:
            for size in (s for s in ev.sizes(task) if s >= min_size):
                solved = ev.solved(task, size, arch, depths)
                if solved is None:
                    continue
                (passes if solved else failures).append(f"{arch} N={size}: {ev.shown(task, size, arch, depths)}")
        layers = f"a {depths[0]}-layer Transformer" if depths else "a Transformer"
        return holds_if(failures, passes, f"needs {task} with {layers}")

    return rule


def index_lookup_separation(ev: Evidence) -> ClaimCheck:
    """Some length N at which a one-layer Transformer solves index lookup and the LSTM stays near chance at
    every width and depth tried."""
    cases = []
    for size in ev.sizes("index_lookup"):
        lstm = ev.best_accuracy("index_lookup", size, "lstm")
        for arch in TRANSFORMERS:
            solved = ev.solved("index_lookup", size, arch, [1])
            if solved is None or math.isnan(lstm):
                continue
            cases.append(
                (
                    solved and lstm < NEAR_CHANCE,
                    f"N={size}: 1-layer {arch} {'solves' if solved else 'does not solve'}, LSTM best {lstm:.1%}",
                )
            )
    if not cases:
        return ClaimCheck(ClaimStatus.NOT_TESTED, "needs index_lookup with a 1-layer transformer and an LSTM")
    separated = [text for ok, text in cases if ok]
    if separated:
        return ClaimCheck(ClaimStatus.HOLDS, "; ".join(separated))
    return ClaimCheck(ClaimStatus.FAILS, "; ".join(t for _, t in cases))


def fail_beyond(
    task: str, archs: tuple[str, ...], beyond: int, width: int | None = None, depths: tuple[int, ...] | None = None
) -> Callable[[Evidence], ClaimCheck]:
    """Each of ``archs`` present stays unsolved on ``task`` at every size > beyond (at ``width`` only, if
    given, else at any width; at ``depths`` only, if given)."""

    def rule(ev: Evidence) -> ClaimCheck:
        failures: list[str] = []
        passes: list[str] = []
        for size in (s for s in ev.sizes(task) if s > beyond):
            for arch in archs:
                if width is None:
                    solved = ev.solved(task, size, arch, depths)
                else:
                    solved = ev.solved_at(task, size, arch, width, depths)
                if solved is None:
                    continue
                at = f" D={width}" if width else ""
                case = f"{arch}{at} N={size}: best {ev.top_accuracy(task, size, arch, depths, INF):.0%}"
                (failures if solved else passes).append(case + (" (solved)" if solved else ""))
        layers = f" at depth {'/'.join(map(str, depths))}" if depths else ""
        return holds_if(
            failures,
            passes,
            f"needs {task} lengths > {beyond} with {' or '.join(archs)}{layers}"
            + (f" at width {width}" if width else ""),
        )

    return rule


def lstm_solves_dyck(ev: Evidence) -> ClaimCheck:
    failures: list[str] = []
    passes: list[str] = []
    for size in ev.sizes("dyck"):
        solved = ev.solved("dyck", size, "lstm")
        if solved is not None:
            (passes if solved else failures).append(f"N={size}: {ev.shown('dyck', size, 'lstm')}")
    return holds_if(failures, passes, "needs dyck with an LSTM")


# ---- the claims ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    id: str
    paper: Literal["DP", "separations"]
    text: str
    decided_by: str
    tasks: tuple[str, ...]
    rule: Callable[[Evidence], ClaimCheck]


CLAIMS = (
    Claim(
        "dp_width_grows",
        "DP",
        "General DP tasks need Sparse and Linear Transformers whose width grows with the problem size.",
        "minimum width of sparse and linear per (task, depth) across sizes of arithmetic, ed, lis",
        GENERAL_DP,
        width_grows(1),
    ),
    Claim(
        "dp_width_grows_deeper",
        "DP",
        "The growth persists in the deeper models (Figure 3: depth 5).",
        "as dp_width_grows, at depth >= 5",
        GENERAL_DP,
        width_grows(5),
    ),
    Claim(
        "dp_no_savings_general",
        "DP",
        "On general DP tasks the efficient Transformers save no computation: at the largest size the standard "
        "Transformer solves, sparse and linear need at least its forward GFLOPs.",
        "Table 2 (paper-convention GFLOPs) of ed and lis per depth",
        ("ed", "lis"),
        no_savings_general,
    ),
    Claim(
        "dp_locality",
        "DP",
        "With locality (ed_local), Sparse and Linear Transformers need no wider a model than on ed (Figure 2).",
        "minimum width of sparse and linear on ed_local against ed at each n and depth",
        ("ed", "ed_local"),
        locality,
    ),
    Claim(
        "dp_arithmetic_standard_first",
        "DP",
        "On arithmetic the standard Transformer needs no wider a model than Sparse or Linear attention "
        "(at the widths none solves: reaches no lower accuracy).",
        "minimum width, then the best test accuracy at the widths neither solves, per (size, depth) of arithmetic",
        ("arithmetic",),
        standard_first_on_arithmetic,
    ),
    Claim(
        "sep_index_lookup_one_layer",
        "separations",
        "A one-layer Transformer solves index lookup at every length.",
        "1-layer transformer (or standard) minimum width at every index_lookup size",
        ("index_lookup",),
        transformer_solves("index_lookup", (1,)),
    ),
    Claim(
        "sep_index_lookup_separation",
        "separations",
        f"Index lookup separates: a one-layer Transformer solves lengths at which the LSTM stays near chance "
        f"(below {NEAR_CHANCE:.0%}; chance 1/64).",
        "1-layer transformer verdict and the LSTM's best test accuracy per index_lookup length",
        ("index_lookup",),
        index_lookup_separation,
    ),
    Claim(
        "sep_index_lookup_recurrent_fail",
        "separations",
        "Recurrent and linear models fail index lookup beyond N = 100.",
        "verdicts of lstm, dss, mamba, retnet, linear_nofm at index_lookup N > 100",
        ("index_lookup",),
        fail_beyond("index_lookup", RECURRENT, 100),
    ),
    Claim(
        "sep_dyck_lstm",
        "separations",
        "LSTMs solve bounded Dyck-(2,2) at every length.",
        "lstm minimum width at every dyck size",
        ("dyck",),
        lstm_solves_dyck,
    ),
    Claim(
        "sep_dyck_one_layer_struggles",
        "separations",
        "One-layer Transformers struggle on bounded Dyck beyond N = 100.",
        "1-layer transformer verdicts at dyck N > 100",
        ("dyck",),
        fail_beyond("dyck", TRANSFORMERS, 100, depths=(1,)),
    ),
    Claim(
        "sep_equality_transformer",
        "separations",
        "Transformers solve string equality (eq_random, eq_one) at every length.",
        "transformer minimum width at every eq_random and eq_one size",
        ("eq_random", "eq_one"),
        lambda ev: merge_checks([transformer_solves("eq_random", None)(ev), transformer_solves("eq_one", None)(ev)]),
    ),
    Claim(
        "sep_eq_random_recurrent_fail",
        "separations",
        "On eq_random, the LSTM and the linear Transformer fail beyond N = 100.",
        "verdicts of lstm and linear_nofm at eq_random N > 100",
        ("eq_random",),
        fail_beyond("eq_random", ("lstm", "linear_nofm"), 100),
    ),
    Claim(
        "sep_eq_ncp_ssm_width_64",
        "separations",
        "On eq_ncp, DSS and Mamba of width 64 fail beyond N = 400, where Transformers still solve.",
        "dss and mamba verdicts at width 64 and transformer verdicts at eq_ncp N > 400",
        ("eq_ncp",),
        lambda ev: merge_checks(
            [
                fail_beyond("eq_ncp", ("dss", "mamba"), 400, width=64)(ev),
                transformer_solves("eq_ncp", None, min_size=401)(ev),
            ]
        ),
    ),
)


def merge_checks(checks: list[ClaimCheck]) -> ClaimCheck:
    """A claim made of parts: fails if a part fails, holds if every part holds, else not tested."""
    for status in (ClaimStatus.FAILS, ClaimStatus.NOT_TESTED):
        hit = [c.detail for c in checks if c.status == status]
        if hit:
            return ClaimCheck(status, "; ".join(hit))
    return ClaimCheck(ClaimStatus.HOLDS, "; ".join(c.detail for c in checks))


def undecided_check(undecided: dict[str, str]) -> ClaimCheck:
    """Not tested: the check depends on these undecided cells (cell -> reason); the first few named."""
    named = [f"{cell} undecided ({reason})" for cell, reason in list(undecided.items())[:SHOWN_UNDECIDED]]
    more = len(undecided) - len(named)
    return ClaimCheck(ClaimStatus.NOT_TESTED, "; ".join(named) + (f"; and {more} more undecided cells" if more else ""))


def evaluate(table: pd.DataFrame, claims: Iterable[Claim] = CLAIMS) -> list[dict]:
    """Every claim's check on ``table`` (results/sweep.csv), as rows for the page, report.json and MLflow; a
    check that depends on an undecided cell is not tested."""
    ev = Evidence(table)
    rows = []
    for claim in claims:
        ev.undecided = {}
        check = claim.rule(ev)
        if ev.undecided:
            check = undecided_check(ev.undecided)
        failed = ev.failed_trials(claim.tasks)
        detail = check.detail + (
            f" ({failed} failed trials in {', '.join(claim.tasks)}, counted as unsolved)"
            if failed and check.status != ClaimStatus.NOT_TESTED
            else ""
        )
        rows.append(
            {
                "id": claim.id,
                "paper": claim.paper,
                "claim": claim.text,
                "decided_by": claim.decided_by,
                "status": check.status,
                "detail": detail,
            }
        )
    return rows
