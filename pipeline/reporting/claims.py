"""The two papers' claims, each as the paper states it, and their check on a results table.

A ``Claim`` carries the paper's words and where it says them (``pipeline.reporting.papers``), the accuracy the
paper calls solved (Table 2: "above 90%"; the separations paper: "near-perfect", read as 99%), the tasks and the
architectures it names, the paper's own outcome, what deciding it needs (the scale the paper decides it at), and a
rule. A rule reads the ``Evidence`` (per cell the verdicts and mean test accuracy, per (task, size, architecture,
depth) the smallest width solved) and returns a ``ClaimCheck``: *holds*, *fails* or *not tested*, with the reason.
The rules state the papers' claims and no more:

- a tie at the narrowest width tried, an architecture or width the claim names that was not run, or no size in the
  claim's range is *not tested*, never *holds*;
- a claim that a model fails is tested only where a positive control (a model the paper reports solving the task)
  reached the threshold on the same task and size under the same recipe: else "the recipe is not shown to learn this
  task here"; likewise a claim that a model is near-perfect fails only at a size where some model reached it;
- a cell counts as reaching a threshold only when every seed was solved on validation and its mean test accuracy is
  at the threshold: a validation pass the test set does not confirm is counted apart, never as solved;
- a claim reads the results at its own threshold (``tables.at_threshold``): a trial that stopped short of it
  without having converged (at its target, or its budget) is undecided there. The sweep trains each task's trials
  on to the highest threshold a claim on the task reads (``thresholds.training_targets``), so that this is rare;
- an undecided cell (its budget ran out while it was still improving) is no evidence either way: a check that
  consulted one is *not tested*, naming it (``evaluate``).

The report leads its page and ``report/fidelity.md`` with the checks this run decided, and gathers the rest under
"Not decided at this scale" with what each needs; it writes them to ``results/report.json`` (``dvc metrics diff``
shows a claim that changed) and tags the MLflow parent run with them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import pandas as pd

from pipeline.reporting.papers import DP, FINDINGS, Finding, table2_in_words
from pipeline.reporting.tables import at_threshold, cell_means, min_gflops
from pipeline.reporting.thresholds import NEAR_PERFECT, TABLE2_THRESHOLD
from tasks import TASKS


class ClaimStatus(StrEnum):
    """A claim check's result, best first (a nightly run whose claim moves down the order regressed)."""

    HOLDS = "holds"
    NOT_TESTED = "not tested"
    FAILS = "fails"

    @property
    def rank(self) -> int:
        return list(ClaimStatus).index(self)


NEAR_PERFECT_SOURCE = "the separations paper's 'near-perfect' (§6, App. H), read as 99%"
TABLE2_SOURCE = "DP paper, Table 2: 'an accuracy above 90%'"
CHANCE_MARGIN = 0.05  # "at chance": best test accuracy within this of chance
SHOWN_UNDECIDED = 3  # a not-tested check names this many undecided cells, then counts the rest
INF = math.inf


@dataclass(frozen=True)
class ClaimCheck:
    status: ClaimStatus
    detail: str


def holds_if(failures: list[str], passes: list[str], untested: str) -> ClaimCheck:
    """Fails if any case failed, holds if some case passed, else not tested (``untested`` says what it needs)."""
    if failures:
        return ClaimCheck(ClaimStatus.FAILS, "; ".join(failures))
    if passes:
        return ClaimCheck(ClaimStatus.HOLDS, "; ".join(passes))
    return ClaimCheck(ClaimStatus.NOT_TESTED, untested)


def select(frame: pd.DataFrame, task: str, size: int, arch: str, depths: Iterable[int] | None) -> pd.DataFrame:
    """The rows of ``frame`` of (task, size, arch) at ``depths`` (all: None)."""
    mine = frame[(frame.task == task) & (frame["size"] == size) & (frame.arch == arch)]
    return mine if depths is None else mine[mine.depth.isin(list(depths))]


