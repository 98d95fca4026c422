"""The report's page and its markdown twin: ``page`` (``report/index.html``: the claims this run decided, Table 2, the
figures, the claims not decided at this scale with what each needs, the conventions) and ``fidelity_markdown``
(``report/fidelity.md``: the claims and Table 2, the paper's beside ours). The report stage writes them."""

from __future__ import annotations

import html
import itertools
import re
import time

import pandas as pd

from pipeline.common.config import Config
from pipeline.reporting import tables
from pipeline.reporting.claims import UNCHECKED, ClaimStatus
from pipeline.reporting.deviations import PAPER_COMPUTE, deviations
from pipeline.reporting.figures import Figure


def cell_text(value) -> str:
    """A table cell as both tables show it: a missing value empty, a whole number without ".0"."""
    return "" if pd.isna(value) else f"{value:g}" if isinstance(value, float) else str(value)


def html_table(frame: pd.DataFrame) -> str:
    """Cells escaped, then markdown bold (the cheapest architecture) as <b>."""
    shown = frame.map(lambda v: re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", html.escape(cell_text(v))))
    return shown.to_html(index=False, escape=False)


NIGHTLY_MARKER = "<!-- nightly -->"  # `python -m pipeline.nightly` puts its comparison here
STATUS_COLOURS = {
    ClaimStatus.HOLDS: "#d4f4d4",
    ClaimStatus.HOLDS_IN_PART: "#e8f6d0",
    ClaimStatus.UNCONTROLLED: "#f6ecd0",
    ClaimStatus.UNDECIDED: "#eeeeee",
    ClaimStatus.NOT_TESTED: "#eeeeee",
    ClaimStatus.FAILS: "#f8d0d0",
}
CLAIMS_LEGEND = (
    "Each comparison the claim makes (a model at a length, a chain of widths) reads one way: <b>held</b> (as the "
    "paper says), <b>missed</b> (against it, on a verdict of the model: converged on the other side of the line), "
    "<b>undecided</b> (it rests on a trial still improving when its budget ran out, diverged or failed), <b>not "
    "run</b>; the coverage gives the paper's lengths by how they read. <b>fails</b>: a comparison missed; a claim "
    "that a model is near-perfect fails on that model's own converged miss, no other model needed. <b>holds</b>: "
    "every comparison at the paper's lengths, models and widths held. <b>holds in part</b>: those decided held, none "
    "missed. <b>fails, uncontrolled</b>: a model the paper says fails did, but no control (another model, or the "
    "same one at a shorter length) reached the line: our recipe is not shown to learn the task there. "
    "<b>undecided</b>, <b>not tested</b>: nothing decided, each reason given. <b>Margin</b>: how far past the "
    "claim's line its decided comparisons landed, in accuracy points: the threshold for near-perfect, the control's "
    "accuracy less 5 points for 'degrades', chance plus 5 for 'no better than chance', the reference less 5 for "
    "'match'; negative: the other side. <b>Rests on</b>: the steps its cells trained (how many seeds converged), "
    "the learning rates tried, the seeds. <b>At each threshold</b>: the verdict with the threshold moved (95%, 97%, "
    "99%, and the claim's own). A cell counts as solved when every seed passed on validation and the mean test "
    "accuracy reaches the threshold; accuracies "
    "are the best cell's mean over its seeds, with their range."
)


def split_decided(checks: list[dict]) -> tuple[list[dict], list[dict]]:
    """The checks this run decided (holds, in part, fails, fails uncontrolled) and those it did not (undecided, not
    tested), each in ``CLAIMS``' order."""
    decided = [c for c in checks if ClaimStatus(c["status"]).decided]
    return decided, [c for c in checks if not ClaimStatus(c["status"]).decided]


def claim_cells(check: dict) -> dict[str, str]:
    """A claim's row, as the page and fidelity.md show it: the paper's words with our reading of them in one sentence
    beside; the verdict with its coverage (four ways a length reads), ours with the margin, what it rests on and the
    sensitivity to the threshold (a decided claim), else why not and what it needs."""
    decided = ClaimStatus(check["status"]).decided
    cells = {"claim": check["id"], "verdict": str(check["status"]), "coverage": check["coverage"]}
    cells |= {
        "paper": f"{check['paper']}, {check['where']}",
        "the paper's words": f"\u201c{check['claim']}\u201d",
        "our reading": f"{check['decided_by']}; at {check['threshold']:.0%} ({check['threshold_source']})",
        "the paper's outcome": check["paper_outcome"],
    }
    if decided:
        cells |= {"ours": check["detail"], "margin": check["margin"]}
    else:
        cells |= {"why not decided here": check["detail"], "what it needs": check["needs"]}
    rests = [f"{check['steps']}", f"learning rates {check['learning_rates']}", f"seeds {check['seeds']}"]
    cells["rests on"] = "; ".join(rests) if check["steps"] else "no decided case"
    if check["solved_at"]:
        cells["rests on"] += f"; solved at {check['solved_at']}"
    cells["at each threshold"] = " \u00b7 ".join(f"{t}: {v}" for t, v in check["at_thresholds"].items())
    other = check.get("other_reading")
    cells["the paper's other wording"] = (
        f"\u201c{other['wording']}\u201d ({other['where']}): {other['status']}" if other else ""
    )
    return cells


def unchecked_frame() -> pd.DataFrame:
    """The papers' measured statements no claim checks, each with why."""
    return pd.DataFrame(
        [{"statement": f"\u201c{u.finding.quote}\u201d", "where": u.finding.where, "why not checked": u.why}
         for u in UNCHECKED]
    )  # fmt: skip


def claim_cell_html(column: str, value: str) -> str:
    """A cell escaped, then markdown code (a profile's name in what a claim needs) as <code>; the verdict bold."""
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(value))
    return f"<td><b>{text}</b></td>" if column == "verdict" else f"<td>{text}</td>"


