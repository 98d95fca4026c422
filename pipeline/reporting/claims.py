"""The two papers' claims, each as the paper states it, and their check on a results table.

A ``Claim`` carries the paper's words and where it says them (``pipeline.reporting.findings``), the accuracy the paper
calls solved (Table 2: "above 90%"; the separations paper: "near-perfect", read as 99%), its ``Scope`` (the tasks,
sizes and models the paper decides it at: what its coverage counts), the paper's own outcome (its numbers where it
gives them, its words where not), what deciding it needs, and a rule (``pipeline.reporting.rules``) that returns the
claim's cases, each read one way (``Reading``: held, missed, undecided, not run; fails uncontrolled; tells nothing).
``judge`` turns the cases into a ``ClaimCheck``:

- *fails*: a case missed (with "generally" or "in most scenarios", ``most``: as many missed as held). A claim that a
  model is near-perfect fails on that model's own converged miss, with no control needed;
- *holds*: cases held and none missed, covering the whole scope at the paper's widths;
- *holds in part*: cases held and none missed, covering part of the scope (its ``Coverage`` says which lengths,
  models and widths of the paper's read which way);
- *fails, uncontrolled*: nothing held or missed, but a model the paper says fails did, where no control (another
  model, or the same one at a shorter length) reached the line: our recipe is not shown to learn the task there;
- *undecided*: nothing held or missed, some case rests on a cell with no verdict yet (still improving, diverged,
  failed);
- *not tested*: nothing ran that the claim reads, or the grid tells nothing, each with why.

A case at a size outside the range of the paper's sizes for its task (lis at n = 4, where the paper ran 40-250)
decides nothing: a claim is made at the paper's lengths. Where the paper words a claim two ways ("within each
subplot", "in most scenarios"), the verdict under the other wording is given beside (``Claim.other``).

Every claim is read at its own threshold and, for its sensitivity, at ``SENSITIVITY``'s (``tables.at_threshold``: a
trial that stopped short of a threshold without having converged is undecided there), and carries what it rests on
(``Basis``: the steps trained and whether converged, the learning rates, the seeds). ``evaluate`` returns one typed
``ClaimVerdict`` per claim; ``ClaimVerdict.row`` is its form for the page, ``results/report.json`` and MLflow. Every
measured statement of the papers is checked by a claim or listed in ``UNCHECKED`` with why (``check_claims`` refuses,
when the report loads, a claim whose quote is not verbatim in its paper's text, whose rule names a model or task the
registries do not know, or whose threshold is outside (0, 1]). ``tests/test_claims_papers.py`` runs every rule on the
papers' own results, which must hold, and on their opposites, which must not."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import pandas as pd

from pipeline.reporting.evidence import Evidence, Models, Reading
from pipeline.reporting.findings import DP, FINDINGS, Finding, table2_in_words, unquoted
from pipeline.reporting.rules import (
    CHANCE_MARGIN,
    DEGRADE_MARGIN,
    EFFICIENT,
    MATCH_MARGIN,
    AccuracyRises,
    Case,
    FailsSomewhere,
    LocalityReduces,
    Rule,
    StandardNarrower,
    StandardWithin,
    SteeperWithLessLocality,
    WidthGrows,
    all_of,
    degrades,
    matches,
    near_perfect,
    size_name,
)
from pipeline.reporting.tables import at_threshold
from tasks import TASKS
from tasks.papers import NEAR_PERFECT, TABLE2_THRESHOLD


class ClaimError(ValueError):
    """A claim the report cannot check as its paper states it: its quote, its rule's models or tasks, its threshold."""


class ClaimStatus(StrEnum):
    """A claim check's result, best first (a nightly run whose claim moves down the order regressed)."""

    HOLDS = "holds"
    HOLDS_IN_PART = "holds in part"
    UNCONTROLLED = "fails, uncontrolled"
    UNDECIDED = "undecided"
    NOT_TESTED = "not tested"
    FAILS = "fails"

    @property
    def rank(self) -> int:
        return list(ClaimStatus).index(self)

    @property
    def decided(self) -> bool:
        """A reading the page leads with: held, failed, or a failure our recipe does not control."""
        return self not in (ClaimStatus.UNDECIDED, ClaimStatus.NOT_TESTED)


NEAR_PERFECT_SOURCE = "the separations paper's 'near-perfect' (§6, App. H), read as 99%"
TABLE2_SOURCE = "DP paper, Table 2: 'an accuracy above 90%'"
NEARLY_100_SOURCE = "DP paper, §6.2: 'nearly 100% accuracy', read at Table 2's 90%, the line its trials train to"
SENSITIVITY = (0.95, 0.97, 0.99)  # each claim is also read at these thresholds
SHOWN_CASES = 6  # a check's detail names this many cases of a kind, then counts the rest

Point = tuple[str, int, str]  # (task, size, subject): one comparison the paper makes


@dataclass(frozen=True)
class Scope:
    """What the paper decides a claim at: its (task, size, subject) points, a subject being a model or an
    architecture whose widths the claim compares; a claim of parts adds their scopes."""

    points: tuple[Point, ...]

    def __add__(self, other: Scope) -> Scope:
        return Scope(tuple(dict.fromkeys(self.points + other.points)))

    @property
    def sizes(self) -> dict[str, tuple[int, ...]]:
        tasks = dict.fromkeys(t for t, _, _ in self.points)
        return {t: tuple(sorted({s for u, s, _ in self.points if u == t})) for t in tasks}

    @property
    def subjects(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(m for _, _, m in self.points))

    def covers(self, case: Case) -> bool:
        """The case's sizes lie within the paper's range for its task: a claim is made at the paper's lengths."""
        sizes = self.sizes.get(case.task, ())
        return bool(sizes) and all(sizes[0] <= s <= sizes[-1] for s in case.sizes)

    def outside(self, case: Case) -> Case:
        """``case`` as telling nothing: it lies outside the paper's sizes."""
        sizes = self.sizes.get(case.task, ())
        span = f"{sizes[0]}-{sizes[-1]}" if sizes else "none"
        text = f"{case.text} (outside the paper's {size_name(case.task)} = {span})"
        return Case(case.task, case.sizes, case.subject, Reading.SILENT, text, read=case.read)


