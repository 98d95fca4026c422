"""Stage `report`: the page a researcher would publish, from the sweep's results table.

    python -m pipeline.report           (dvc.yaml runs it after the sweep)

Writes ``report/``: ``index.html`` (the page to open: the papers' claims this run decided, Table 2 in three cost
conventions and against the paper's, the figures, the claims not decided at this scale with what each needs),
``fidelity.md`` (its markdown twin, cell by cell), ``min_gflops.md`` / ``.csv`` (Table 2), ``claims.json`` and
``results.csv``; headline numbers and the claims' statuses to ``results/report.json`` (DVC metrics), the data of
`dvc plots show` to ``results/plots/``; the directory is logged to the sweep's MLflow parent run. Undecided cells are
shown as such and never counted as unsolved; failed trials appear everywhere, marked as failed. What each part
shows: docs/report.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from pipeline.common.config import ROOT, Config, ConfigError, load_config
from pipeline.common.signals import exit_on_signals, held
from pipeline.reporting import tables
from pipeline.reporting.claims import ClaimError, ClaimStatus, check_claims, evaluate
from pipeline.reporting.figures import draw_all, load_histories
from pipeline.reporting.page import fidelity_markdown, page
from pipeline.reporting.plots import write
from pipeline.tracking.services import ServiceError, check_mlflow, ui_link

if TYPE_CHECKING:  # MLflow's client is imported where a report is logged: a bad setting, or --table-at, needs none
    from mlflow.tracking import MlflowClient

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


CLAIMS_TABLE = "tables/claims.json"  # the claim checks on the MLflow parent run, as an MLflow table
# report.json's count of the claims of each status
COUNTS = {
    ClaimStatus.HOLDS: "claims_hold",
    ClaimStatus.HOLDS_IN_PART: "claims_hold_in_part",
    ClaimStatus.UNCONTROLLED: "claims_fail_uncontrolled",
    ClaimStatus.UNDECIDED: "claims_undecided",
    ClaimStatus.NOT_TESTED: "claims_not_tested",
    ClaimStatus.FAILS: "claims_fail",
}
EVIDENCE = ("steps", "learning_rates", "seeds", "solved_at", "at_thresholds")  # what a verdict rests on


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
        **{COUNTS[status]: statuses.count(status) for status in ClaimStatus},
        "claims": {c["id"]: str(c["status"]) for c in checks},
        # which of the paper's lengths, models and widths each verdict read which way, and what it rests on
        "claims_coverage": {c["id"]: c["coverage"] for c in checks},
        "claims_evidence": {c["id"]: {k: c[k] for k in EVIDENCE} for c in checks},
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
    for key in ("solved_cells", "solved_below_threshold_on_test", *COUNTS.values()):
        client.log_metric(parent, key, summary[key])
    for check in checks:
        client.set_tag(parent, f"claim.{check['id']}", str(check["status"]))
        client.set_tag(parent, f"claim.{check['id']}.coverage", check["coverage"])
        evidence = "; ".join(f"{k}: {check[k]}" for k in EVIDENCE[:3] if check[k])
        thresholds = ", ".join(f"{t} {v}" for t, v in check["at_thresholds"].items())
        client.set_tag(parent, f"claim.{check['id']}.evidence", f"{evidence}; at {thresholds}".strip("; "))


MLFLOW_UI = "http://127.0.0.1:5000"  # where `mlflow ui` serves a local store, unless told otherwise


def parent_link(client: MlflowClient, ui: str, parent: str) -> str | None:
    """The MLflow UI's page of the sweep's parent run at ``ui`` (``cluster.mlflow_ui_url``, else the tracking URI;
    a local store's: as `mlflow ui` serves it); None for a run this store lacks."""
    from mlflow.exceptions import MlflowException

    try:
        experiment = client.get_run(parent).info.experiment_id
    except MlflowException:
        return None
    link = ui_link(ui, experiment, parent)
    return link if link.startswith("http") else MLFLOW_UI + link


def report(
    cfg: Config,
    results: Path,
    out_dir: Path,
    metrics_path: Path,
    plots_dir: Path,
    log_mlflow: bool = True,
) -> dict:
    sweep_json = results.with_name("sweep.json")  # the sweep's headline: its compute
    table = load_results(results)
    best = tables.min_gflops(table)
    checks = [v.row() for v in evaluate(table, swept_at=cfg.report.accuracy_threshold)]
    client, link = None, None
    if log_mlflow:
        uri = cfg.cluster.mlflow()
        check_mlflow(uri)
        from mlflow.tracking import MlflowClient

        client = MlflowClient(uri)
        link = parent_link(client, cfg.cluster.mlflow_ui(), str(table.parent_run_id.iloc[0]))
    tmp, plots_tmp = fresh(out_dir), fresh(plots_dir)
    metrics_tmp = metrics_path.with_name(metrics_path.name + ".tmp")
    try:
        histories = load_histories(client, table) if client else None
        figures = draw_all(table, tmp, histories)
        write(table, best, histories, plots_tmp)
        best.to_csv(tmp / "min_gflops.csv", index=False)
        (tmp / "min_gflops.md").write_text(tables.tables_markdown(best, cfg.report.accuracy_threshold))
        (tmp / "claims.json").write_text(json.dumps(checks, indent=2) + "\n")
        (tmp / "fidelity.md").write_text(fidelity_markdown(cfg, checks, best))
        table.to_csv(tmp / "results.csv", index=False)
        summary = headline(cfg, table, best, checks)
        sweep = json.loads(sweep_json.read_text()) if sweep_json.exists() else {}
        (tmp / "index.html").write_text(page(cfg, table, figures, best, checks, summary | {"parent_link": link}, sweep))
        metrics_path.parent.mkdir(parents=True, exist_ok=True)
        metrics_tmp.write_text(json.dumps(summary, indent=2) + "\n")
    except BaseException:  # an error, SIGTERM, Ctrl-C: the last report stays as it was, and no half-made one is left
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(plots_tmp, ignore_errors=True)
        metrics_tmp.unlink(missing_ok=True)
        raise
    # the report, the plot data DVC draws and the metrics appear whole or not at all: all three written before any
    # replaces its old version, and a signal held back until all three are in place
    with held():
        for new, old in ((plots_tmp, plots_dir), (tmp, out_dir)):
            shutil.rmtree(old, ignore_errors=True)
            os.replace(new, old)
        os.replace(metrics_tmp, metrics_path)
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
        check_claims()  # a claim the papers' text or the registries no longer back is named before anything is read
        with exit_on_signals():  # SIGTERM and Ctrl-C leave the last report whole (``report``)
            summary = report(
                load_config(args.params),
                Path(args.results),
                Path(args.out),
                Path(args.metrics),
                Path(args.plots),
                log_mlflow=not args.no_mlflow,
            )
    except (ConfigError, ReportError, ServiceError, ClaimError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(
        f"report: {args.out}/index.html; {summary['solved_cells']} of {summary['cells']} cells solved; claims: "
        + ", ".join(f"{s} {summary[COUNTS[s]]}" for s in ClaimStatus)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