def claims_html(checks: list[dict], table_id: str) -> str:
    """The checks as a table, each row coloured by its status."""
    shown = [claim_cells(c) for c in checks]
    head = "".join(f"<th>{html.escape(h)}</th>" for h in shown[0])
    rows = "".join(
        f"<tr style='background:{STATUS_COLOURS[c['status']]}'>"
        + "".join(claim_cell_html(k, v) for k, v in cells.items())
        + "</tr>"
        for c, cells in zip(checks, shown)
    )
    return f"<table id='{table_id}' class='claims'><tr>{head}</tr>{rows}</table>"


def with_legend(body: str, legend: str) -> str:
    """``body`` (a table) with its notation in a legend beside it, or under it where the table needs the width
    (``STYLE``)."""
    return f"<div class='with-legend'><div class='body'>{body}</div><aside class='legend'>{legend}</aside></div>"


def decided_count(checks: list[dict]) -> str:
    decided = split_decided(checks)[0]
    if not decided:
        return f"None of the papers' {len(checks)} claims at this scale"
    statuses = [c["status"] for c in decided]
    plural = {
        ClaimStatus.HOLDS: "hold",
        ClaimStatus.HOLDS_IN_PART: "hold in part",
        ClaimStatus.UNCONTROLLED: "fail, uncontrolled",
        ClaimStatus.FAILS: "fail",
    }
    counts = ", ".join(
        f"{n} {status if n == 1 else plural[status]}"
        for status in ClaimStatus
        if status.decided and (n := statuses.count(status))
    )
    return f"{len(decided)} of the papers' {len(checks)} claims: {counts}"


def decided_html(checks: list[dict]) -> str:
    decided, pending = split_decided(checks)
    later = "<a href='#not-decided'>Not decided at this scale</a>"
    if not decided:
        return (
            f"<h2>What this run decided</h2><p>{decided_count(checks)}: each is under {later}, with what deciding it "
            "needs. Table 2 and the figures show what this run measured.</p>"
        )
    return (
        f"<h2>What this run decided</h2><p>{decided_count(checks)}, each by its rule in "
        "<code>pipeline.reporting.rules</code> on this sweep's results, with the share of the paper's own lengths, "
        "models and widths it covers"
        + (f"; the {len(pending)} it cannot decide at its scale are under {later}." if pending else ".")
        + "</p>"
        + with_legend(claims_html(decided, "claims"), CLAIMS_LEGEND)
    )