def paper_sizes(task: str, above: int | None = None, upto: int | None = None) -> tuple[int, ...]:
    return tuple(s for s in TASKS[task].paper_sizes if (above is None or s > above) and (upto is None or s <= upto))


def scope(tasks: Iterable[str], subjects: Iterable[object], above: int | None = None, upto: int | None = None) -> Scope:
    """The paper's sizes of ``tasks`` in (above, upto], each with every one of ``subjects``."""
    named = [str(m) for m in subjects]
    return Scope(tuple((t, s, m) for t in tasks for s in paper_sizes(t, above, upto) for m in named))


READ_ORDER = (Reading.HELD, Reading.MISSED, Reading.UNCONTROLLED, Reading.UNDECIDED, Reading.NOT_RUN, Reading.SILENT)
# a point two cases read (two comparisons at one size, two models at one length) reads as the first of these
PRIORITY = (Reading.MISSED, Reading.UNDECIDED, Reading.UNCONTROLLED, Reading.HELD, Reading.SILENT, Reading.NOT_RUN)


@dataclass(frozen=True)
class Coverage:
    """How a claim's ``scope`` reads: each point of it that a case read, by reading (a point several cases read
    takes the first reading of ``PRIORITY`` among them), the sizes outside the paper's, and what a decided case
    lacked of the paper's setting (``short``)."""

    scope: Scope
    read: dict[Point, Reading]
    outside: frozenset[Point] = frozenset()
    short: tuple[str, ...] = ()

    @property
    def tested(self) -> frozenset[Point]:
        """The points of the scope a case decided (held or missed)."""
        return frozenset(p for p, r in self.read.items() if r.decided and p in self.scope.points)

    @property
    def full(self) -> bool:
        """Every point of the scope decided at the paper's setting (a verdict of holds has none of them missed, but
        for a claim worded "generally")."""
        return all(p in self.tested for p in self.scope.points) and not self.short

    @property
    def fraction(self) -> float:
        return len(self.tested) / len(self.scope.points)

    def text(self) -> str:
        """Per task, the paper's sizes by how they read ("N = 20, 50 held, 100 missed, 200 undecided, 400 not run of
        20-400"), the sizes between the paper's that were decided, then the models decided and what they lacked."""
        if not self.read and not self.outside:
            return "nothing of the paper's scope"
        parts = []
        for task, sizes in self.scope.sizes.items():
            mine = {s: self.reading_at(task, s) for s in sizes}
            groups = [
                f"{', '.join(str(s) for s, r in mine.items() if r == reading)} {reading}"
                for reading in READ_ORDER
                if any(r == reading for r in mine.values())
            ]
            between = sorted({s for (t, s, _), r in self.read.items() if t == task and s not in sizes and r.decided})
            text = f"{task} {size_name(task)} = {'; '.join(groups)} (of {', '.join(map(str, sizes))})"
            if between:
                text += f" (and {size_name(task)} = {', '.join(map(str, between))}, between the paper's)"
            parts.append(text)
        subjects = [m for m in self.scope.subjects if any(p[2] == m for p in self.tested)]
        parts.append(f"{len(subjects)} of {len(self.scope.subjects)} models decided ({', '.join(subjects) or 'none'})")
        return "; ".join(parts + list(dict.fromkeys(self.short)))

    def reading_at(self, task: str, size: int) -> Reading:
        """How (task, size) reads over the scope's subjects: the first reading of ``PRIORITY`` among them (not run
        where no case read one)."""
        points = [(task, size, m) for m in self.scope.subjects if (task, size, m) in self.scope.points]
        found = {self.read.get(p, Reading.NOT_RUN) for p in points}
        return next(r for r in PRIORITY if r in found)

    def by_reading(self) -> dict[str, list[str]]:
        """reading -> the scope's points that read so ("index_lookup N=100 1-layer transformer D=64"), for JSON."""
        out: dict[str, list[str]] = {str(r): [] for r in READ_ORDER}
        for task, size, subject in self.scope.points:
            reading = self.read.get((task, size, subject), Reading.NOT_RUN)
            out[str(reading)].append(f"{task} {size_name(task)}={size} {subject}")
        return out


@dataclass(frozen=True)
class ClaimCheck:
    status: ClaimStatus
    detail: str
    coverage: Coverage
    margins: tuple[float, ...] = ()  # the decided cases' margins past the claim's line (positive: the paper's side)
    cases: tuple[Case, ...] = field(default=(), repr=False)


def listed(cases: Sequence[Case]) -> str:
    """The cases' texts, the first few, then a count: the sizes a model was not run at gathered per model and task,
    and one reason given for several subjects once, after all of them (``gathered``)."""
    absent: dict[tuple[str, str], list[int]] = {}
    for c in cases:
        if c.reading == Reading.NOT_RUN:
            absent.setdefault((c.subject, c.task), []).extend(c.sizes)
    texts = gathered([c.text for c in cases if c.reading != Reading.NOT_RUN])
    texts += gathered(
        [
            f"{subject}: not run on {task} at {size_name(task)} = {', '.join(map(str, sizes))}"
            for (subject, task), sizes in absent.items()
        ]
    )
    shown = texts[:SHOWN_CASES]
    more = len(texts) - len(shown)
    return "; ".join(shown) + (f"; and {more} more" if more else "")


