"""The report stage on a synthetic sweep table: the claims it decided at the top and the rest after the figures, with
what each needs (the page and fidelity.md), Table 2 per depth and against the paper's, figures or one line why not,
failed cells shown as failed, undecided cells as undecided."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from pipeline.common.config import load_config
from pipeline.report import report
from pipeline.reporting.claims import CLAIMS
from pipeline.reporting.figures import cell_label
from pipeline.reporting.page import html_table, markdown_table
from pipeline.reporting.plots import FRONTIER_KINDS
from pipeline.reporting.tables import BORDERLINE, BOUND, cell_means
from tests.helpers import ROOT, browser
from tests.helpers.browser import BrowserError, Page, group_running, report_problems
from tests.helpers.tables import rows


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> tuple[Path, dict]:
    """The report stage on a synthetic sweep table (two papers' tasks, two seeds, a failed architecture, an
    undecided cell below a solved width and a borderline one)."""
    tmp = tmp_path_factory.mktemp("synthetic")
    table = pd.DataFrame(
        rows("index_lookup", "transformer", 1, {20: 64, 50: 64}, widths=(64, 128), seeds=(0, 1))
        + rows("index_lookup", "lstm", 1, {20: None, 50: None}, widths=(64, 128), accuracy=0.03, seeds=(0, 1))
        + rows("lis", "standard", 2, {4: 16, 6: 32}, undecided={(6, 16)}, borderline={(4, 16)})
        + rows("lis", "sparse", 2, {4: 16, 6: 64})
        + rows("lis", "linear", 2, {4: 32, 6: None}, status_override="failed", accuracy=0.0)
    )
    table = table.assign(
        mlflow_run_id="r", final_accuracy=table.final_accuracy.where(table.seed == 0, table.final_accuracy - 0.02)
    )
    results = tmp / "sweep.csv"
    table.to_csv(results, index=False)
    out = tmp / "report"
    return out, report(load_config(profile="tiny"), results, out, tmp / "report.json", tmp / "plots", log_mlflow=False)


def test_report_page_claims_tables_figures_and_failed_cells(synthetic):
    out, summary = synthetic
    metrics = out.parent / "report.json"
    page = (out / "index.html").read_text()
    # nothing decided: the page says so first, and gathers every claim after the figures
    n = len(CLAIMS)
    assert (
        page.index(f"<h2>What this run decided</h2><p>None of the papers' {n} claims")
        < page.index("<h2>Compute")
        < page.index("id='deviations'")
        < page.index("<h2>Minimum cost")
        < page.index("<h2>Figures</h2>")
        < page.index("id='not-decided-claims'")
    )
    assert "id='claims'" not in page
    fidelity = (out / "fidelity.md").read_text()
    assert f"### What this run decided\n\nNone of the papers' {n} claims at this scale." in fidelity
    assert f"### Not decided at this scale\n\n{n} claims, each with why and what deciding it needs." in fidelity
    assert json.loads(metrics.read_text())["claims"] == summary["claims"]
    assert set(summary["claims_coverage"]) == set(summary["claims"])
    # solved at the sweep's 90%, and stopped there: "near-perfect" (99%) is not decided by it
    assert summary["claims"]["sep_index_lookup_one_layer"] == "undecided"
    assert summary["claims"]["sep_index_lookup_recurrent_fail"] == "not tested"  # DSS, Mamba, ... not run
    assert summary["claims"]["dp_width_grows"] == "not tested"  # depth 2: the paper ran 3
    counts = ("claims_hold", "claims_hold_in_part", "claims_fail_uncontrolled", "claims_undecided",
              "claims_not_tested", "claims_fail")
    assert sum(summary[k] for k in counts) == len(summary["claims"])
    assert set(summary["claims_evidence"]) == set(summary["claims"])
    assert summary["failed"] == 6 and summary["undecided"] == 1 and summary["borderline"] == 1
    checks = json.loads((out / "claims.json").read_text())
    detail = next(c["detail"] for c in checks if c["id"] == "dp_width_grows")
    # one reason, once, after every chain it stops
    assert "ed d3 linear, lis d3 sparse, lis d3 linear: needs two sizes or more where a model learned it (not run " \
           "at 3 layers within the paper's sizes)" in detail
    # a reason reads once, with nothing empty before it (a chain not run, two comparisons stopped by it)
    parts = {c["id"]: c["detail"].split("; ") for c in checks}
    assert not [i for i, part in parts.items() if any(": :" in p for p in part) or len(set(part)) < len(part)]
    detail = next(c["detail"] for c in checks if c["id"] == "sep_index_lookup_one_layer")
    assert "(at 99%: validation held 95.0% when the trial stopped, not converged" in detail
    md = (out / "min_gflops.md").read_text()
    assert "### Depth 1: exact forward GFLOPs" in md and "### Depth 2: training PFLOPs spent until solved" in md
    assert "- (best 0%, failed)" in md  # a failed cell stays in the table, marked
    assert f"{BOUND} 0.032 (D=32, 95%) undecided below" in md and f"(D=16, {BORDERLINE}95%)" in md
    assert "1 undecided: out of steps while still improving" in page and "<b>undecided</b> = the step budget" in page
    assert "0 solved on validation but below the threshold on the test set" in page
    for name in ("sep_length_index_lookup.png", "sep_width_index_lookup.png", "heatmap_lis_linear_d2.png"):
        assert (out / name).stat().st_size > 1000 and f"src='{name}'" in page
    assert "left out: the report ran without MLflow" in page  # learning curves: never an empty plot
    assert "left out: needs both ed and ed_local" in page and "left out: dyck: not in the profile" in page
    scan = page.index("<h3>Separations paper: width scan</h3>")  # its figure under its heading, what it left out after
    assert scan < page.index("src='sep_width_index_lookup.png'") < page.index("left out: dyck", scan)
    assert "fail" in page and not (out.parent / "report.tmp").exists()


def test_the_page_and_fidelity_md_lead_with_what_the_run_decided_and_gather_the_rest_with_their_needs(tmp_path):
    """A sweep that decides two DP claims: the page opens on them (the paper's words and outcome, ours, the verdict)
    and gathers the others after the figures, each with why and what it needs; fidelity.md the same, then Table 2
    cell by cell, the paper's beside ours; Chromium shows both claim tables as claims.json has them."""
    table = pd.DataFrame(
        rows("lis", "standard", 3, {40: 16, 110: 16})
        + rows("lis", "sparse", 3, {40: 16, 110: 64})
        + rows("lis", "linear", 3, {40: 32, 110: None})
    ).assign(mlflow_run_id="r")
    table.to_csv(tmp_path / "sweep.csv", index=False)
    out = tmp_path / "report"
    summary = report(
        load_config(profile="tiny"),
        tmp_path / "sweep.csv",
        out,
        tmp_path / "report.json",
        tmp_path / "plots",
        log_mlflow=False,
    )
    decided = {"dp_width_grows", "dp_efficient_wider", "dp_standard_fixed", "dp_lis_sparse_grows", "dp_nearly_perfect"}
    assert {c for c, status in summary["claims"].items() if status != "not tested"} == decided
    assert summary["claims_hold_in_part"] == 4  # lis at n = 40 and 110: two of the paper's four sizes
    assert summary["claims"]["dp_nearly_perfect"] == "fails"  # linear's own converged miss at n = 110
    page = (out / "index.html").read_text()
    assert (
        page.index("id='claims'")
        < page.index("<h2>Compute")
        < page.index("<h2>Minimum cost")
        < page.index("<h2>Figures</h2>")
        < page.index("id='not-decided-claims'")
    )
    n = len(CLAIMS)
    assert f"5 of the papers' {n} claims: 4 hold in part, 1 fails, each by its rule" in page
    assert "<aside class='legend'>Each comparison the claim makes" in page  # the notation beside the table
    fidelity = (out / "fidelity.md").read_text()
    first, rest = fidelity.split("### Not decided at this scale")
    pending, rest = rest.split("### Deviations from the papers' setups")
    deviations, table2 = rest.split("### Table 2 of the DP paper against this run")
    assert f"5 of the papers' {n} claims: 4 hold in part, 1 fails." in first
    coverage = "lis n = 40, 110 held; 175, 250 not run (of 40, 110, 175, 250)"
    for claim in CLAIMS:
        row = (f"| {claim.paper}, {claim.finding.where} | \u201c{claim.finding.quote}\u201d | {claim.test}; at "
               f"{claim.threshold:.0%} (")
        if claim.id in decided:
            assert f"| {claim.id} | {summary['claims'][claim.id]} | " in first and row in first, claim.id
            assert f"| {claim.paper_outcome} | " in first
        else:
            assert f"| {claim.id} | not tested | " in pending and row in pending, claim.id
            assert f" | {claim.needs} | " in pending, claim.id
    assert coverage in first
    assert "| optimiser and learning rate | DP: AdamW (0.9, 0.999), lr 1e-4" in deviations
    assert re.search(r"verdicts decided on [\d,]+ validation samples drawn as the test set is", deviations)
    assert table2.count("| arithmetic") == 0 and table2.count("\n| ") == 2 + 12  # header, rule, 12 cells
    assert "| standard | 6 | 87 | 64 | 0.027 |  |  | not run (arithmetic 6 at depth 3) |" in table2
    assert report_problems(out) == []


def test_both_tables_show_a_missing_value_empty_and_a_whole_number_whole():
    frame = pd.DataFrame([{"a": "x | y", "b": 64.0, "c": None}, {"a": "**z**", "b": 0.0265, "c": "w"}])
    assert markdown_table(frame) == "| a | b | c |\n| --- | --- | --- |\n| x \\| y | 64 |  |\n| **z** | 0.0265 | w |"
    cells = re.findall(r"<td>(.*?)</td>", html_table(frame))
    assert cells == ["x | y", "64", "", "<b>z</b>", "0.0265", "w"]


def test_heatmap_cells_show_undecided_and_borderline_apart_from_unsolved():
    table = pd.DataFrame(rows("lis", "standard", 2, {4: 32, 6: None}, undecided={(4, 16)}, borderline={(4, 32)}))
    table.loc[(table["size"] == 6) & (table.width == 64), ["measured", "status"]] = [False, "undecided"]
    table.loc[(table["size"] == 6) & (table.width == 32), "measured"] = False
    cells = cell_means(table).set_index(["size", "width"])
    assert cell_label(cells.loc[4, 16]) == ("0.30\nundecided", "...")
    assert cell_label(cells.loc[4, 32]) == (f"{BORDERLINE}0.95*", None)
    assert cell_label(cells.loc[4, 64]) == ("0.95*", None) and cell_label(cells.loc[6, 16]) == ("0.30", None)
    assert cell_label(cells.loc[6, 64]) == ("undecided\n(inferred)", "...")
    assert cell_label(cells.loc[6, 32]) == ("unsolved\n(inferred)", "///")


def test_the_report_writes_the_data_dvc_plots_draw_beside_it(synthetic):
    """results/plots/: per (task, size, architecture, depth) the frontier's width and what it is, a row per cell with
    its mean test accuracy and the heatmap's label; no learning curves without MLflow."""
    out, _ = synthetic
    plots = out.parent / "plots"
    frontier = pd.read_csv(plots / "frontier.csv").set_index(["task", "size", "arch", "depth"])
    assert list(frontier.loc[("lis", 4, "standard", 2), ["width", "min_width", "kind"]]) == [
        16,
        16,
        FRONTIER_KINDS["solved"],
    ]
    assert list(frontier.loc[("lis", 6, "standard", 2), ["width", "min_width", "kind"]]) == [
        32,
        32,
        FRONTIER_KINDS["bound"],
    ]  # D=16 is undecided
    lstm = frontier.loc[("index_lookup", 50, "lstm", 1)]
    assert lstm.width == 128 and pd.isna(lstm.min_width) and lstm.kind == FRONTIER_KINDS["none"]
    accuracy = pd.read_csv(plots / "accuracy.csv").set_index(["task", "size", "arch", "width", "depth"])
    assert len(accuracy) == len(cell_means(pd.read_csv(out / "results.csv")))
    cell = accuracy.loc[("lis", 6, "standard", 16, 2)]
    assert cell.status == "undecided" and cell.label == "0.30 undecided"
    assert accuracy.loc[("index_lookup", 20, "transformer", 64, 1)].accuracy == pytest.approx(0.94)  # 0.95, 0.93
    assert list((plots / "curves").iterdir()) == [] and not (out.parent / "plots.tmp").exists()


def test_the_page_in_chromium_shows_every_figure_and_the_claim_table(synthetic):
    assert report_problems(synthetic[0]) == []


def test_a_broken_figure_or_claim_table_is_caught_in_chromium(synthetic, tmp_path):
    """The check can fail: a figure that is not an image, one whose file is gone, one the page does not show, a
    page wider than the window, a claim table scrolled sideways, and a claim table that disagrees with claims.json."""
    broken = Path(shutil.copytree(synthetic[0], tmp_path / "report"))
    (broken / "heatmap_lis_standard_d2.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(200))  # a header, no image
    (broken / "sep_width_index_lookup.png").unlink()
    shutil.copy(broken / "heatmap_lis_sparse_d2.png", broken / "stray.png")
    with open(broken / "index.html", "a") as page:
        page.write("<p style='width:3000px'>a line that does not wrap</p>")
        page.write("<style>.claims td{white-space:nowrap}</style>")  # its rows one line each: wider than the page
    claims = json.loads((broken / "claims.json").read_text())
    (broken / "claims.json").write_text(json.dumps(claims[:-1]))
    problems = report_problems(broken)
    assert re.fullmatch(r"the page is \d+ px wider than the window", problems.pop(3))
    assert re.fullmatch(r"claim table not-decided-claims: \d+ px of its columns scrolled out of sight", problems.pop(3))
    assert problems == [
        "not loaded: img heatmap_lis_standard_d2.png",
        "not loaded: img sep_width_index_lookup.png",
        f"failed to load: {(broken / 'sep_width_index_lookup.png').as_uri()}",
        "not on the page: stray.png",
        f"claim table: {len(claims)} rows shown, {len(claims) - 1} in claims.json, or their cells differ",
    ]


def test_a_closed_browser_page_leaves_no_process_and_no_profile(tmp_path):
    page_file = tmp_path / "page.html"
    page_file.write_text("<!doctype html><title>t</title><p>a page")
    for _ in range(3):  # a renderer outliving the browser rewrote its profile about every other time
        with Page(page_file.as_uri()) as page:
            assert page.evaluate("document.title") == "t"
        assert not group_running(page.proc.pid) and not page.home.exists()


def test_a_cdn_script_is_served_from_its_vendored_copy_or_named_missing(tmp_path, monkeypatch):
    """A page's script from the CDN (as `dvc plots show`'s page loads vega) comes from the copy vendored in
    tests/vendor/cdn/, with no network; a version not vendored is named."""
    page_file = tmp_path / "page.html"
    page_file.write_text(f"<!doctype html><script src='{browser.CDN}vega@5.20.2'></script>")
    with Page(page_file.as_uri()) as page:
        assert page.evaluate("vega.version") == "5.20.2" and page.failed_loads() == []
    page_file.write_text(f"<!doctype html><script src='{browser.CDN}vega@5.21.0'></script>")
    with pytest.raises(BrowserError, match=r"no vendored copy of vega@5\.21\.0 in .*tests/vendor/cdn: vendor it"):
        Page(page_file.as_uri())


def test_the_vendored_cdn_copies_are_the_versions_dvc_loads_with_their_licences():
    """tests/vendor/cdn/ holds exactly the scripts the installed dvc-render's page asks the CDN for, each with its
    package's licence."""
    from dvc_render.vega import VegaRenderer

    asked = re.findall(re.escape(browser.CDN) + r"([^\"]+)", VegaRenderer.SCRIPTS)
    assert asked == list(browser.CDN_FILES)
    assert sorted(p.name for p in browser.VENDORED.iterdir()) == sorted(asked)
    for spec, file in browser.CDN_FILES.items():
        assert (browser.VENDORED / spec / file).stat().st_size > 10_000
        assert "Redistribution and use in source and binary forms" in (browser.VENDORED / spec / "LICENSE").read_text()


def test_a_width_solved_on_validation_but_below_the_threshold_on_test_is_marked_and_counted_apart():
    """Validation passed, the test set did not: the table marks the width (†) and the headline counts the cells on
    their own (solved_below_threshold_on_test), beside solved_cells, never silently as solved."""
    from pipeline.report import headline
    from pipeline.reporting.tables import BELOW, convention_table, min_gflops

    cfg = load_config(profile="tiny")  # threshold 0.9
    table = pd.DataFrame(rows("lis", "standard", 2, {4: 16, 6: 32}, seeds=(0, 1)))
    below = (table["size"] == 4) & (table.width == 16)
    table.loc[below, "final_accuracy"] = [0.88, 0.86]  # both seeds solved on validation, 87% on test
    best = min_gflops(table)
    summary = headline(cfg, table, best, [])
    assert summary["solved_below_threshold_on_test"] == 2 and summary["solved_cells"] == int(
        (table.status == "solved").sum()
    )
    shown = convention_table(best, 2, "min_paper_gflops", cfg.report.accuracy_threshold).set_index("size")
    assert f"(D=16, 87%{BELOW})" in shown.loc[4, "standard"] and BELOW not in shown.loc[6, "standard"]
    clean = headline(cfg, table.assign(final_accuracy=0.95), best, [])
    assert clean["solved_below_threshold_on_test"] == 0


def test_the_min_width_table_is_printed_at_another_threshold_from_the_recorded_results(synthetic, tmp_path, capsys):
    from pipeline.report import main

    results = synthetic[0].parent / "sweep.csv"
    params = ROOT / "params.yaml"
    assert main(["--params", str(params), "--results", str(results), "--table-at", "0.99"]) == 0
    printed = capsys.readouterr().out
    # every solved trial held 95% and stopped still improving: undecided at 99%, none solved
    assert "validation accuracy at or above 99%" in printed and "undecided (best 95%)" in printed
    assert "(D=" not in printed
    assert main(["--params", str(params), "--results", str(results), "--table-at", "1.5"]) == 2
    assert "--table-at 1.5: an accuracy in (0, 1)" in capsys.readouterr().err
    old = tmp_path / "old.csv"
    pd.read_csv(results).drop(columns=["sustained_accuracy"]).to_csv(old, index=False)
    assert main(["--params", str(params), "--results", str(old), "--table-at", "0.99"]) == 2
    assert "lack ['sustained_accuracy']" in capsys.readouterr().err


def test_the_page_links_the_sweeps_parent_run_in_mlflows_ui(tmp_path):
    """With its MLflow store, the page links the parent run's page (a local store's as `mlflow ui` serves it)."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("capacity-atlas", artifact_location=(tmp_path / "artifacts").as_uri())
    parent = client.create_run(experiment).info.run_id
    table = pd.DataFrame(rows("lis", "standard", 2, {4: 16, 6: 32})).assign(mlflow_run_id=None, parent_run_id=parent)
    table.to_csv(tmp_path / "sweep.csv", index=False)
    cfg = load_config(profile="tiny")
    cfg = cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={"mlflow_tracking_uri": uri})})
    report(cfg, tmp_path / "sweep.csv", tmp_path / "report", tmp_path / "report.json", tmp_path / "plots")
    link = f"http://127.0.0.1:5000/#/experiments/{experiment}/runs/{parent}?workflowType=machine_learning"
    page = (tmp_path / "report" / "index.html").read_text()
    assert f"MLflow parent run <a href='{link}'><code>{parent}</code></a>" in page