def not_decided_html(checks: list[dict]) -> str:
    pending = split_decided(checks)[1]
    intro = "<h2 id='not-decided'>Not decided at this scale</h2>"
    if not pending:
        return intro + "<p>None: this run decided every claim.</p>"
    return (
        intro + f"<p>The {len(pending)} claims this run cannot decide, each with why and what deciding it needs: the "
        "models and sizes at which the paper decides it.</p>" + claims_html(pending, "not-decided-claims")
    )


def unchecked_html() -> str:
    return (
        "<h2 id='not-checked'>Not checked</h2><p>The papers' measured statements no claim checks, each with why.</p>"
        + unchecked_frame()
        .to_html(index=False, escape=True, classes="claims")
        .replace("<table", "<table id='not-checked-statements'", 1)
    )


def compute_html(cfg: Config, checks: list[dict], sweep: dict) -> str:
    """The papers' compute beside this profile's forecast and what this run spent."""
    papers = sorted({c["paper"] for c in checks if ClaimStatus(c["status"]).decided}) or ["DP", "separations"]
    rows = "".join(f"<tr><td>the {p} paper</td><td>{html.escape(PAPER_COMPUTE[p])}</td></tr>" for p in papers)
    forecast = sweep.get("grid_pflops")
    if forecast is not None:
        rows += (
            f"<tr><td>forecast, profile <code>{cfg.profile}</code></td><td>{forecast:.4g} PFLOPs of training for its "
            f"grid at the first budget (<code>python -m pipeline.forecast --profile {cfg.profile}</code> gives its "
            "GPU-hours on a cluster)</td></tr>"
        )
    if "train_pflops" in sweep:
        rows += (
            f"<tr><td>this run</td><td>{sweep['train_pflops']:.4g} PFLOPs trained in {sweep['trained']} trials "
            f"({sweep['reused']} reused), {sweep['wall_seconds'] / 3600:.2f} h wall</td></tr>"
        )
    return f"<h2>Compute</h2><table class='claims'>{rows}</table>"


def deviations_html(cfg: Config) -> str:
    frame = pd.DataFrame([vars(d) for d in deviations(cfg)]).rename(
        columns={"topic": "", "paper": "the papers", "ours": "this run", "effect": "what it may change"}
    )
    return "<h2>Deviations from the papers' setups</h2>" + frame.to_html(
        index=False, escape=True, classes="claims"
    ).replace("<table", "<table id='deviations'", 1)


def markdown_table(frame: pd.DataFrame) -> str:
    """``frame`` as a markdown table, unpadded (its cells are sentences), a "|" escaped so that it stays in its
    cell."""
    lines = [list(frame.columns), ["---"] * len(frame.columns)]
    lines += [[cell_text(v).replace("|", "\\|") for v in row] for row in frame.itertuples(index=False)]
    return "\n".join(f"| {' | '.join(line)} |" for line in lines)


def fidelity_markdown(cfg: Config, checks: list[dict], best: pd.DataFrame) -> str:
    """``report/fidelity.md``: the claims, verdict and coverage first, the paper beside ours, then those not decided
    at this scale with what each needs; the deviations from the papers' setups; then Table 2, the paper's cell
    beside ours."""
    decided, pending = split_decided(checks)
    parts = [
        f"**Profile `{cfg.profile}`**: the papers' claims and the DP paper's Table 2 beside this run's results "
        "(`python -m pipeline.report`; how each claim is checked: `docs/fidelity.md`).",
        "### What this run decided",
        decided_count(checks) + ".",
    ]
    if decided:
        parts += [
            markdown_table(pd.DataFrame([claim_cells(c) for c in decided])),
            CLAIMS_LEGEND.replace("<b>", "**").replace("</b>", "**"),
        ]
    parts += ["### Not decided at this scale"]
    if pending:
        parts += [
            f"{len(pending)} claims, each with why and what deciding it needs.",
            markdown_table(pd.DataFrame([claim_cells(c) for c in pending])),
        ]
    else:
        parts.append("None: this run decided every claim.")
    parts += [
        "### Not checked",
        "The papers' measured statements no claim checks, each with why.",
        markdown_table(unchecked_frame()),
        "### Deviations from the papers' setups",
        markdown_table(pd.DataFrame([vars(d) for d in deviations(cfg)])),
        "### Table 2 of the DP paper against this run",
        "Per architecture and number of operators (3 layers): the paper's minimum width, back-solved from its GFLOPs "
        "(`pipeline/reporting/findings.py`), and its GFLOPs at its L, beside this run's minimum width and its "
        "paper-convention GFLOPs taken to the paper's L; the verdict says how they compare, or why they cannot.",
        markdown_table(tables.against_table2(best)),
    ]
    return "\n\n".join(parts) + "\n"


