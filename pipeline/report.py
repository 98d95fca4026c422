"""Stage `report`: the page a researcher would publish, from the sweep's results table.

    python -m pipeline.report

Writes ``report/``: ``index.html`` (the page to open): first the claims of both papers this run decided
(``pipeline.reporting.claims``), then the DP paper's Table 2 in three cost conventions per depth and against the
paper's (``pipeline.reporting.tables``), the figures (``pipeline.reporting.figures``: heatmaps, ed_local against ed,
accuracy against length, width scans, learning curves from the MLflow histories), and the claims not decided at
this scale with what each needs; ``fidelity.md`` (the claims and Table 2, the paper's beside ours, cell by cell),
``min_gflops.md`` / ``.csv`` (Table 2), ``claims.json``, and ``results.csv``. Headline numbers and every claim's
status go to ``results/report.json`` (a DVC metrics file), the data `dvc plots show` draws (learning curves,
frontier, accuracies) to ``results/plots/`` (``reporting/plots.py``); the directory is logged to the sweep's MLflow
parent run, the claims as its tags. A cell is solved when its validation accuracy reached the threshold, unsolved
when it converged below it, undecided when its budget ran out while it was still improving
(``pipeline.training.verdict``): undecided cells are shown as such and never counted as unsolved. Accuracies shown
are test-set final-answer accuracies, the mean over seeds. Failed trials appear everywhere, marked as failed.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
from mlflow.tracking import MlflowClient

from pipeline.common.config import ROOT, Config, ConfigError, load_config
from pipeline.reporting import tables
from pipeline.reporting.claims import ClaimStatus, evaluate
from pipeline.reporting.figures import Figure, draw_all, load_histories
from pipeline.reporting.plots import write
from pipeline.tracking.services import ServiceError, check_mlflow

REQUIRED = (
    "task",
    "size",
    "max_len",
    "arch",
    "width",
    "depth",
    "seed",
    "measured",
    "status",
    "reason",
    "final_accuracy",
    "paper_gflops",
    "exact_gflops",
    "solve_pflops",
    "mlflow_run_id",
    "parent_run_id",
)


class ReportError(RuntimeError):
    pass


def load_results(path: Path) -> pd.DataFrame:
    if not path.exists():
        raise ReportError(f"{path} is missing: run the sweep stage first (`dvc repro`)")
    table = pd.read_csv(path)
    missing = [c for c in REQUIRED if c not in table.columns]
    if missing:
        raise ReportError(f"{path} lacks columns {missing}: written by another version of the sweep stage?")
    return table


def html_table(frame: pd.DataFrame) -> str:
    """Cells escaped, then markdown bold (the cheapest architecture) as <b>."""
    shown = frame.map(lambda v: re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", html.escape(str(v))))
    return shown.to_html(index=False, escape=False)


CLAIMS_TABLE = "tables/claims.json"  # the claim checks on the MLflow parent run, as an MLflow table
NIGHTLY_MARKER = "<!-- nightly -->"  # `python -m pipeline.nightly` puts its comparison here
STATUS_COLOURS = {"holds": "#d4f4d4", "fails": "#f8d0d0", "not tested": "#eeeeee"}


def split_decided(checks: list[dict]) -> tuple[list[dict], list[dict]]:
    """The checks this run decided (holds, fails) and those it did not (not tested), each in ``CLAIMS``' order."""
    pending = [c for c in checks if c["status"] == ClaimStatus.NOT_TESTED]
    return [c for c in checks if c["status"] != ClaimStatus.NOT_TESTED], pending


def claim_cells(check: dict) -> dict[str, str]:
    """A claim's row, as the page and fidelity.md show it: the paper's side, then ours (a decided claim: the
    evidence and verdict; else why not and what it needs), then our test."""
    cells = {
        "claim": check["id"],
        "paper": f"{check['paper']}, {check['where']}",
        "the paper's words": f"\u201c{check['claim']}\u201d",
        "the paper's outcome": check["paper_outcome"],
    }
    if check["status"] == ClaimStatus.NOT_TESTED:
        cells |= {"why not decided here": check["detail"], "what it needs": check["needs"]}
    else:
        cells |= {"ours": check["detail"], "verdict": str(check["status"])}
    cells["our test"] = f"{check['decided_by']}; at {check['threshold']:.0%} ({check['threshold_source']})"
    return cells


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


def decided_count(checks: list[dict]) -> str:
    decided = split_decided(checks)[0]
    if not decided:
        return f"None of the papers' {len(checks)} claims at this scale"
    statuses = [c["status"] for c in decided]
    return (
        f"{len(decided)} of the papers' {len(checks)} claims: {statuses.count(ClaimStatus.HOLDS)} hold, "
        f"{statuses.count(ClaimStatus.FAILS)} fail"
    )