@dataclass(frozen=True)
class Models:
    """The runs a claim names: an architecture, at these depths (None: any) and this width (None: any)."""

    arch: str
    depths: tuple[int, ...] | None = None
    width: int | None = None

    def __str__(self) -> str:
        layers = f"{'/'.join(map(str, self.depths))}-layer " if self.depths else ""
        return f"{layers}{self.arch}" + (f" D={self.width}" if self.width else "")


class Evidence:
    """What the rules read: per (task, size, arch, depth) the smallest width every seed solved (None: none), per
    cell the mean test accuracy over the measured seeds and how its seeds ended. The lookups a rule decides on note
    the undecided cells their answer depends on in ``undecided`` (cell -> why), which ``evaluate`` empties before
    each claim. ``table``: the results with their verdicts at the claim's threshold (``tables.at_threshold``)."""

    def __init__(self, table: pd.DataFrame):
        self.table = table
        self.best = min_gflops(table)
        self.cells = cell_means(table)
        self.pending = table[table.status == "undecided"]  # the rows with no verdict yet
        self.undecided: dict[str, str] = {}

    def consult(self, cells: pd.DataFrame, why: str | None = None) -> None:
        """Note the rows ``cells`` (of the table) as undecided ones the check depends on."""
        for r in cells.itertuples():
            name = f"{r.task} n={r.size} {r.arch} d{r.depth}: seed {r.seed} D={r.width}"
            self.undecided[name] = why or str(r.reason).split(";")[0]  # the verdict's words, not the curve's

    def sizes(self, task: str) -> list[int]:
        return sorted(int(s) for s in self.best[self.best.task == task]["size"].unique())

    def depths(self, task: str, arch: str) -> list[int]:
        mine = self.best[(self.best.task == task) & (self.best.arch == arch)]
        return sorted(int(d) for d in mine.depth.unique())

    def ran(self, task: str, models: Models, size: int | None = None) -> bool:
        mine = self.cells[(self.cells.task == task) & (self.cells.arch == models.arch)]
        if size is not None:
            mine = mine[mine["size"] == size]
        if models.depths is not None:
            mine = mine[mine.depth.isin(models.depths)]
        return not (mine if models.width is None else mine[mine.width == models.width]).empty

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
        """The smallest width solved (at the sweep's threshold) at any of ``depths`` (all: None); inf where none
        solved; NaN if not run. Depends on the undecided cells narrower than it: any of them might solve."""
        width = self.smallest_width(task, size, arch, depths)
        mine = select(self.pending, task, size, arch, depths)
        self.consult(mine[mine.width < width])
        return width

    def exact_cost(self, task: str, size: int, arch: str, depth: int) -> float:
        """The minimum width's exact forward GFLOPs: inf where none solved, NaN if not run; depends as
        ``min_width``."""
        if self.min_width(task, size, arch, [depth]) == INF:
            return INF
        mine = select(self.best, task, size, arch, [depth])
        return float(mine.min_exact_gflops.iloc[0]) if len(mine) else math.nan

    def reaches(self, task: str, size: int, models: Models, threshold: float) -> bool | None:
        """Some cell of ``models`` reached ``threshold``: every seed solved on validation and the mean test accuracy
        at it (None: not run). An undecided cell cannot say: noted when nothing reached it."""
        cells = self.of(task, size, models, self.cells)
        if cells.empty:
            return None
        solved = cells.solved == cells.seeds
        if ((cells.accuracy >= threshold) & solved).any():
            return True
        self.consult(self.of(task, size, models, self.pending))
        return False

    def best_accuracy(self, task: str, size: int, models: Models) -> float:
        """The best mean test accuracy of ``models`` (NaN: not run); depends on every undecided cell of them."""
        self.consult(self.of(task, size, models, self.pending))
        return self.top_accuracy(task, size, models)

    def top_accuracy(self, task: str, size: int, models: Models) -> float:
        """``best_accuracy`` without noting anything: for the text beside a verdict decided otherwise."""
        cells = self.of(task, size, models, self.cells)
        return float(cells.accuracy.max()) if cells.accuracy.notna().any() else math.nan

    def learned(self, task: str, size: int, threshold: float) -> bool:
        """Some model of any architecture reached ``threshold`` on (task, size): the recipe learns it here."""
        cells = self.cells[(self.cells.task == task) & (self.cells["size"] == size)]
        return bool(((cells.accuracy >= threshold) & (cells.solved == cells.seeds)).any())

    @staticmethod
    def of(task: str, size: int, models: Models, frame: pd.DataFrame) -> pd.DataFrame:
        mine = select(frame, task, size, models.arch, models.depths)
        return mine if models.width is None else mine[mine.width == models.width]

    def failed_trials(self, tasks: Iterable[str]) -> int:
        return int(((self.table.status == "failed") & self.table.task.isin(list(tasks))).sum())