def figures_html(figures: list[Figure]) -> str:
    """Each section's heading, its figures, then what it left out and why: a figure stays under its heading."""
    parts = []
    for section, group in itertools.groupby(figures, key=lambda fig: fig.section):
        parts.append(f"<h3>{html.escape(section)}</h3>")
        for fig in sorted(group, key=lambda fig: fig.name is None):  # stable: each kind in its own order
            if fig.name:
                parts.append(
                    f"<figure><img src='{fig.name}' alt='{html.escape(fig.caption)}'>"
                    f"<figcaption>{html.escape(fig.caption)}</figcaption></figure>"
                )
            else:
                parts.append(f"<p class='omitted'>{html.escape(fig.caption)}</p>")
    return "".join(parts)


CONVENTIONS_HTML = """<h2>Conventions</h2><ul>
<li>Accuracy (mean over seeds): for chain-of-thought tasks, greedy decoding from the prompt with the model's cache,
scoring only the token before the first &lt;eos&gt;; for classification tasks the label read out after the input;
for eq_ncp, the share of strings whose prediction is right at every prefix.</li>
<li>The separations paper samples a fresh batch every step; this pipeline pre-generates large datasets (profile
<code>generate.train_samples</code>) instead. eq_random and eq_one have shortcuts (compare a prefix; count
symbols); eq_ncp is the shortcut-free version.</li>
<li>Paper GFLOPs: thop-style forward count over L + 2 tokens, 2 (L+2)(sum Linear in*out + 4D per LayerNorm);
attention products are free. Exact GFLOPs: every matmul of one forward pass over L tokens, attention under the
architecture's real pattern. Training PFLOPs: 3 x exact forward FLOPs over every sequence trained on, until the
trial was solved.</li>
<li>Our choices where the papers are silent: lis value range R = max(n+150, 2n+50); sparse local window k = 1
block; see conf/ for the grid and optimiser.</li>
<li>Verdicts (<code>pipeline.training.verdict</code>), decided on the validation split (drawn as the test set is,
from a stream of its own; never the test set): <b>solved</b> = final-answer accuracy at or above the threshold at
<code>sweep.verdict.patience</code> consecutive checks; <b>unsolved</b> = converged below the threshold: over the last
<code>sweep.verdict.convergence_window</code> of the steps trained (after at least
<code>sweep.verdict.convergence_min_steps</code>),
the best validation loss fell by no more than <code>sweep.verdict.convergence_tolerance</code> (relative) and the best
validation accuracy rose by no more than <code>sweep.verdict.min_delta</code>, so more training would not solve it;
<b>undecided</b> = the step budget ran out while it was still improving, after the budget was doubled up to
<code>sweep.verdict.max_budget_factor</code> times: no evidence of what the model cannot do, so never counted as
unsolved
(the tables show an upper bound or "undecided", and a claim that rests on it is not tested); <b>diverged</b> = a
loss not finite; <b>failed</b> = the trial raised. <b>Borderline</b> (&asymp;) = the 95% interval of the test
accuracy contains the threshold. A cell is its best learning rate, chosen on validation.</li></ul>"""


def parent_run_html(summary: dict) -> str:
    """The sweep's MLflow parent run, linked to its page in MLflow's UI where the report knows it (a local store's:
    served by `mlflow ui` on demand, which the page says)."""
    run = f"<code>{summary['mlflow_parent_run']}</code>"
    link = summary.get("parent_link")
    if not link:
        return run
    local = " (start <code>mlflow ui --backend-store-uri sqlite:///mlflow.db --port 5000</code> first)"
    return f"<a href='{html.escape(link)}'>{run}</a>" + (local if link.startswith("http://127.0.0.1") else "")


