"""The two papers' claims, each as the paper states it, and their check on a results table.

A ``Claim`` carries the paper's words and where it says them (``pipeline.reporting.papers``), the accuracy the paper
calls solved (Table 2: "above 90%"; the separations paper: "near-perfect", read as 99%), its ``Scope`` (the tasks,
sizes and models the paper decides it at: what its coverage counts), the paper's own outcome (its numbers where it
gives them, its words where not), what deciding it needs, and a rule (``pipeline.reporting.rules``) that returns the
claim's cases. ``judge`` turns the cases into a ``ClaimCheck``:

- *fails*: a case against the claim (with "generally", ``most``: as many against as for it);
- *holds*: cases for it and none against, covering the whole scope at the paper's widths;
- *holds in part*: cases for it and none against, covering part of the scope (its ``Coverage`` says which lengths,
  models and widths of the paper's were tested);
- *not tested*: no case decided, each with why.

A case at a size outside the range of the paper's sizes for its task (lis at n = 4, where the paper ran 40-250)
decides nothing: a claim is made at the paper's lengths.

Every claim is read at its own threshold and, for its sensitivity, at ``SENSITIVITY``'s (``tables.at_threshold``: a
trial that stopped short of a threshold without having converged is undecided there). The report leads its page and
``report/fidelity.md`` with the checks this run decided, and gathers the rest under "Not decided at this scale" with
what each needs; ``results/report.json`` holds each status and coverage (``dvc metrics diff``), the MLflow parent run
a tag of each. ``tests/test_claims_papers.py`` runs every rule on the papers' own results, which must hold, and on
their opposites, which must not.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import pandas as pd

from pipeline.reporting.evidence import Evidence, Models
from pipeline.reporting.papers import DP, FINDINGS, Finding, table2_in_words
from pipeline.reporting.rules import (
    EFFICIENT,
    NOT_RUN,
    Case,
    Rule,
    all_of,
    degrades,
    locality_reduces,
    matches,
    near_perfect,
    standard_narrower,
    standard_within,
    width_grows,
)
from pipeline.reporting.tables import at_threshold
from tasks import TASKS
from tasks.papers import NEAR_PERFECT, TABLE2_THRESHOLD


class ClaimStatus(StrEnum):
    """A claim check's result, best first (a nightly run whose claim moves down the order regressed)."""

    HOLDS = "holds"
    HOLDS_IN_PART = "holds in part"
    NOT_TESTED = "not tested"
    FAILS = "fails"

    @property
    def rank(self) -> int:
        return list(ClaimStatus).index(self)

    @property
    def decided(self) -> bool:
        return self != ClaimStatus.NOT_TESTED


NEAR_PERFECT_SOURCE = "the separations paper's 'near-perfect' (§6, App. H), read as 99%"
TABLE2_SOURCE = "DP paper, Table 2: 'an accuracy above 90%'"
SENSITIVITY = (0.95, 0.99, 0.995)  # each claim is also read at these thresholds
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
        """``case`` as not tested: it lies outside the paper's sizes."""
        sizes = self.sizes.get(case.task, ())
        span = f"{sizes[0]}-{sizes[-1]}" if sizes else "none"
        text = f"{case.text} (outside the paper's {size_name(case.task)} = {span})"
        return Case(case.task, case.sizes, case.subject, None, text)


def paper_sizes(task: str, above: int | None = None, upto: int | None = None) -> tuple[int, ...]:
    return tuple(s for s in TASKS[task].paper_sizes if (above is None or s > above) and (upto is None or s <= upto))


def scope(tasks: Iterable[str], subjects: Iterable[object], above: int | None = None, upto: int | None = None) -> Scope:
    """The paper's sizes of ``tasks`` in (above, upto], each with every one of ``subjects``."""
    named = [str(m) for m in subjects]
    return Scope(tuple((t, s, m) for t in tasks for s in paper_sizes(t, above, upto) for m in named))


def size_name(task: str) -> str:
    return "n" if TASKS[task].paper == "dp" else "N"