def width_text(width: float) -> str:
    return "none" if width == INF else f"{width:.0f}"


# ---- rules -------------------------------------------------------------------------------------------------
Rule = Callable[[Evidence, float], ClaimCheck]  # (evidence, the claim's threshold) -> its check


def missing(ev: Evidence, task: str, named: Sequence[Models]) -> ClaimCheck | None:
    """Not tested when a model the claim names was not run on ``task``."""
    absent = [str(m) for m in named if not ev.ran(task, m)]
    if absent:
        return ClaimCheck(ClaimStatus.NOT_TESTED, f"needs {task} with {', '.join(absent)}: not run")
    return None


def near_perfect(task: str, named: Sequence[Models], max_size: int | None = None) -> Rule:
    """Every model ``named`` reaches the threshold on ``task`` at every size up to ``max_size`` it was run at. A model
    that does not counts against the claim only at a size where some model reached it (the recipe learns the task
    there); a size no model reached tests nothing."""

    def rule(ev: Evidence, threshold: float) -> ClaimCheck:
        if absent := missing(ev, task, named):
            return absent
        failures: list[str] = []
        passes: list[str] = []
        unshown: list[str] = []
        for size in (s for s in ev.sizes(task) if max_size is None or s <= max_size):
            learned = ev.learned(task, size, threshold)
            for models in named:
                reached = ev.reaches(task, size, models, threshold)
                if reached is not None:
                    case = f"{models} N={size}: best {ev.top_accuracy(task, size, models):.1%}"
                    (passes if reached else failures if learned else unshown).append(case)
        if unshown and not failures:
            return ClaimCheck(
                ClaimStatus.NOT_TESTED,
                f"the recipe is not shown to learn {task} here: no model reached {threshold:.0%} where "
                + "; ".join(unshown),
            )
        upto = f" up to N={max_size}" if max_size else ""
        return holds_if(failures, passes, f"needs {task}{upto} with {', '.join(map(str, named))}")

    return rule


def fail_with_control(
    task: str, failing: Sequence[Models], controls: Sequence[Models], beyond: int, chance: float | None = None
) -> Rule:
    """At every size > ``beyond`` where a control reached the threshold (the recipe learns the task there), each
    model ``failing`` does not: its best test accuracy stays below the threshold or, with ``chance``, within
    CHANCE_MARGIN of chance. A size no control reached tests nothing."""

    def rule(ev: Evidence, threshold: float) -> ClaimCheck:
        if absent := missing(ev, task, failing):
            return absent
        failures: list[str] = []
        passes: list[str] = []
        uncontrolled = []
        for size in (s for s in ev.sizes(task) if s > beyond):
            if not any(ev.reaches(task, size, c, threshold) for c in controls):
                uncontrolled.append(size)
                continue
            for models in failing:
                best = ev.best_accuracy(task, size, models)
                if math.isnan(best):
                    continue
                failed = best < chance + CHANCE_MARGIN if chance is not None else best < threshold
                (passes if failed else failures).append(f"{models} N={size}: best {best:.1%}")
        if failures or passes:
            return holds_if(failures, passes, "")
        control = " or ".join(map(str, controls))
        if uncontrolled:
            return ClaimCheck(
                ClaimStatus.NOT_TESTED,
                f"the recipe is not shown to learn {task} here: no control ({control}) reached {threshold:.0%} at "
                + ", ".join(f"N={s}" for s in uncontrolled),
            )
        return ClaimCheck(ClaimStatus.NOT_TESTED, f"needs {task} lengths > {beyond} with a control ({control})")

    return rule