def gathered(texts: Sequence[str]) -> list[str]:
    """Each text once, and texts that give one reason for several subjects ("lis d3 sparse: needs two sizes ...",
    "lis d3 linear: needs two sizes ...") as one ("lis d3 sparse, lis d3 linear: needs two sizes ..."), in the order
    the reasons first come."""
    subjects: dict[str, list[str]] = {}  # reason -> its subjects ('' where a text names none)
    for text in texts:
        subject, colon, reason = text.partition(": ")
        subjects.setdefault(reason if colon else text, [])
        if colon and subject not in subjects[reason]:
            subjects[reason].append(subject)
    return [f"{', '.join(names)}: {reason}" if names else reason for reason, names in subjects.items()]


CASE_WORDS = {
    Reading.MISSED: "against",
    Reading.HELD: "for",
    Reading.UNCONTROLLED: "fails, uncontrolled",
    Reading.UNDECIDED: "undecided",
    Reading.NOT_RUN: "not run",
    Reading.SILENT: "tells nothing",
}


def judge(cases: Sequence[Case], claim_scope: Scope, most: bool = False) -> ClaimCheck:
    """The verdict of ``cases`` on ``claim_scope``: see the module's docstring. ``most``: the claim says
    "generally", so it fails only when as many cases missed as held. A case outside the paper's sizes tells
    nothing, and a model not run there is no gap: the claim is not made there."""
    cases = [
        c if claim_scope.covers(c) else claim_scope.outside(c)
        for c in cases
        if c.reading != Reading.NOT_RUN or claim_scope.covers(c)
    ]
    by = {r: [c for c in cases if c.reading == r] for r in READ_ORDER}
    held, missed = by[Reading.HELD], by[Reading.MISSED]
    read: dict[Point, Reading] = {}
    outside = set()
    for c in cases:
        for s in c.sizes:
            point = (c.task, s, c.subject)
            if c.reading == Reading.SILENT and not claim_scope.covers(c):
                outside.add(point)
                continue
            if point not in read or PRIORITY.index(c.reading) < PRIORITY.index(read[point]):
                read[point] = c.reading
    decided = held + missed
    coverage = Coverage(claim_scope, read, frozenset(outside), tuple(c.short_of for c in decided if c.short_of))
    margins = tuple(c.margin for c in decided if c.margin is not None)
    against = (len(missed) >= len(held)) if most else bool(missed)
    if decided and against:
        status = ClaimStatus.FAILS
    elif held:
        status = ClaimStatus.HOLDS if coverage.full else ClaimStatus.HOLDS_IN_PART
    elif by[Reading.UNCONTROLLED]:
        status = ClaimStatus.UNCONTROLLED
    elif by[Reading.UNDECIDED]:
        status = ClaimStatus.UNDECIDED
    else:
        status = ClaimStatus.NOT_TESTED
    parts = [f"{CASE_WORDS[r]} ({len(by[r])}): {listed(by[r])}" for r in CASE_WORDS if by[r]]
    detail = ". ".join(parts) or "no case: nothing the claim names was run"
    return ClaimCheck(status, detail, coverage, margins, tuple(cases))


@dataclass(frozen=True)
class Other:
    """The paper's other wording of a claim ("in most scenarios" beside "within each subplot"), read with
    ``most`` as that wording says."""

    finding: str
    most: bool


@dataclass(frozen=True)
class Claim:
    """One claim of a paper: ``finding`` (its words and where), the ``threshold`` it reads (with ``source``), the
    ``tasks`` it is about and what our ``test`` of it reads (one sentence: the rule's reading), its ``scope``, the
    paper's own outcome (``paper_outcome``, naming its figure or table, with its numbers where it gives them), what
    deciding it ``needs``, the ``rule``, ``most`` for a claim the paper words "generally", ``other``: the paper's
    other wording of it, whose verdict is given beside, and ``also``: other passages of the papers it checks."""

    id: str
    finding: Finding
    threshold: float
    source: str
    tasks: tuple[str, ...]
    test: str
    scope: Scope
    paper_outcome: str
    needs: str
    rule: Rule = field(repr=False)
    most: bool = False
    other: Other | None = None
    also: tuple[str, ...] = ()

    def __post_init__(self):
        if not 0 < self.threshold <= 1:
            raise ClaimError(f"claim {self.id}: threshold {self.threshold} is outside (0, 1]")
        unknown = [t for t in {*self.tasks, *self.scope.sizes} if t not in TASKS]
        if unknown:
            raise ClaimError(f"claim {self.id}: unknown tasks {sorted(unknown)}; registered: {sorted(TASKS)}")
        if not self.scope.points:
            raise ClaimError(f"claim {self.id}: its scope names no size of the paper's")

    @property
    def paper(self) -> str:
        return "DP" if self.finding.paper == DP else "separations"

    def check(self, ev: Evidence, most: bool | None = None) -> ClaimCheck:
        return judge(self.rule(ev), self.scope, self.most if most is None else most)


FINDING = {f.id: f for f in FINDINGS}


def dp(id: str, finding: str, tasks: tuple[str, ...], test: str, rule: Rule, claim_scope: Scope, **kw) -> Claim:
    return Claim(id, FINDING[finding], TABLE2_THRESHOLD, TABLE2_SOURCE, tasks, test, claim_scope, rule=rule, **kw)


def sep(id: str, finding: str, tasks: tuple[str, ...], test: str, rule: Rule, claim_scope: Scope, **kw) -> Claim:
    return Claim(id, FINDING[finding], NEAR_PERFECT, NEAR_PERFECT_SOURCE, tasks, test, claim_scope, rule=rule, **kw)