@dataclass(frozen=True)
class Coverage:
    """Which of a claim's ``scope`` its decided cases tested: the points, the sizes outside the paper's, and what a
    decided case lacked of the paper's setting (``short``)."""

    scope: Scope
    tested: frozenset[Point]
    short: tuple[str, ...] = ()

    @property
    def full(self) -> bool:
        return set(self.scope.points) <= self.tested and not self.short

    @property
    def fraction(self) -> float:
        return len(self.tested.intersection(self.scope.points)) / len(self.scope.points)

    def text(self) -> str:
        if not self.tested:
            return "nothing of the paper's scope"
        parts = []
        for task, sizes in self.scope.sizes.items():
            n = size_name(task)
            mine = sorted({s for t, s, _ in self.tested if t == task})
            inside = [s for s in mine if s in sizes]
            outside = [s for s in mine if s not in sizes]
            text = f"{task} {n} = {', '.join(map(str, inside)) or 'none'} of {', '.join(map(str, sizes))}"
            if outside:
                text += f" (and {n} = {', '.join(map(str, outside))}, between the paper's)"
            parts.append(text)
        subjects = [m for m in self.scope.subjects if any(p[2] == m for p in self.tested)]
        parts.append(f"{len(subjects)} of {len(self.scope.subjects)} models ({', '.join(subjects)})")
        return "; ".join(parts + list(dict.fromkeys(self.short)))


@dataclass(frozen=True)
class ClaimCheck:
    status: ClaimStatus
    detail: str
    coverage: Coverage
    margins: tuple[float, ...] = ()  # the decided cases' margins past the claim's line (positive: the paper's side)


def listed(cases: Sequence[Case]) -> str:
    """The cases' texts, the first few, then a count; models not run gathered per model and task."""
    absent: dict[tuple[str, str], list[int]] = {}
    texts = []
    for c in cases:
        if c.result is None and c.text.endswith(NOT_RUN):
            absent.setdefault((c.subject, c.task), []).extend(c.sizes)
        else:
            texts.append(c.text)
    texts += [
        f"{subject} not run on {task} at {size_name(task)} = {', '.join(map(str, sizes))}"
        for (subject, task), sizes in absent.items()
    ]
    shown = texts[:SHOWN_CASES]
    more = len(texts) - len(shown)
    return "; ".join(shown) + (f"; and {more} more" if more else "")


def judge(cases: Sequence[Case], claim_scope: Scope, most: bool = False) -> ClaimCheck:
    """The verdict of ``cases`` on ``claim_scope``: see the module's docstring. ``most``: the claim says
    "generally", so it fails only when as many cases are against it as for it. A case outside the paper's sizes
    decides nothing."""
    cases = [c if c.result is None or claim_scope.covers(c) else claim_scope.outside(c) for c in cases]
    passes = [c for c in cases if c.result is True]
    fails = [c for c in cases if c.result is False]
    untested = [c for c in cases if c.result is None]
    decided = passes + fails
    coverage = Coverage(
        claim_scope,
        frozenset((c.task, s, c.subject) for c in decided for s in c.sizes),
        tuple(c.short_of for c in decided if c.short_of),
    )
    margins = tuple(c.margin for c in decided if c.margin is not None)
    against = (len(fails) >= len(passes)) if most else bool(fails)
    if decided and against:
        status = ClaimStatus.FAILS
    elif passes:
        status = ClaimStatus.HOLDS if coverage.full else ClaimStatus.HOLDS_IN_PART
    else:
        status = ClaimStatus.NOT_TESTED
    parts = []
    if fails:
        parts.append(f"against ({len(fails)}): {listed(fails)}")
    if passes:
        parts.append(f"for ({len(passes)}): {listed(passes)}")
    if untested:
        parts.append(f"not tested ({len(untested)}): {listed(untested)}")
    return ClaimCheck(status, ". ".join(parts) or "no case: nothing the claim names was run", coverage, margins)


@dataclass(frozen=True)
class Claim:
    """One claim of a paper: ``finding`` (its words and where), the ``threshold`` it reads (with ``source``), the
    ``tasks`` it is about and what our ``test`` of it reads, its ``scope``, the paper's own outcome
    (``paper_outcome``, naming its figure or table, with its numbers where it gives them), what deciding it
    ``needs``, the ``rule``, and ``most`` for a claim the paper words "generally"."""

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

    def __post_init__(self):
        if not 0 < self.threshold < 1:
            raise ValueError(f"claim {self.id}: threshold {self.threshold} is outside (0, 1)")
        unknown = [t for t in {*self.tasks, *self.scope.sizes} if t not in TASKS]
        if unknown:
            raise ValueError(f"claim {self.id}: unknown tasks {sorted(unknown)}; registered: {sorted(TASKS)}")
        if not self.scope.points:
            raise ValueError(f"claim {self.id}: its scope names no size of the paper's")

    @property
    def paper(self) -> str:
        return "DP" if self.finding.paper == DP else "separations"

    def check(self, ev: Evidence) -> ClaimCheck:
        return judge(self.rule(ev), self.scope, self.most)