def matches(task: str, named: Sequence[Models], reference: Models) -> Rule:
    """Wherever ``reference`` reaches the threshold on ``task``, every model ``named`` does too."""

    def rule(ev: Evidence, threshold: float) -> ClaimCheck:
        if absent := missing(ev, task, [*named, reference]):
            return absent
        failures: list[str] = []
        passes: list[str] = []
        for size in ev.sizes(task):
            if not ev.reaches(task, size, reference, threshold):
                continue
            for models in named:
                reached = ev.reaches(task, size, models, threshold)
                case = f"{models} N={size}: best {ev.top_accuracy(task, size, models):.1%}"
                (passes if reached else failures).append(case)
        return holds_if(failures, passes, f"needs {task} at a length {reference} solves")

    return rule


def width_grows(tasks: Sequence[str], depths: Callable[[int], bool]) -> Rule:
    """In most chains (task, sparse or linear, depth), the minimum width grows with the problem size (never
    shrinks, larger at the largest size than at the smallest) by more than the standard Transformer's at the same
    task and depth. A chain at the narrowest width tried at every size, or solved at no size, tells nothing."""

    def rule(ev: Evidence, threshold: float) -> ClaimCheck:
        grew: list[str] = []
        flat: list[str] = []
        for task in tasks:
            sizes = ev.sizes(task)
            for depth in (d for d in ev.depths(task, "standard") if depths(d)):
                base = [ev.min_width(task, s, "standard", [depth]) for s in sizes]
                for arch in ("sparse", "linear"):
                    if depth not in ev.depths(task, arch) or len(sizes) < 2:
                        continue
                    widths = [ev.min_width(task, s, arch, [depth]) for s in sizes]
                    if all(w == INF for w in widths) or all(w == ev.narrowest(task, arch) for w in widths):
                        continue
                    chain = f"{task} d{depth}: {arch} " + ", ".join(
                        f"n={s} D={width_text(w)}" for s, w in zip(sizes, widths)
                    )
                    chain += " vs standard " + ", ".join(width_text(w) for w in base)
                    grows = all(a <= b for a, b in zip(widths, widths[1:])) and widths[-1] > widths[0]
                    more = growth(widths) > growth(base)
                    (grew if grows and more else flat).append(chain)
        if not grew and not flat:
            return ClaimCheck(
                ClaimStatus.NOT_TESTED,
                f"needs two sizes of {' or '.join(tasks)} with standard and sparse or linear at one depth, solved "
                "above the narrowest width tried",
            )
        status = ClaimStatus.HOLDS if len(grew) > len(flat) else ClaimStatus.FAILS
        return ClaimCheck(
            status,
            f"{len(grew)} of {len(grew) + len(flat)} chains grow more than standard's: " + "; ".join(grew + flat),
        )

    return rule


def growth(widths: list[float]) -> float:
    """How much a chain's minimum width grew from its smallest size to its largest (inf: solved at first, then
    not; 1: no change)."""
    first, last = widths[0], widths[-1]
    if last == INF:
        return INF if first < INF else 1.0
    return last / first if first < INF else 0.0