def decided_html(checks: list[dict]) -> str:
    decided, pending = split_decided(checks)
    later = "<a href='#not-decided'>Not decided at this scale</a>"
    if not decided:
        return (
            f"<h2>What this run decided</h2><p>{decided_count(checks)}: each is under {later}, with what deciding it "
            "needs. Table 2 and the figures show what this run measured.</p>"
        )
    return (
        f"<h2>What this run decided</h2><p>{decided_count(checks)}, each by the rule in "
        "<code>pipeline.reporting.claims</code> on this sweep's results"
        + (f"; the {len(pending)} it cannot decide at its scale are under {later}." if pending else ".")
        + "</p>"
        + claims_html(decided, "claims")
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


def markdown_table(frame: pd.DataFrame) -> str:
    """``frame`` as a markdown table, unpadded (its cells are sentences): a missing value empty, a whole number
    without ".0", a "|" escaped so that it stays in its cell."""

    def cell(value) -> str:
        text = "" if pd.isna(value) else f"{value:g}" if isinstance(value, float) else str(value)
        return text.replace("|", "\\|")

    lines = [list(frame.columns), ["---"] * len(frame.columns)]
    lines += [[cell(v) for v in row] for row in frame.itertuples(index=False)]
    return "\n".join(f"| {' | '.join(line)} |" for line in lines)


def fidelity_markdown(profile: str, checks: list[dict], best: pd.DataFrame) -> str:
    """``report/fidelity.md``: the claims, paper beside ours, decided first, then those not decided at this scale
    with what each needs; then Table 2, the paper's cell beside ours."""
    decided, pending = split_decided(checks)
    parts = [
        f"**Profile `{profile}`**: the papers' claims and the DP paper's Table 2 beside this run's results "
        "(`python -m pipeline.report`; how each claim is checked: `docs/fidelity.md`).",
        "### What this run decided",
        decided_count(checks) + ".",
    ]
    if decided:
        parts.append(markdown_table(pd.DataFrame([claim_cells(c) for c in decided])))
    parts += ["### Not decided at this scale"]
    if pending:
        parts += [
            f"{len(pending)} claims, each with why and what deciding it needs.",
            markdown_table(pd.DataFrame([claim_cells(c) for c in pending])),
        ]
    else:
        parts.append("None: this run decided every claim.")
    parts += [
        "### Table 2 of the DP paper against this run",
        "Per architecture and number of operators (3 layers): the paper's minimum width, back-solved from its GFLOPs "
        "(`pipeline/reporting/papers.py`), and its GFLOPs at its L, beside this run's minimum width and its "
        "paper-convention GFLOPs taken to the paper's L; the verdict says how they compare, or why they cannot.",
        markdown_table(tables.against_table2(best)),
    ]
    return "\n\n".join(parts) + "\n"


def figures_html(figures: list[Figure]) -> str:
    parts, section = [], None
    for fig in figures:
        if fig.section != section:
            section = fig.section
            parts.append(f"<h3>{html.escape(section)}</h3>")
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
<code>sweep.patience</code> consecutive checks; <b>unsolved</b> = converged below the threshold: over the last
<code>sweep.convergence_window</code> of the steps trained (after at least <code>sweep.convergence_min_steps</code>),
the best validation loss fell by no more than <code>sweep.convergence_tolerance</code> (relative) and the best
validation accuracy rose by no more than <code>sweep.min_delta</code>, so more training would not solve it;
<b>undecided</b> = the step budget ran out while it was still improving, after the budget was doubled up to
<code>sweep.max_budget_factor</code> times: no evidence of what the model cannot do, so never counted as unsolved
(the tables show an upper bound or "undecided", and a claim that rests on it is not tested); <b>diverged</b> = a
loss not finite; <b>failed</b> = the trial raised. <b>Borderline</b> (&asymp;) = the 95% interval of the test
accuracy contains the threshold. A cell is its best learning rate, chosen on validation.</li></ul>"""


def page(cfg: Config, table: pd.DataFrame, figures: list, best: pd.DataFrame, checks: list[dict], summary: dict) -> str:
    parts = [
        f"<!doctype html><meta charset='utf-8'><title>Capacity Atlas report: {cfg.profile}</title>",
        "<style>body{font-family:sans-serif;max-width:1200px;margin:auto}table{border-collapse:collapse;"
        "font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px}img{margin:4px;max-width:100%}"
        # a table wider than the page (all cells: ~30 columns) scrolls by itself, its rows one line each
        "table{display:block;max-width:100%;overflow-x:auto}table:not(.claims) td{white-space:nowrap}"
        "figure{display:inline-block;margin:4px}figcaption{font-size:12px}.omitted{color:#666}</style>",
        f"<h1>Capacity Atlas: profile <code>{cfg.profile}</code></h1>",
        f"<p>{summary['cells']} cells ({summary['measured']} trained, {summary['inferred']} inferred by the "
        f"width-frontier search), {summary['solved_cells']} solved; verdicts of the trained cells: "
        f"{html.escape(summary['verdicts'])} ({summary['undecided']} undecided: out of steps while still improving, "
        f"no verdict; {summary['borderline']} borderline: test accuracy within noise of the threshold; "
        f"{summary['solved_below_threshold_on_test']} solved on validation but below the threshold on the test "
        f"set, {tables.BELOW} in the tables). "
        f"MLflow parent run <code>{summary['mlflow_parent_run']}</code>. "
        f"Generated {time.strftime('%Y-%m-%d %H:%M')}.</p>",
        decided_html(checks),
        NIGHTLY_MARKER,
        "<h2>Minimum cost at the accuracy threshold (DP paper, Table 2)</h2>",
        f"<p>{html.escape(tables.note(cfg.report.accuracy_threshold))}</p>",
    ]
    for depth in sorted(best.depth.unique()):
        for column, title in tables.CONVENTIONS.items():
            shown = tables.convention_table(best, depth, column, cfg.report.accuracy_threshold)
            parts += [f"<h3>Depth {depth}: {title}</h3>", html_table(shown)]
    parts += [
        "<h3>Table 2 of the DP paper against this run</h3><p>The paper's minimum widths on arithmetic at 3 layers, "
        "back-solved from its GFLOPs (<code>pipeline.reporting.papers</code>), beside this run's at the same "
        "operators and depth, its paper-convention GFLOPs taken to the paper's L.</p>",
        html_table(tables.against_table2(best)),
    ]
    parts += [
        "<h2>Figures</h2>",
        "<p>Heatmaps: test accuracy, mean over seeds (± the seeds' standard deviation); * = solved "
        "(validation at the threshold) by every seed; hatched = inferred by the frontier search, not trained; "
        "dotted and 'undecided' = a seed ran out of steps while still improving (no verdict); &asymp; = a seed's "
        "test accuracy is borderline; div / fail = a seed diverged / failed.</p>",
        figures_html(figures),
        not_decided_html(checks),
        CONVENTIONS_HTML,
        "<h2>All cells</h2>",
        table.to_html(index=False, float_format=lambda v: f"{v:.4g}"),
    ]
    return "\n".join(parts)


def headline(cfg: Config, table: pd.DataFrame, best: pd.DataFrame, checks: list[dict]) -> dict[str, Any]:
    """The report's metrics (``results/report.json``, ``dvc metrics show``): the cells by verdict, the claims by
    status, each (task, size, arch, depth)'s minimum paper-convention GFLOPs."""
    threshold = cfg.report.accuracy_threshold
    measured = table[table.measured]
    statuses = [c["status"] for c in checks]
    return {
        "profile": cfg.profile,
        "cells": len(table),
        "measured": len(measured),
        "inferred": len(table) - len(measured),
        "solved_cells": int((table.status == "solved").sum()),
        "failed": int((measured.status == "failed").sum()),
        "undecided": int((measured.status == "undecided").sum()),
        "borderline": int(tables.borderline_cells(measured).sum()),
        # solved on validation, yet below the threshold on the test set: counted apart, never silently as solved
        "solved_below_threshold_on_test": int(
            ((measured.status == "solved") & (measured.final_accuracy < threshold - 1e-9)).sum()
        ),
        "verdicts": ", ".join(f"{n} {status}" for status, n in measured.status.value_counts().items()),
        "cells_at_threshold": int((measured.final_accuracy >= threshold).sum()),
        "mean_final_accuracy": round(float(measured.final_accuracy.mean()), 4) if len(measured) else None,
        "mlflow_parent_run": str(table.parent_run_id.iloc[0]),
        "claims_hold": statuses.count("holds"),
        "claims_fail": statuses.count("fails"),
        "claims_not_tested": statuses.count("not tested"),
        "claims": {c["id"]: c["status"] for c in checks},
        "min_paper_gflops": {
            f"{r.task}_{r.size}_{r.arch}_d{r.depth}": (
                None if pd.isna(r.min_paper_gflops) else float(r.min_paper_gflops)
            )
            for r in best.itertuples()
        },
    }


def fresh(path: Path) -> Path:
    """``path``'s sibling ``<name>.tmp``, empty: where a new version is written before it replaces the old."""
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def log_report(client: MlflowClient, parent: str, out_dir: Path, checks: list[dict], summary: dict) -> None:
    """The report into the sweep's parent run: the page's files, the claim table, the headline counts, a tag per
    claim."""
    client.log_artifacts(parent, str(out_dir), "report")
    client.log_table(parent, pd.DataFrame(checks), CLAIMS_TABLE)  # the UI shows it as a table
    for key in ("solved_cells", "solved_below_threshold_on_test", "claims_hold", "claims_fail", "claims_not_tested"):
        client.log_metric(parent, key, summary[key])
    for check in checks:
        client.set_tag(parent, f"claim.{check['id']}", check["status"])


def report(
    cfg: Config,
    results: Path,
    out_dir: Path,
    metrics_path: Path,
    plots_dir: Path,
    log_mlflow: bool = True,
) -> dict:
    table = load_results(results)
    best = tables.min_gflops(table)
    checks = evaluate(table, swept_at=cfg.report.accuracy_threshold)
    client = None
    if log_mlflow:
        uri = cfg.cluster.mlflow()
        check_mlflow(uri)
        client = MlflowClient(uri)
    tmp, plots_tmp = fresh(out_dir), fresh(plots_dir)
    histories = load_histories(client, table) if client else None
    figures = draw_all(table, tmp, histories)
    write(table, best, histories, plots_tmp)
    best.to_csv(tmp / "min_gflops.csv", index=False)
    (tmp / "min_gflops.md").write_text(tables.tables_markdown(best, cfg.report.accuracy_threshold))
    (tmp / "claims.json").write_text(json.dumps(checks, indent=2) + "\n")
    (tmp / "fidelity.md").write_text(fidelity_markdown(cfg.profile, checks, best))
    table.to_csv(tmp / "results.csv", index=False)
    summary = headline(cfg, table, best, checks)
    (tmp / "index.html").write_text(page(cfg, table, figures, best, checks, summary))
    # the report and the plot data DVC draws appear whole or not at all, both written before either replaces its old
    for new, old in ((plots_tmp, plots_dir), (tmp, out_dir)):
        shutil.rmtree(old, ignore_errors=True)
        os.replace(new, old)
    metrics_path.parent.mkdir(parents=True, exist_ok=True)
    metrics_path.write_text(json.dumps(summary, indent=2) + "\n")
    if client is not None:
        log_report(client, summary["mlflow_parent_run"], out_dir, checks, summary)
    return summary


def table_at(cfg: Config, results: Path, threshold: float) -> str:
    """The minimum-width tables (markdown) at ``threshold`` instead of the sweep's, from the recorded verdicts."""
    if not 0 < threshold < 1:
        raise ReportError(f"--table-at {threshold}: an accuracy in (0, 1), such as 0.99")
    table = load_results(results)
    try:
        shown = tables.at_threshold(table, threshold, cfg.report.accuracy_threshold)
    except ValueError as err:
        raise ReportError(f"{results}: {err}") from None
    return tables.tables_markdown(tables.min_gflops(shown), threshold)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m pipeline.report", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    root = ROOT
    ap.add_argument("--params", default=str(root / "params.yaml"), help="params file (default: %(default)s)")
    ap.add_argument("--results", default=str(root / "results" / "sweep.csv"), help="sweep table (default: %(default)s)")
    ap.add_argument("--out", default=str(root / "report"), help="report directory (default: %(default)s)")
    ap.add_argument(
        "--metrics", default=str(root / "results" / "report.json"), help="metrics file (default: %(default)s)"
    )
    ap.add_argument(
        "--plots",
        default=str(root / "results" / "plots"),
        help="the data `dvc plots show` draws (default: %(default)s)",
    )
    ap.add_argument("--no-mlflow", action="store_true", help="do not log the report to the MLflow parent run")
    ap.add_argument(
        "--table-at",
        metavar="T",
        type=float,
        help="print the minimum-width table at accuracy T (in (0, 1)) from the results, and write nothing",
    )
    args = ap.parse_args(argv)
    try:
        if args.table_at is not None:
            print(table_at(load_config(args.params), Path(args.results), args.table_at))
            return 0
        summary = report(
            load_config(args.params),
            Path(args.results),
            Path(args.out),
            Path(args.metrics),
            Path(args.plots),
            log_mlflow=not args.no_mlflow,
        )
    except (ConfigError, ReportError, ServiceError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(
        f"report: {args.out}/index.html; {summary['solved_cells']} of {summary['cells']} cells solved; claims: "
        f"{summary['claims_hold']} hold, {summary['claims_fail']} fail, {summary['claims_not_tested']} not tested"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