FINDING = {f.id: f for f in FINDINGS}


def dp(id: str, finding: str, tasks: tuple[str, ...], test: str, rule: Rule, claim_scope: Scope, **kw) -> Claim:
    return Claim(id, FINDING[finding], TABLE2_THRESHOLD, TABLE2_SOURCE, tasks, test, claim_scope, rule=rule, **kw)


def sep(id: str, finding: str, tasks: tuple[str, ...], test: str, rule: Rule, claim_scope: Scope, **kw) -> Claim:
    return Claim(id, FINDING[finding], NEAR_PERFECT, NEAR_PERFECT_SOURCE, tasks, test, claim_scope, rule=rule, **kw)


# what the claims name: the DP paper's three tasks of Figure 1 at its 3 layers; the separations paper's models
FIGURE1 = ("arithmetic", "ed", "lis")
LAYERS, DEEPER = 3, 5  # §6.1: 3 layers; Appendix D: 5 layers on ED (Figure 3)
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
PAPER_SCALE = "a GPU profile such as `paper-faithful`"
SEPARATIONS_SCALE = f"a GPU profile such as `separations`, trained to {NEAR_PERFECT:.0%}"
CLAIMS = (
    dp("dp_width_grows", "dp_efficient_grow", FIGURE1,
       "per task and efficient architecture (sparse, linear) at 3 layers: the minimum width never shrinks as n "
       "grows and is wider at the largest n than at the smallest",
       width_grows(FIGURE1, LAYERS), scope(FIGURE1, EFFICIENT),
       paper_outcome="Figure 1 (3 layers): on arithmetic, ED and LIS the width sparse and linear need grows with n; "
       "Table 2's arithmetic widths: sparse 128/256/256/256, linear 256/512/512/512 at 6/10/13/16 operators",
       needs="two sizes or more of arithmetic, ed or lis with sparse or linear at 3 layers, solved above the "
       "narrowest width tried; the paper: 6-16 operators, ED n = 6-20, LIS n = 40-250, widths 32-1024: "
       + PAPER_SCALE),
    dp("dp_width_grows_deeper", "dp_five_layers", ("ed",),
       "as dp_width_grows, on ed at 5 layers (Figure 3)", width_grows(("ed",), DEEPER), scope(["ed"], EFFICIENT),
       paper_outcome="Figure 3 (Appendix D): at 5 layers on ED the results are similar to those at 3 (Figure 1), "
       "where the width sparse and linear need grows with n",
       needs="two sizes or more of ed with sparse or linear at 5 layers, solved above the narrowest width tried; the "
       "paper: ED n = 6-20, widths 32-1024: " + PAPER_SCALE),
    dp("dp_efficient_wider", "dp_efficient_wider", FIGURE1,
       "at each (task, n) at 3 layers, sparse and linear each need a strictly wider model than standard, in most "
       "cases ('generally')",
       standard_narrower(FIGURE1, LAYERS), scope(FIGURE1, EFFICIENT), most=True,
       paper_outcome="Figure 1 (3 layers): efficient Transformers generally need larger widths than standard; Table "
       "2's arithmetic widths: standard 64/128/128/128, sparse 128/256/256/256, linear 256/512/512/512",
       needs="arithmetic, ed or lis with standard and sparse or linear at 3 layers, solved above the narrowest width "
       "tried; the paper: its Figure 1 grid: " + PAPER_SCALE),
    dp("dp_standard_fixed", "dp_standard_fixed", FIGURE1,
       "at each (task, n) at 3 layers, standard solves at a width of 256 or less",
       standard_within(FIGURE1, LAYERS, 256), scope(FIGURE1, ["standard"]),
       paper_outcome="Figure 1 (3 layers): standard solves every size at width 128 or 256; Table 2's arithmetic "
       "widths: standard 64/128/128/128",
       needs="arithmetic, ed or lis with standard at 3 layers up to width 256 at least; the paper: its Figure 1 "
       "grid: " + PAPER_SCALE),
    dp("dp_locality", "dp_locality", ("ed", "ed_local"),
       "per efficient architecture at 3 layers: the minimum width on ed_local at most ed's at every n both ran, and "
       "smaller at one n at least", locality_reduces(LAYERS), scope(["ed_local"], EFFICIENT),
       paper_outcome="Figure 2: on ED_Local sparse and linear solve at smaller widths than on ED (Figure 1): both "
       "benefit from locality",
       needs="ed and ed_local at a common n with sparse or linear at 3 layers, solved above the narrowest width "
       "tried; the paper: n = 6-20, widths 32-1024: " + PAPER_SCALE),
    dp("dp_arithmetic_standard_first", "dp_table2", ("arithmetic",),
       "arithmetic at 3 layers: at each n standard's minimum width (so its paper-convention FLOPs) strictly below "
       "sparse's and linear's", standard_narrower(["arithmetic"], LAYERS), scope(["arithmetic"], EFFICIENT),
       paper_outcome=table2_in_words(),
       needs="arithmetic with standard and sparse or linear at 3 layers, solved above the narrowest width tried; the "
       "paper: 6-16 operators, widths 32-512: " + PAPER_SCALE),
    sep("sep_index_lookup_one_layer", "sep_index_lookup", ("index_lookup",),
        "a 1-layer transformer of width 64 near-perfect at every index_lookup length",
        near_perfect("index_lookup", [TF1]), scope(["index_lookup"], [TF1]),
        paper_outcome="Figure 2 (left, middle): a 1-layer Transformer of width 64 near-perfect at every N = 20-400, "
        "within a few thousand steps",
        needs="index_lookup with a 1-layer transformer of width 64; the paper: N = 20-400: " + SEPARATIONS_SCALE),
    sep("sep_index_lookup_recurrent_fail", "sep_index_lookup", ("index_lookup",),
        "at each N > 100, each of LSTM, DSS, Mamba, linear Transformer and RetNet (up to 6 layers, width up to 256) "
        "at least 5 points below the 1-layer transformer of width 64, which reaches near-perfect (the control)",
        degrades("index_lookup", RECURRENT, [TF1], 100, paper_width=256), scope(["index_lookup"], RECURRENT, 100),
        paper_outcome="Figure 2 (left, middle): LSTM, DSS, Mamba, linear Transformer and RetNet, up to 6 layers and "
        "width 256, degrade beyond N = 100 where the 1-layer Transformer of width 64 is near-perfect; Figure 3: Mamba "
        "gains with width yet at 1024 stays far below it, and the LSTM stays at chance beyond N = 100 at any width",
        needs="index_lookup at N = 200 and 400 with all five recurrent models and the 1-layer transformer as control; "
        "the paper: recurrent models up to 6 layers and width 256: " + SEPARATIONS_SCALE),
    sep("sep_dyck_small_models", "sep_dyck", ("dyck",),
        "LSTM, 2-layer transformer and Mamba of width 64 near-perfect at every dyck length up to 400",
        near_perfect("dyck", DYCK_SMALL, upto=400),
        scope(["dyck"], DYCK_SMALL, upto=400),
        paper_outcome="Figure 2 (right): the LSTM and Mamba of hidden size 64 and a 2-layer Transformer of width 64 "
        "near-perfect at every N up to 400",
        needs="dyck with the LSTM, the 2-layer transformer and Mamba at width 64; the paper: N = 20-400: "
        + SEPARATIONS_SCALE),
    sep("sep_dyck_one_layer_struggles", "sep_dyck_one_layer", ("dyck",),
        "a 1-layer transformer of width 256 near-perfect up to N = 100, and beyond it (width up to 256) at least 5 "
        "points below the LSTM or the 2-layer transformer of width 64, which reach near-perfect (the controls)",
        all_of(near_perfect("dyck", [TF1_WIDE], upto=100),
               degrades("dyck", [TF1_UPTO], [Models("lstm", width=64), TF2], 100, paper_width=256)),
        scope(["dyck"], [TF1_WIDE], upto=100) + scope(["dyck"], [TF1_UPTO], 100),
        paper_outcome="Figure 2 (right): a 1-layer Transformer of width 256 near-perfect up to N = 100, not beyond, "
        "where the small recurrent models and the 2-layer Transformer are",
        needs="dyck at N = 20-400 with the 1-layer transformer at width 256, and the LSTM or the 2-layer transformer "
        "as control: " + SEPARATIONS_SCALE),
    sep("sep_eq_random_recurrent_fail", "sep_eq_random", ("eq_random",),
        "at each N > 100, the LSTM and the linear Transformer at least 5 points below a transformer that reaches "
        "near-perfect (the control)",
        degrades("eq_random", EQ_RNN, [Models("transformer", max_width=TUNED)], 100),
        scope(["eq_random"], EQ_RNN, 100),
        paper_outcome="Figure 4 (left): Transformers near-perfect up to N = 400; the LSTM and the linear Transformer "
        "struggle beyond N = 100",
        needs="eq_random at N = 200 and 400 with the LSTM, the linear transformer, and a transformer as control; the "
        "paper: widths up to 512: " + SEPARATIONS_SCALE),
    sep("sep_eq_random_ssm_match", "sep_eq_random_ssm", ("eq_random", "eq_one"),
        "on eq_random and eq_one, DSS and Mamba near-perfect at every length a transformer is",
        matches(("eq_random", "eq_one"), SSM, Models("transformer")),
        scope(["eq_random", "eq_one"], SSM),
        paper_outcome="Figure 4 (left): DSS and Mamba match the Transformers on Eq-random and Eq-one, near-perfect up "
        "to N = 400",
        needs="eq_random and eq_one at a length a transformer solves, with DSS and Mamba; the paper: N up to 400: "
        + SEPARATIONS_SCALE),
    sep("sep_eq_one_all_models", "sep_eq_one", ("eq_one",),
        "every one of the six architectures near-perfect on eq_one at every length up to 400",
        near_perfect("eq_one", [Models(a) for a in ALL_MODELS], upto=400), scope(["eq_one"], ALL_MODELS, upto=400),
        paper_outcome="Figure 4: on Eq-one every model near-perfect up to N = 400",
        needs="eq_one with all six architectures; the paper: N up to 400: " + SEPARATIONS_SCALE),
    sep("sep_eq_ncp_ssm_width_64", "sep_eq_ncp", ("eq_ncp",),
        "at each N > 400, DSS and Mamba of width 64 within 5 points of chance (0%), where a transformer of width 64 "
        "is near-perfect (the control)",
        degrades("eq_ncp", NCP_SSM, [Models("transformer", width=64)], 400, chance=0.0),
        scope(["eq_ncp"], NCP_SSM, 400),
        paper_outcome="Figure 4: at width 64, DSS and Mamba no better than chance beyond N = 400, where Transformers "
        "of width 64 are near-perfect; a wider DSS solves up to N = 800",
        needs="eq_ncp at N = 800 with DSS and Mamba at width 64, and a transformer of width 64 as control: "
        + SEPARATIONS_SCALE),
)  # fmt: skip