def no_savings(task: str) -> Rule:
    """At every size the standard Transformer solves, sparse and linear need at least its exact forward FLOPs (or
    do not solve); a tie at the narrowest width tried tells nothing."""

    def rule(ev: Evidence, threshold: float) -> ClaimCheck:
        failures: list[str] = []
        passes: list[str] = []
        ties = []
        for depth in ev.depths(task, "standard"):
            for size in ev.sizes(task):
                base = ev.exact_cost(task, size, "standard", depth)
                if not base < INF:
                    continue
                for arch in ("sparse", "linear"):
                    cost = ev.exact_cost(task, size, arch, depth)
                    if math.isnan(cost):
                        continue
                    narrow = ev.narrowest(task, arch)
                    if (
                        ev.smallest_width(task, size, arch, [depth])
                        == narrow
                        == ev.smallest_width(task, size, "standard", [depth])
                    ):
                        ties.append(f"{task} n={size} d{depth} {arch}")
                        continue
                    shown = f"{cost:.3g}" if cost < INF else "unsolved"
                    case = f"{task} n={size} d{depth}: {arch} {shown} vs standard {base:.3g} exact GFLOPs"
                    (failures if cost < base else passes).append(case)
        tie = f"; a tie at the narrowest width tried tells nothing ({', '.join(ties)})" if ties else ""
        return holds_if(
            failures, passes, f"needs {task} solved by the standard Transformer, with sparse or linear" + tie
        )

    return rule


def locality_reduces(ev: Evidence, threshold: float) -> ClaimCheck:
    """Sparse and linear need a strictly narrower model on ed_local than on ed, at the same n and depth."""
    failures: list[str] = []
    passes: list[str] = []
    for size in sorted(set(ev.sizes("ed")) & set(ev.sizes("ed_local"))):
        for arch in ("sparse", "linear"):
            for depth in sorted(set(ev.depths("ed", arch)) & set(ev.depths("ed_local", arch))):
                plain, local = (ev.min_width(t, size, arch, [depth]) for t in ("ed", "ed_local"))
                if plain == local == INF or plain == local == ev.narrowest("ed", arch):
                    continue  # neither solves, or a tie at the narrowest width tried: no reduction can show
                case = f"n={size} {arch} d{depth}: ed_local D={width_text(local)}, ed D={width_text(plain)}"
                (passes if local < plain else failures).append(case)
    return holds_if(
        failures,
        passes,
        "needs ed and ed_local at a common n with sparse or linear, solved above the narrowest width tried",
    )


def table2_order(ev: Evidence, threshold: float) -> ClaimCheck:
    """On arithmetic, standard < sparse < linear in minimum width (Table 2's order, strict in every column), at
    each size and depth all three were run; a tie at the narrowest width tried tells nothing."""
    failures: list[str] = []
    passes: list[str] = []
    order = ("standard", "sparse", "linear")
    for size in ev.sizes("arithmetic"):
        for depth in ev.depths("arithmetic", "standard"):
            if not all(depth in ev.depths("arithmetic", a) for a in order):
                continue
            widths = [ev.min_width("arithmetic", size, a, [depth]) for a in order]
            if all(w == INF for w in widths) or widths[0] == widths[1] == ev.narrowest("arithmetic", "standard"):
                continue
            case = f"{size} ops d{depth}: " + " < ".join(f"{a} D={width_text(w)}" for a, w in zip(order, widths))
            strict = widths[0] < widths[1] < widths[2] or (widths[0] < widths[1] == widths[2] == INF)
            (passes if strict else failures).append(case)
    return holds_if(
        failures,
        passes,
        "needs arithmetic with standard, sparse and linear at one depth, solved above the narrowest width tried",
    )


def merge(*rules: Rule) -> Rule:
    """A claim made of parts: fails if a part fails, holds if every part holds, else not tested."""

    def rule(ev: Evidence, threshold: float) -> ClaimCheck:
        checks = [r(ev, threshold) for r in rules]
        for status in (ClaimStatus.FAILS, ClaimStatus.NOT_TESTED):
            hit = [c.detail for c in checks if c.status == status]
            if hit:
                return ClaimCheck(status, "; ".join(hit))
        return ClaimCheck(ClaimStatus.HOLDS, "; ".join(c.detail for c in checks))

    return rule


# ---- the claims ----------------------------------------------------------------------------------------------
FINDING = {f.id: f for f in FINDINGS}
TF1, TF2 = Models("transformer", (1,)), Models("transformer", (2,))
RECURRENT = tuple(Models(a) for a in ("lstm", "dss", "mamba", "linear_nofm", "retnet"))  # §6's five


