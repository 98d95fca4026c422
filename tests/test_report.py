"""The report stage on a synthetic sweep table: claims at the top, Table 2 per depth, figures or one line why not,
failed cells shown as failed."""

from __future__ import annotations

import json

import pandas as pd

from pipeline import config as config_mod
from pipeline.report import report
from tests.test_claims import rows


def test_report_page_claims_tables_figures_and_failed_cells(tmp_path):
    table = pd.DataFrame(
        rows("index_lookup", "transformer", 1, {20: 64, 50: 64}, widths=(64, 128), seeds=(0, 1))
        + rows("index_lookup", "lstm", 1, {20: None, 50: None}, widths=(64, 128), accuracy=0.03, seeds=(0, 1))
        + rows("lis", "standard", 2, {4: 16, 6: 32}) + rows("lis", "sparse", 2, {4: 16, 6: 64})
        + rows("lis", "linear", 2, {4: 32, 6: None}, status_override="failed", accuracy=0.0))
    table = table.assign(mlflow_run_id="r", final_accuracy=table.final_accuracy.where(table.seed == 0,
                                                                                      table.final_accuracy - 0.02))
    results = tmp_path / "sweep.csv"
    table.to_csv(results, index=False)
    out, metrics = tmp_path / "report", tmp_path / "report.json"
    summary = report(config_mod.load(profile="tiny"), results, out, metrics, log_mlflow=False)

    page = (out / "index.html").read_text()
    assert page.index("id='claims'") < page.index("Table 2") < page.index("<h2>Figures</h2>")
    assert json.loads(metrics.read_text())["claims"] == summary["claims"]
    assert summary["claims"]["sep_index_lookup_separation"] == "holds"
    assert summary["claims"]["sep_index_lookup_recurrent_fail"] == "not tested"
    assert summary["claims"]["dp_width_grows"] == "holds"  # sparse 16 -> 64; linear failed everywhere: skipped
    assert summary["claims_hold"] + summary["claims_fail"] + summary["claims_not_tested"] == len(summary["claims"])
    assert summary["failed"] == 6
    md = (out / "min_gflops.md").read_text()
    assert "### Depth 1: exact forward GFLOPs" in md and "### Depth 2: training PFLOPs spent until solved" in md
    assert "- (best 0%, failed)" in md  # a failed cell stays in the table, marked
    for name in ("sep_length_index_lookup.png", "sep_width_index_lookup.png", "heatmap_lis_linear_d2.png"):
        assert (out / name).stat().st_size > 1000 and f"src='{name}'" in page
    assert "left out: the report ran without MLflow" in page  # learning curves: never an empty plot
    assert "left out: needs both ed and ed_local" in page and "left out: dyck: not in the profile" in page
    assert "fail" in page and not (tmp_path / "report.tmp").exists()