STYLE = (
    "<style>body{font-family:sans-serif;max-width:1200px;margin:auto}table{border-collapse:collapse;"
    "font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px}img{margin:4px;max-width:100%}"
    # a table wider than the page (all cells: ~30 columns) scrolls by itself, its rows one line each
    "table{display:block;max-width:100%;overflow-x:auto}table:not(.claims) td{white-space:nowrap}"
    # a legend beside its table where the table leaves it room, else under it, the whole width: a claim table is
    # read whole, not scrolled sideways past a legend (its 12 columns in a smaller type: they fit 1200 px)
    ".claims{font-size:12px}"
    ".with-legend{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start}"
    ".with-legend .body{flex:999 1 auto;min-width:0}"
    ".legend{flex:1 0 240px;font-size:12px;background:#f7f7f7;padding:6px;border:1px solid #ddd}"
    "figure{display:inline-block;margin:4px}figcaption{font-size:12px}.omitted{color:#666}</style>"
)


def min_cost_html(best: pd.DataFrame, threshold: float) -> str:
    """The minimum cost at the threshold per depth, in each FLOP convention, and Table 2 of the DP paper beside it."""
    legend = html.escape(tables.note(threshold))
    parts = ["<h2>Minimum cost at the accuracy threshold (DP paper, Table 2)</h2>"]
    for depth in sorted(best.depth.unique()):
        conventions = "".join(
            f"<h4>{title}</h4>" + html_table(tables.convention_table(best, depth, column, threshold))
            for column, title in tables.CONVENTIONS.items()
        )
        parts += [f"<h3>Depth {depth}</h3>", with_legend(conventions, legend)]
    parts += [
        "<h3>Table 2 of the DP paper against this run</h3>",
        with_legend(
            html_table(tables.against_table2(best)),
            "The paper's minimum widths on arithmetic at 3 layers, back-solved from its GFLOPs "
            "(<code>pipeline.reporting.findings</code>), beside this run's at the same operators and depth, its "
            "paper-convention GFLOPs taken to the paper's L.",
        ),
    ]
    return "\n".join(parts)


def page(
    cfg: Config, table: pd.DataFrame, figures: list, best: pd.DataFrame, checks: list[dict], summary: dict, sweep: dict
) -> str:
    parts = [
        f"<!doctype html><meta charset='utf-8'><title>Capacity Atlas report: {cfg.profile}</title>",
        STYLE,
        f"<h1>Capacity Atlas: profile <code>{cfg.profile}</code></h1>",
        decided_html(checks),
        compute_html(cfg, checks, sweep),
        deviations_html(cfg),
        "<h2>This run</h2>",
        f"<p>{summary['cells']} cells ({summary['measured']} trained, {summary['inferred']} inferred by the "
        f"width-frontier search), {summary['solved_cells']} solved; verdicts of the trained cells: "
        f"{html.escape(summary['verdicts'])} ({summary['undecided']} undecided: out of steps while still improving, "
        f"no verdict; {summary['borderline']} borderline: test accuracy within noise of the threshold; "
        f"{summary['solved_below_threshold_on_test']} solved on validation but below the threshold on the test "
        f"set, {tables.BELOW} in the tables). "
        f"MLflow parent run {parent_run_html(summary)}. "
        f"Generated {time.strftime('%Y-%m-%d %H:%M')}.</p>",
        NIGHTLY_MARKER,
        min_cost_html(best, cfg.report.accuracy_threshold),
        "<h2>Figures</h2>",
        "<p>Heatmaps: test accuracy, mean over seeds (± the seeds' standard deviation); * = solved "
        "(validation at the threshold) by every seed; hatched = inferred by the frontier search, not trained; "
        "dotted and 'undecided' = a seed ran out of steps while still improving (no verdict); &asymp; = a seed's "
        "test accuracy is borderline; div / fail = a seed diverged / failed.</p>",
        figures_html(figures),
        not_decided_html(checks),
        unchecked_html(),
        CONVENTIONS_HTML,
        "<h2>All cells</h2>",
        table.to_html(index=False, float_format=lambda v: f"{v:.4g}"),
    ]
    return "\n".join(parts)