@dataclass(frozen=True)
class Claim:
    """One claim of a paper: ``finding`` (its words and where), the ``threshold`` it reads (with ``source``), the
    ``tasks`` it is about and what our ``test`` of it reads, the paper's own outcome in words (``paper_outcome``,
    naming its figure), what deciding it ``needs`` (the models and sizes the paper decides it at), the ``rule``."""

    id: str
    finding: Finding
    threshold: float
    source: str
    tasks: tuple[str, ...]
    test: str
    paper_outcome: str
    needs: str
    rule: Rule = field(repr=False)

    def __post_init__(self):
        if not 0 < self.threshold < 1:
            raise ValueError(f"claim {self.id}: threshold {self.threshold} is outside (0, 1)")
        unknown = [t for t in self.tasks if t not in TASKS]
        if unknown:
            raise ValueError(f"claim {self.id}: unknown tasks {unknown}; registered: {sorted(TASKS)}")

    @property
    def paper(self) -> str:
        return "DP" if self.finding.paper == DP else "separations"


def dp(
    id: str, finding: str, tasks: tuple[str, ...], test: str, rule: Rule, *, paper_outcome: str, needs: str
) -> Claim:
    return Claim(id, FINDING[finding], TABLE2_THRESHOLD, TABLE2_SOURCE, tasks, test, paper_outcome, needs, rule)


def sep(
    id: str, finding: str, tasks: tuple[str, ...], test: str, rule: Rule, *, paper_outcome: str, needs: str
) -> Claim:
    return Claim(id, FINDING[finding], NEAR_PERFECT, NEAR_PERFECT_SOURCE, tasks, test, paper_outcome, needs, rule)