# what the claims name: the DP paper's three tasks of Figure 1 at its 3 layers; the separations paper's models
FIGURE1 = ("arithmetic", "ed", "lis")
LAYERS, DEEPER = 3, 5  # §6.1: 3 layers; Appendix D: 5 layers on ED (Figure 3)
DP_MODELS = ("standard", *EFFICIENT)
TF1, TF2 = Models("transformer", (1,), 64), Models("transformer", (2,), 64)
# §6: "recurrent models with up to 6 layers and widths or hidden state size of 256"; the five it names
RECURRENT = tuple(Models(a, max_width=256, max_depth=6) for a in ("lstm", "dss", "mamba", "linear_nofm", "retnet"))
TUNED = 512  # App. H: widths tuned over {64, 128, 256, 512}
ALL_MODELS = ("transformer", "lstm", "dss", "mamba", "linear_nofm", "retnet")  # the separations paper's six
DYCK_SMALL = (Models("lstm", width=64), TF2, Models("mamba", width=64))  # §6: "hidden state sizes of 64"
TF1_WIDE = Models("transformer", (1,), 256)  # §6: "a one-layer Transformer with a width of 256"
TF1_UPTO = Models("transformer", (1,), max_width=256)
EQ_RNN = (Models("lstm", max_width=TUNED), Models("linear_nofm", max_width=TUNED))
SSM = (Models("dss"), Models("mamba"))
NCP_SSM = (Models("dss", width=64), Models("mamba", width=64))  # App. H.2: "the width of the models is 64"
MAMBA_FIG3 = Models("mamba", (2,))  # App. H.1: "two-layer models of different widths {32, 64, 256, 512, 1024}"
LOOKUP_CHANCE = 1 / 64  # |Sigma| = 64 symbols
PAPER_SCALE = "a GPU profile such as `paper-faithful`"
SEPARATIONS_SCALE = f"a GPU profile such as `separations`, trained to {NEAR_PERFECT:.0%}"
BELOW = f"at least {DEGRADE_MARGIN:.0%} points below"
CLAIMS = (
    dp("dp_width_grows", "dp_efficient_grow", FIGURE1,
       "per task and efficient architecture (sparse, linear) at 3 layers, the paper's sizes only: the minimum width "
       "never shrinks as n grows and is wider at the largest n than at the smallest, in every one of the six chains "
       "('within each subplot')",
       WidthGrows(FIGURE1, LAYERS), scope(FIGURE1, EFFICIENT),
       other=Other("dp_most_scenarios", most=True), also=("dp_figure1",),
       paper_outcome="Figure 1 (3 layers): on arithmetic, ED and LIS the width sparse and linear need grows with n; "
       "Table 2's arithmetic widths: sparse 128/256/256/256, linear 256/512/512/512 at 6/10/13/16 operators",
       needs="two sizes or more of arithmetic, ed or lis with sparse or linear at 3 layers, solved above the "
       "narrowest width tried; the paper: 6-16 operators, ED n = 6-20, LIS n = 40-250, widths 32-1024: "
       + PAPER_SCALE),
    dp("dp_width_grows_deeper", "dp_five_layers", ("ed",),
       "as dp_width_grows, on ed at 5 layers (Figure 3)", WidthGrows(("ed",), DEEPER), scope(["ed"], EFFICIENT),
       paper_outcome="Figure 3 (Appendix D): at 5 layers on ED the results are similar to those at 3 (Figure 1), "
       "where the width sparse and linear need grows with n",
       needs="two sizes or more of ed with sparse or linear at 5 layers, solved above the narrowest width tried; the "
       "paper: ED n = 6-20, widths 32-1024: " + PAPER_SCALE),
    dp("dp_efficient_wider", "dp_efficient_wider", FIGURE1,
       "at each (task, n) at 3 layers, sparse and linear each need a strictly wider model than standard, in most "
       "cases ('generally': it fails only with as many cases against as for)",
       StandardNarrower(FIGURE1, LAYERS), scope(FIGURE1, EFFICIENT), most=True, also=("dp_figure1",),
       paper_outcome="Figure 1 (3 layers): efficient Transformers generally need larger widths than standard; Table "
       "2's arithmetic widths: standard 64/128/128/128, sparse 128/256/256/256, linear 256/512/512/512",
       needs="arithmetic, ed or lis with standard and sparse or linear at 3 layers, solved above the narrowest width "
       "tried; the paper: its Figure 1 grid: " + PAPER_SCALE),
    dp("dp_standard_fixed", "dp_standard_fixed", FIGURE1,
       "at each (task, n) at 3 layers, standard solves at a width of 256 or less; converged below the line at every "
       "width up to 256 refutes it",
       StandardWithin(FIGURE1, LAYERS, 256), scope(FIGURE1, ["standard"]),
       paper_outcome="Figure 1 (3 layers): standard solves every size at width 128 or 256; Table 2's arithmetic "
       "widths: standard 64/128/128/128",
       needs="arithmetic, ed or lis with standard at 3 layers up to width 256 at least; the paper: its Figure 1 "
       "grid: " + PAPER_SCALE),
    dp("dp_nearly_perfect", "dp_lis_sparse", FIGURE1,
       "at each (task, n) at 3 layers, standard, sparse and linear each reach the line at some width, but for "
       "sparse on lis, which at some n converges below it at every width where standard or linear reaches it",
       all_of(*(near_perfect(t, [Models(a, (LAYERS,))]) for t in FIGURE1 for a in DP_MODELS
                if (t, a) != ("lis", "sparse")),
              FailsSomewhere("lis", Models("sparse", (LAYERS,)), (Models("standard", (LAYERS,)),
                                                                  Models("linear", (LAYERS,))))),
       scope(["arithmetic", "ed", "lis"], [Models(a, (LAYERS,)) for a in DP_MODELS]),
       paper_outcome="Figure 1 (3 layers): every model reaches nearly 100% at a large enough width on every task and "
       "size, but the Sparse Transformer on LIS",
       needs="arithmetic, ed and lis with standard, sparse and linear at 3 layers, wide enough to solve; the paper: "
       "widths up to 1024: " + PAPER_SCALE),
    dp("dp_lis_sparse_grows", "dp_lis_sparse_grows", ("lis",),
       "sparse on lis at 3 layers: at each n its test accuracy never falls by more than 2 points from a narrower "
       "width to a wider one, and is higher at the widest than at the narrowest",
       AccuracyRises("lis", Models("sparse", (LAYERS,))), scope(["lis"], [Models("sparse", (LAYERS,))]),
       paper_outcome="Figure 1 (3 layers): the Sparse Transformer's accuracy on LIS rises with the width at every n",
       needs="lis with sparse at 3 layers at two widths or more; the paper: LIS n = 40-250, widths 32-1024: "
       + PAPER_SCALE),
    dp("dp_less_locality", "dp_less_locality", FIGURE1,
       "per efficient architecture at 3 layers: its minimum width doubles more times from the paper's smallest n to "
       "its largest on lis (no locality) than on ed and on arithmetic (locality)",
       SteeperWithLessLocality("lis", ("ed", "arithmetic"), LAYERS), scope(["lis"], EFFICIENT),
       also=("dp_lis_steeper",),
       paper_outcome="Figure 1 (3 layers): within each row the width the efficient models need grows fastest on LIS; "
       "§1: more pronounced in LIS than in ED",
       needs="lis and ed or arithmetic with sparse or linear at 3 layers, each at two sizes or more, solved at the "
       "smallest; the paper: its Figure 1 grid: " + PAPER_SCALE),
    dp("dp_locality", "dp_locality", ("ed", "ed_local"),
       "per efficient architecture at 3 layers: the minimum width on ed_local at most ed's at every n both ran, and "
       "smaller at one n at least", LocalityReduces(LAYERS), scope(["ed_local"], EFFICIENT), also=("dp_figure2",),
       paper_outcome="Figure 2: on ED_Local sparse and linear solve at smaller widths than on ED (Figure 1): both "
       "benefit from locality",
       needs="ed and ed_local at a common n with sparse or linear at 3 layers, solved above the narrowest width "
       "tried; the paper: n = 6-20, widths 32-1024: " + PAPER_SCALE),
    dp("dp_arithmetic_standard_first", "dp_table2", ("arithmetic",),
       "arithmetic at 3 layers: at each n standard's minimum width (so its paper-convention FLOPs) strictly below "
       "sparse's and linear's", StandardNarrower(("arithmetic",), LAYERS), scope(["arithmetic"], EFFICIENT),
       paper_outcome=table2_in_words(),
       needs="arithmetic with standard and sparse or linear at 3 layers, solved above the narrowest width tried; the "
       "paper: 6-16 operators, widths 32-512: " + PAPER_SCALE),
    sep("sep_index_lookup_one_layer", "sep_index_lookup", ("index_lookup",),
        "a 1-layer transformer of width 64 near-perfect at every index_lookup length; its own converged miss at a "
        "length refutes it",
        near_perfect("index_lookup", [TF1]), scope(["index_lookup"], [TF1]),
        paper_outcome="Figure 2 (left, middle): a 1-layer Transformer of width 64 near-perfect at every N = 20-400, "
        "within a few thousand steps",
        needs="index_lookup with a 1-layer transformer of width 64; the paper: N = 20-400: " + SEPARATIONS_SCALE),
    sep("sep_index_lookup_recurrent_fail", "sep_index_lookup", ("index_lookup",),
        f"at each N > 100, each of LSTM, DSS, Mamba, linear Transformer and RetNet (up to 6 layers, width up to 256) "
        f"{BELOW} the 1-layer transformer of width 64 where it reaches near-perfect (the control), or below "
        "near-perfect less 5 points where the model itself reached it at a shorter N",
        degrades("index_lookup", RECURRENT, [TF1], 100, paper_width=256), scope(["index_lookup"], RECURRENT, 100),
        paper_outcome="Figure 2 (left, middle): LSTM, DSS, Mamba, linear Transformer and RetNet, up to 6 layers and "
        "width 256, degrade beyond N = 100 where the 1-layer Transformer of width 64 is near-perfect; Figure 3: Mamba "
        "gains with width yet at 1024 stays far below it, and the LSTM stays at chance beyond N = 100 at any width",
        needs="index_lookup at N = 200 and 400 with all five recurrent models and the 1-layer transformer as control; "
        "the paper: recurrent models up to 6 layers and width 256: " + SEPARATIONS_SCALE),
    sep("sep_index_lookup_lstm_chance", "sep_lstm_width", ("index_lookup",),
        f"at each N > 100, the LSTM at every width within {CHANCE_MARGIN:.0%} points of chance (1/64), where a control "
        "(the 1-layer transformer of width 64, or the LSTM at a shorter N) reached near-perfect",
        degrades("index_lookup", [Models("lstm")], [TF1], 100, chance=LOOKUP_CHANCE),
        scope(["index_lookup"], [Models("lstm")], 100),
        paper_outcome="Appendix H.1: the LSTM stays at chance beyond N = 100 even as its width grows",
        needs="index_lookup at N = 200 and 400 with the LSTM at several widths, and the 1-layer transformer as "
        "control: " + SEPARATIONS_SCALE),
    sep("sep_mamba_width_trend", "sep_mamba_width", ("index_lookup",),
        "2-layer Mamba on index_lookup: at each N its test accuracy never falls by more than 2 points from a narrower "
        "width to a wider one, and is higher at the widest than at the narrowest (every width near-perfect tells "
        "nothing)",
        AccuracyRises("index_lookup", MAMBA_FIG3), scope(["index_lookup"], [MAMBA_FIG3]),
        paper_outcome="Figure 3 (Appendix H.1): 2-layer Mamba of widths 32-1024 gains accuracy with width at every N",
        needs="index_lookup with 2-layer Mamba at two widths or more (the paper: 32, 64, 256, 512, 1024), N = 20-400: "
        + SEPARATIONS_SCALE),
    sep("sep_mamba_wide_below_transformer", "sep_mamba_below_transformer", ("index_lookup",),
        f"at each N > 100, 2-layer Mamba of width 1024 {BELOW} the 1-layer transformer of width 64 where it reaches "
        "near-perfect (the control)",
        degrades("index_lookup", [Models("mamba", (2,), 1024)], [TF1], 100),
        scope(["index_lookup"], [Models("mamba", (2,), 1024)], 100),
        paper_outcome="Figure 3 (Appendix H.1): even at width 1024 Mamba stays far below the 1-layer Transformer of "
        "width 64 at the longer lengths",
        needs="index_lookup at N = 200 and 400 with 2-layer Mamba of width 1024 and the 1-layer transformer as "
        "control: " + SEPARATIONS_SCALE),
    sep("sep_dyck_small_models", "sep_dyck", ("dyck",),
        "LSTM, 2-layer transformer and Mamba of width 64 near-perfect at every dyck length up to 400; a model's own "
        "converged miss refutes it",
        near_perfect("dyck", DYCK_SMALL, upto=400),
        scope(["dyck"], DYCK_SMALL, upto=400),
        paper_outcome="Figure 2 (right): the LSTM and Mamba of hidden size 64 and a 2-layer Transformer of width 64 "
        "near-perfect at every N up to 400",
        needs="dyck with the LSTM, the 2-layer transformer and Mamba at width 64; the paper: N = 20-400: "
        + SEPARATIONS_SCALE),
    sep("sep_dyck_one_layer_struggles", "sep_dyck_one_layer", ("dyck",),
        f"a 1-layer transformer of width 256 near-perfect up to N = 100, and beyond it (width up to 256) {BELOW} the "
        "LSTM or the 2-layer transformer of width 64 where they reach near-perfect (the controls), or below "
        "near-perfect less 5 points where it reached it at a shorter N",
        all_of(near_perfect("dyck", [TF1_WIDE], upto=100),
               degrades("dyck", [TF1_UPTO], [Models("lstm", width=64), TF2], 100, paper_width=256)),
        scope(["dyck"], [TF1_WIDE], upto=100) + scope(["dyck"], [TF1_UPTO], 100),
        paper_outcome="Figure 2 (right): a 1-layer Transformer of width 256 near-perfect up to N = 100, not beyond, "
        "where the small recurrent models and the 2-layer Transformer are",
        needs="dyck at N = 20-400 with the 1-layer transformer at width 256, and the LSTM or the 2-layer transformer "
        "as control: " + SEPARATIONS_SCALE),
    sep("sep_eq_transformers", "sep_eq_transformers", ("eq_random", "eq_one"),
        "a transformer (any width and depth the grid ran) near-perfect on eq_random and eq_one at every length up to "
        "400; its converged miss refutes it",
        all_of(near_perfect("eq_random", [Models("transformer")], upto=400),
               near_perfect("eq_one", [Models("transformer")], upto=400)),
        scope(["eq_random", "eq_one"], [Models("transformer")], upto=400),
        paper_outcome="Figure 4 (left): Transformers near-perfect on Eq-random and Eq-one up to N = 400",
        needs="eq_random and eq_one at N = 20-400 with a transformer: " + SEPARATIONS_SCALE),
    sep("sep_eq_random_recurrent_fail", "sep_eq_random", ("eq_random",),
        f"at each N > 100, the LSTM and the linear Transformer {BELOW} a transformer that reaches near-perfect (the "
        "control), or below near-perfect less 5 points where the model itself reached it at a shorter N",
        degrades("eq_random", EQ_RNN, [Models("transformer", max_width=TUNED)], 100),
        scope(["eq_random"], EQ_RNN, 100),
        paper_outcome="Figure 4 (left): Transformers near-perfect up to N = 400; the LSTM and the linear Transformer "
        "struggle beyond N = 100",
        needs="eq_random at N = 200 and 400 with the LSTM, the linear transformer, and a transformer as control; the "
        "paper: widths up to 512: " + SEPARATIONS_SCALE),
    sep("sep_eq_random_ssm_match", "sep_eq_random_ssm", ("eq_random", "eq_one"),
        f"on eq_random and eq_one, DSS and Mamba less than {MATCH_MARGIN:.0%} points below the best transformer at "
        "every length both ran, whatever the threshold (whether each reached near-perfect is said beside)",
        matches(("eq_random", "eq_one"), SSM, Models("transformer")),
        scope(["eq_random", "eq_one"], SSM),
        paper_outcome="Figure 4 (left): DSS and Mamba match the Transformers on Eq-random and Eq-one, near-perfect up "
        "to N = 400",
        needs="eq_random and eq_one at the paper's lengths with DSS, Mamba and a transformer: " + SEPARATIONS_SCALE),
    sep("sep_eq_one_all_models", "sep_eq_one", ("eq_one",),
        "every one of the six architectures near-perfect on eq_one at every length up to 400; one model's converged "
        "miss refutes it",
        near_perfect("eq_one", [Models(a) for a in ALL_MODELS], upto=400), scope(["eq_one"], ALL_MODELS, upto=400),
        paper_outcome="Figure 4: on Eq-one every model near-perfect up to N = 400",
        needs="eq_one with all six architectures; the paper: N up to 400: " + SEPARATIONS_SCALE),
    sep("sep_eq_ncp_ssm_width_64", "sep_eq_ncp", ("eq_ncp",),
        f"at each N > 400, DSS and Mamba of width 64 within {CHANCE_MARGIN:.0%} points of chance (0%), where a "
        "transformer of width 64, or the model itself at a shorter N, reached near-perfect (the control)",
        degrades("eq_ncp", NCP_SSM, [Models("transformer", width=64)], 400, chance=0.0),
        scope(["eq_ncp"], NCP_SSM, 400),
        paper_outcome="Figure 4: at width 64, DSS and Mamba no better than chance beyond N = 400, where Transformers "
        "of width 64 are near-perfect; a wider DSS solves up to N = 800",
        needs="eq_ncp at N = 800 with DSS and Mamba at width 64, and a transformer of width 64 as control: "
        + SEPARATIONS_SCALE),
    sep("sep_eq_ncp_transformers", "sep_eq_ncp_transformers", ("eq_ncp",),
        "a transformer of width 64 near-perfect on eq_ncp at every length up to 800; its converged miss refutes it",
        near_perfect("eq_ncp", [Models("transformer", width=64)]), scope(["eq_ncp"], [Models("transformer", width=64)]),
        also=("sep_eq_ncp_wide",),
        paper_outcome="Figure 4: Transformers of width 64 near-perfect on Eq-ncp at every N up to 800",
        needs="eq_ncp at N = 20-800 with a transformer of width 64: " + SEPARATIONS_SCALE),
    sep("sep_eq_ncp_dss_wide", "sep_eq_ncp_dss_wide", ("eq_ncp",),
        "DSS wider than 64 near-perfect on eq_ncp at every length up to 800; its converged miss refutes it",
        near_perfect("eq_ncp", [Models("dss", min_width=128)]), scope(["eq_ncp"], [Models("dss", min_width=128)]),
        also=("sep_eq_ncp_wide",),
        paper_outcome="Figure 4: DSS of larger widths solves Eq-ncp up to N = 800",
        needs="eq_ncp at N = 20-800 with DSS of width 128 or more: " + SEPARATIONS_SCALE),
)  # fmt: skip