def read_at(table: pd.DataFrame, threshold: float, swept_at: float) -> Evidence | None:
    """The evidence at ``threshold`` (None: the table does not record what reading it there needs)."""
    try:
        return Evidence(at_threshold(table, threshold, swept_at), threshold)
    except ValueError:
        return None


def evaluate(table: pd.DataFrame, claims: Iterable[Claim] = CLAIMS, swept_at: float = TABLE2_THRESHOLD) -> list[dict]:
    """Every claim's check on ``table`` (results/sweep.csv, its verdicts at ``swept_at``: the sweep's threshold),
    read at the claim's threshold and at ``SENSITIVITY``'s, as rows for the page, report.json and MLflow."""
    views: dict[float, Evidence | None] = {}

    def at(threshold: float) -> Evidence | None:
        if threshold not in views:
            views[threshold] = read_at(table, threshold, swept_at)
        return views[threshold]

    rows = []
    for claim in claims:
        ev = at(claim.threshold)
        if ev is None:
            raise ValueError(f"the results cannot be read at {claim.threshold:.0%}: run the sweep again")
        check = claim.check(ev)
        failed = ev.failed_trials(claim.tasks)
        detail = check.detail + (
            f" ({failed} failed trials in {', '.join(claim.tasks)}, counted as unsolved)"
            if failed and check.status.decided
            else ""
        )
        others = {}
        for t in sorted({*SENSITIVITY, claim.threshold}):
            view = at(t)
            others[f"{t:.1%}"] = "n/a" if view is None else str(claim.check(view).status)
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
                "coverage": check.coverage.text(),
                "coverage_fraction": round(check.coverage.fraction, 4),
                "margin": margin_text(check.margins),
                "at_thresholds": others,
            }
        )
    return rows


def margin_text(margins: Sequence[float]) -> str:
    """The decided cases' margins past the claim's line, in accuracy points ("" where its rule compares widths)."""
    if not margins:
        return ""
    low, high = min(margins) * 100, max(margins) * 100
    return f"{low:+.1f} pt" if abs(high - low) < 0.05 else f"{low:+.1f} to {high:+.1f} pt"