# where the papers decide their claims: the DP paper's grid, and the separations paper's trained on to near-perfect
PAPER_SCALE = "a GPU profile such as `paper`"
SEPARATIONS_SCALE = f"a GPU profile such as `separations`, trained to {NEAR_PERFECT:.0%}"
CLAIMS = (
    dp("dp_width_grows", "dp_efficient_grow", ("arithmetic", "ed", "lis"),
       "in most (task, sparse or linear, depth) chains the minimum width grows with n, more than standard's",
       width_grows(("arithmetic", "ed", "lis"), lambda d: True),
       paper_outcome="Figure 1 (3 layers): on arithmetic, ED and LIS the width sparse and linear need grows with the "
       "problem size; standard solves every size at width 128 or 256",
       needs="two sizes or more of arithmetic, ed or lis with standard, sparse and linear at one depth, solved above "
       "the narrowest width tried; the paper: 6-16 operators, ED n = 6-20, LIS n = 40-250, 3 layers, widths 32-1024: "
       + PAPER_SCALE),
    dp("dp_width_grows_deeper", "dp_five_layers", ("ed",),
       "as dp_width_grows, on ed at depth 5 (Figure 3)", width_grows(("ed",), lambda d: d >= 5),
       paper_outcome="Figure 3 (Appendix D): at 5 layers on ED the results are similar to those at 3 (Figure 1), "
       "where the width sparse and linear need grows with n",
       needs="two sizes or more of ed with standard and sparse or linear at depth 5, solved above the narrowest width "
       "tried; the paper: ED n = 6-20, widths 32-1024: " + PAPER_SCALE),
    dp("dp_no_savings_general", "dp_lis_general", ("lis",),
       "lis (the general DP task): at each n standard solves, sparse and linear need at least its exact forward "
       "GFLOPs", no_savings("lis"),
       paper_outcome="Figure 1, LIS (the task without locality): the Sparse Transformer reaches nearly 100% at no "
       "width tried, the Linear Transformer needs wider models than standard, and the growth with n is the most "
       "pronounced; the paper counts no FLOPs on LIS (Table 2 is arithmetic), so the FLOP comparison is ours",
       needs="lis at sizes standard solves, with sparse or linear at the same depth, solved above the narrowest width "
       "tried; the paper: LIS n = 40-250, 3 layers, widths 32-1024: " + PAPER_SCALE),
    dp("dp_locality", "dp_locality", ("ed", "ed_local"),
       "sparse and linear: minimum width strictly smaller on ed_local than on ed at the same n and depth",
       locality_reduces,
       paper_outcome="Figure 2: on ED_Local sparse and linear solve at smaller widths than on ED (Figure 1) at the "
       "same n: both benefit from locality",
       needs="ed and ed_local at a common n with sparse or linear, solved above the narrowest width tried; the paper: "
       "n = 6-20, 3 layers, widths 32-1024: " + PAPER_SCALE),
    dp("dp_arithmetic_standard_first", "dp_table2", ("arithmetic",),
       "arithmetic: minimum width standard < sparse < linear at each n and depth (Table 2's order)", table2_order,
       paper_outcome=table2_in_words(),
       needs="arithmetic with standard, sparse and linear at one depth, solved above the narrowest width tried; the "
       "paper: 6-16 operators, 3 layers, widths 32-512: " + PAPER_SCALE),
    sep("sep_index_lookup_one_layer", "sep_index_lookup", ("index_lookup",),
        "a 1-layer transformer of width 64 near-perfect at every index_lookup length",
        near_perfect("index_lookup", [Models("transformer", (1,), 64)]),
        paper_outcome="Figure 2 (left, middle): a 1-layer Transformer of width 64 near-perfect at every N = 20-400, "
        "within a few thousand steps",
        needs="index_lookup with a 1-layer transformer of width 64; the paper: N = 20-400: " + SEPARATIONS_SCALE),
    sep("sep_index_lookup_recurrent_fail", "sep_index_lookup", ("index_lookup",),
        "LSTM, DSS, Mamba, linear Transformer and RetNet below near-perfect at N > 100, where the 1-layer "
        "transformer (the control) reaches it", fail_with_control("index_lookup", RECURRENT, [TF1], 100),
        paper_outcome="Figure 2 (left, middle): LSTM, DSS, Mamba, linear Transformer and RetNet, up to 6 layers and "
        "width 256, degrade beyond N = 100 where the 1-layer Transformer of width 64 is near-perfect; Figure 3: Mamba "
        "gains with width yet at 1024 stays far below it, and the LSTM stays at chance beyond N = 100 at any width",
        needs="index_lookup beyond N = 100 with the five recurrent models and the 1-layer transformer as control; the "
        "paper: N = 200 and 400, recurrent models up to 6 layers and width 256: " + SEPARATIONS_SCALE),
    sep("sep_dyck_small_models", "sep_dyck", ("dyck",),
        "LSTM, 2-layer transformer and Mamba of width 64 near-perfect at every dyck length up to 400",
        near_perfect("dyck", [Models("lstm", width=64), Models("transformer", (2,), 64), Models("mamba", width=64)],
                     400),
        paper_outcome="Figure 2 (right): the LSTM and Mamba of hidden size 64 and a 2-layer Transformer of width 64 "
        "near-perfect at every N up to 400",
        needs="dyck with the LSTM, the 2-layer transformer and Mamba at width 64; the paper: N = 20-400: "
        + SEPARATIONS_SCALE),
    sep("sep_dyck_one_layer_struggles", "sep_dyck_one_layer", ("dyck",),
        "1-layer transformer below near-perfect at N > 100, where the LSTM or the 2-layer transformer reaches it",
        fail_with_control("dyck", [TF1], [Models("lstm"), TF2], 100),
        paper_outcome="Figure 2 (right): a 1-layer Transformer of width 256 near-perfect up to N = 100, not beyond, "
        "where the small recurrent models and the 2-layer Transformer are",
        needs="dyck beyond N = 100 with the 1-layer transformer, and the LSTM or the 2-layer transformer as control; "
        "the paper: N up to 400, the 1-layer transformer at width 256: " + SEPARATIONS_SCALE),
    sep("sep_eq_random_recurrent_fail", "sep_eq_random", ("eq_random",),
        "LSTM and linear Transformer below near-perfect at N > 100, where a transformer reaches it",
        fail_with_control("eq_random", [Models("lstm"), Models("linear_nofm")], [Models("transformer")], 100),
        paper_outcome="Figure 4 (left): Transformers near-perfect up to N = 400; the LSTM and the linear Transformer "
        "struggle beyond N = 100",
        needs="eq_random beyond N = 100 with the LSTM, the linear transformer, and a transformer as control; the "
        "paper: N up to 400: " + SEPARATIONS_SCALE),
    sep("sep_eq_random_ssm_match", "sep_eq_random_ssm", ("eq_random",),
        "DSS and Mamba near-perfect at every eq_random length a transformer is",
        matches("eq_random", [Models("dss"), Models("mamba")], Models("transformer")),
        paper_outcome="Figure 4 (left): DSS and Mamba match the Transformers, near-perfect up to N = 400",
        needs="eq_random at a length a transformer solves, with DSS and Mamba; the paper: N up to 400: "
        + SEPARATIONS_SCALE),
    sep("sep_eq_one_all_models", "sep_eq_one", ("eq_one",),
        "every architecture run (at least the transformer and the LSTM) near-perfect on eq_one up to N = 400",
        near_perfect("eq_one", [Models("transformer"), Models("lstm")], 400),
        paper_outcome="Figure 4: on Eq-one every model near-perfect up to N = 400",
        needs="eq_one with the transformer and the LSTM; the paper: every architecture, N up to 400: "
        + SEPARATIONS_SCALE),
    sep("sep_eq_ncp_ssm_width_64", "sep_eq_ncp", ("eq_ncp",),
        "DSS and Mamba of width 64 within 5 points of chance (0%) at N > 400, where a transformer of width 64 is "
        "near-perfect",
        fail_with_control("eq_ncp", [Models("dss", width=64), Models("mamba", width=64)],
                          [Models("transformer", width=64)], 400, chance=0.0),
        paper_outcome="Figure 4: at width 64, DSS and Mamba no better than chance beyond N = 400, where Transformers "
        "of width 64 are near-perfect; a wider DSS solves up to N = 800",
        needs="eq_ncp beyond N = 400 with DSS and Mamba at width 64, and a transformer of width 64 as control; the "
        "paper: N = 800: " + SEPARATIONS_SCALE),
)  # fmt: skip