@dataclass(frozen=True)
class Unchecked:
    """A measured statement of a paper no claim checks, and why."""

    finding: Finding
    why: str


UNCHECKED = (
    Unchecked(
        FINDING["sep_learning_rates"],
        "a statement about every learning rate a model was tried at: the claims read a cell's best run; each rate's "
        "run is in results/trials.csv, and a profile with the paper's 7 rates (`separations`) shows it there",
    ),
    Unchecked(
        FINDING["sep_dyck_slower"],
        "a statement about learning speed, not accuracy: the report's learning curves (results/curves.csv) show each "
        "model's steps to the threshold, but no rule compares them",
    ),
)


def check_claims(claims: Sequence[Claim] = CLAIMS) -> None:
    """Refuses, naming it, a claim whose quote is not verbatim in its paper's text (where that text is at
    ``papers.papers_dir``), whose rule names an architecture the registry does not know, or whose threshold is
    outside (0, 1] (``Claim`` itself refuses a task the registry does not know)."""
    import models

    for claim in claims:
        if not 0 < claim.threshold <= 1:
            raise ClaimError(f"claim {claim.id}: threshold {claim.threshold} is outside (0, 1]")
        unknown = sorted({m.arch for m in claim.rule.models()} - set(models.ARCHITECTURES))
        if unknown:
            raise ClaimError(
                f"claim {claim.id}: its rule names architectures {unknown} the registry does not have; registered: "
                f"{', '.join(sorted(models.ARCHITECTURES))}"
            )
    quoted = {c.finding.id: c.finding for c in claims} | {u.finding.id: u.finding for u in UNCHECKED}
    missing = unquoted(tuple(quoted.values()))
    if missing:
        raise ClaimError(
            "not verbatim in the paper's text: "
            + "; ".join(f"{f.id} ({f.where}): \u201c{f.quote}\u201d" for f in missing)
        )