def undecided_check(undecided: dict[str, str]) -> ClaimCheck:
    """Not tested: the check depends on these undecided cells (cell -> reason); the first few named."""
    named = [f"{cell} undecided ({reason})" for cell, reason in list(undecided.items())[:SHOWN_UNDECIDED]]
    more = len(undecided) - len(named)
    return ClaimCheck(ClaimStatus.NOT_TESTED, "; ".join(named) + (f"; and {more} more undecided cells" if more else ""))


def evaluate(table: pd.DataFrame, claims: Iterable[Claim] = CLAIMS, swept_at: float = TABLE2_THRESHOLD) -> list[dict]:
    """Every claim's check on ``table`` (results/sweep.csv, its verdicts at ``swept_at``: the sweep's threshold),
    read at the claim's threshold, as rows for the page, report.json and MLflow; a check that depends on an
    undecided cell is not tested."""
    views: dict[float, Evidence] = {}
    rows = []
    for claim in claims:
        if claim.threshold not in views:
            views[claim.threshold] = Evidence(at_threshold(table, claim.threshold, swept_at))
        ev = views[claim.threshold]
        ev.undecided = {}
        check = claim.rule(ev, claim.threshold)
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
                "claim": claim.finding.quote,
                "where": claim.finding.where,
                "threshold": claim.threshold,
                "threshold_source": claim.source,
                "decided_by": claim.test,
                "paper_outcome": claim.paper_outcome,
                "needs": claim.needs,
                "status": check.status,
                "detail": detail,
            }
        )
    return rows