@dataclass(frozen=True)
class Basis:
    """What a claim's decided cases rest on, from the cells they read: the steps trained (range), how many seeds
    converged, the budget the trials had, the learning rates tried and kept, the seeds, and per size the steps at
    which the cells it read were solved (the separations paper's "within a few thousand steps")."""

    steps: str
    learning_rates: str
    seeds: str
    solved_at: str

    @classmethod
    def of(cls, table: pd.DataFrame, cases: Sequence[Case]) -> Basis:
        rests = (Reading.HELD, Reading.MISSED, Reading.UNCONTROLLED, Reading.UNDECIDED)
        keys = {k for c in cases if c.reading in rests for k in c.read}
        if not keys:
            return cls("", "", "", "")
        index = list(zip(table.task, table["size"], table.arch, table.width, table.depth))
        rows = table[[k in keys and bool(m) for k, m in zip(index, table.measured)]]
        if rows.empty:
            return cls("", "", "", "")
        steps = rows.get("train_steps", pd.Series(dtype=float)).dropna()
        converged = rows.get("converged", pd.Series(dtype=float)).fillna(0).astype(bool)
        budget = rows.get("budget_steps", pd.Series(dtype=float)).dropna()
        text = f"{int(steps.min()):,}-{int(steps.max()):,} steps" if len(steps) else "steps not recorded"
        text += f" ({int(converged.sum())} of {len(rows)} seeds converged"
        text += f"; budgets {int(budget.min()):,}-{int(budget.max()):,}, extensions in)" if len(budget) else ")"
        tried = sorted({float(x) for v in rows.get("lrs", pd.Series(dtype=str)).dropna() for x in str(v).split()})
        kept = sorted({float(x) for x in rows.get("lr", pd.Series(dtype=float)).dropna()})
        rates = ", ".join(f"{x:g}" for x in tried) or "not recorded"
        rates += f" (kept: {', '.join(f'{x:g}' for x in kept)})" if kept and tried and kept != tried else ""
        seeds = ", ".join(str(int(s)) for s in sorted(set(rows.seed)))
        solved = rows[rows.status == "solved"] if "solve_step" in rows else rows.iloc[:0]
        at = []
        for size, group in solved.groupby("size"):
            found = sorted(int(step) for step in solved_steps(group))
            if found:
                at.append(f"{size_name(str(group.task.iloc[0]))}={size}: step {', '.join(f'{s:,}' for s in found)}")
        return cls(text, rates, seeds, "; ".join(at))


def solved_steps(rows: pd.DataFrame) -> pd.Series:
    """The step each solved row reached the threshold it is read at: a trial that trained on to a target above the
    sweep's threshold and held it stopped there (its last step), else its ``solve_step`` (the sweep's threshold)."""
    held = rows.get("reason", pd.Series("", index=rows.index)).astype(str).str.contains("held the target")
    return rows.train_steps.where(held, rows.solve_step).dropna() if "train_steps" in rows else rows.solve_step.dropna()


@dataclass(frozen=True)
class ClaimVerdict:
    """One claim's check on a results table, typed: the claim, its verdict and coverage, the detail, the margins,
    what it rests on, its verdict at the other thresholds and, where the paper words it two ways, under the other
    wording. ``row`` is its form for the page, report.json and MLflow."""

    claim: Claim
    check: ClaimCheck
    detail: str
    basis: Basis
    at_thresholds: dict[str, str]
    other: ClaimStatus | None = None

    @property
    def status(self) -> ClaimStatus:
        return self.check.status

    def row(self) -> dict:
        c = self.claim
        other = (
            {"wording": FINDING[c.other.finding].quote, "where": FINDING[c.other.finding].where,
             "status": str(self.other)}
            if c.other and self.other is not None
            else None
        )  # fmt: skip
        return {
            "id": c.id,
            "paper": c.paper,
            "claim": c.finding.quote,
            "where": c.finding.where,
            "threshold": c.threshold,
            "threshold_source": c.source,
            "decided_by": c.test,
            "paper_outcome": c.paper_outcome,
            "needs": c.needs,
            "status": self.status,
            "detail": self.detail,
            "coverage": self.check.coverage.text(),
            "coverage_fraction": round(self.check.coverage.fraction, 4),
            "cases": self.check.coverage.by_reading(),
            "margin": margin_text(self.check.margins),
            "steps": self.basis.steps,
            "learning_rates": self.basis.learning_rates,
            "seeds": self.basis.seeds,
            "solved_at": self.basis.solved_at,
            "at_thresholds": self.at_thresholds,
            "other_reading": other,
        }


def read_at(table: pd.DataFrame, threshold: float, swept_at: float) -> Evidence | None:
    """The evidence at ``threshold`` (None: the table does not record what reading it there needs)."""
    try:
        return Evidence(at_threshold(table, threshold, swept_at), threshold)
    except ValueError:
        return None


def evaluate(
    table: pd.DataFrame, claims: Iterable[Claim] = CLAIMS, swept_at: float = TABLE2_THRESHOLD
) -> list[ClaimVerdict]:
    """Every claim's check on ``table`` (results/sweep.csv, its verdicts at ``swept_at``: the sweep's threshold),
    read at the claim's threshold and at ``SENSITIVITY``'s."""
    views: dict[float, Evidence | None] = {}

    def at(threshold: float) -> Evidence | None:
        if threshold not in views:
            views[threshold] = read_at(table, threshold, swept_at)
        return views[threshold]

    verdicts = []
    for claim in claims:
        ev = at(claim.threshold)
        if ev is None:
            raise ValueError(f"the results cannot be read at {claim.threshold:.0%}: run the sweep again")
        check = claim.check(ev)
        failed = ev.failed_trials(claim.tasks)
        detail = check.detail + (
            f" ({failed} failed trials in {', '.join(claim.tasks)}: no verdict, never counted as a miss)"
            if failed
            else ""
        )
        others = {}
        for t in sorted({*SENSITIVITY, claim.threshold}):
            view = at(t)
            others[f"{t:.1%}"] = "n/a" if view is None else str(claim.check(view).status)
        other = claim.check(ev, most=claim.other.most).status if claim.other else None
        verdicts.append(ClaimVerdict(claim, check, detail, Basis.of(ev.table, check.cases), others, other))
    return verdicts


def margin_text(margins: Sequence[float]) -> str:
    """The decided cases' margins past the claim's line, in accuracy points ("" where its rule compares widths)."""
    margins = [m for m in margins if not math.isnan(m)]
    if not margins:
        return ""
    low, high = min(margins) * 100, max(margins) * 100

    def points(v: float) -> str:  # two decimals where one would read as no margin: -0.05 is not -0.0
        return f"{v:+.2f}" if 0 < abs(v) < 0.05 else f"{v:+.1f}"

    return f"{points(low)} pt" if points(low) == points(high) else f"{points(low)} to {points(high)} pt"
