"""End to end: the real `dvc repro` (real DVC, a local Ray, SQLite MLflow) on the tiny profile, in a copy."""

from __future__ import annotations

import functools
import json
import re
import shlex
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from pipeline.common.config import ConfigError, load_config
from pipeline.data.datasets import dataset_path
from pipeline.search.cells import check_architectures
from tests.helpers import ROOT
from tests.helpers.browser import report_problems, vega_plots
from tests.helpers.repo import copy_generated, copy_repo, mlflow_runs, run
from tests.helpers.services import mlflow_server

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.fixture(scope="module")
def repo(generated, tmp_path_factory) -> Path:
    """A copy of this checkout on the tiny profile, after `dvc repro` (its datasets the session's, ``generated``)."""
    dst = copy_generated(generated, tmp_path_factory.mktemp("repo"))
    result = run(["dvc", "repro"], dst)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # the console: the sweep's progress line at its end, not Ray Tune's table of trials
    printed = result.stdout + result.stderr
    assert re.search(r"sweep: (\d+)/\1 trials \| \d+ solved \| 0 running \| 0 failed \|", printed)
    assert "Number of trials" not in printed
    assert "may be a performance bottleneck" not in printed  # Ray's warning about a driver slow on results
    return dst


def no_outputs(out: Path) -> bool:
    """Nothing written in a results directory but the sweep's lock file."""
    return not out.exists() or [f.name for f in out.iterdir()] == [".sweep.lock"]


def test_repro_writes_data_report_and_one_mlflow_child_per_cell(repo):
    cfg = load_config(repo / "params.yaml")
    axes = cfg.sweep.grid
    grid = len(axes.architectures) * len(axes.widths) * len(axes.depths) * len(axes.seeds) * len(cfg.sweep_datasets())
    for task, size in cfg.sweep_datasets():
        for split in ("train", "test", "val"):
            assert dataset_path(repo / "data", task, size, split).is_file()
    table = pd.read_csv(repo / "results" / "sweep.csv")
    assert len(table) == grid and table.measured.all() and table.cell_id.is_unique
    assert set(table.status) <= {"solved", "unsolved", "undecided"} and table.reason.str.len().gt(0).all()
    trials = pd.read_csv(repo / "results" / "trials.csv")
    assert len(trials) == grid * len(cfg.sweep.search.learning_rates()) and set(trials.status) == set(table.status)
    assert table.final_accuracy.between(0, 1).all() and (table.paper_gflops > 0).all()
    report = repo / "report"
    assert (report / "index.html").is_file() and (report / "min_gflops.md").is_file()
    best = pd.read_csv(report / "min_gflops.csv")
    assert len(best) == len(cfg.sweep_datasets()) * len(cfg.sweep.grid.architectures) * len(cfg.sweep.grid.depths)
    page = (report / "index.html").read_text()
    for task in cfg.generate.datasets:
        for arch in cfg.sweep.grid.architectures:
            name = f"heatmap_{task}_{arch}_d{cfg.sweep.grid.depths[0]}.png"
            assert (report / name).stat().st_size > 1000 and name in page
    metrics = json.loads((repo / "results" / "report.json").read_text())
    assert metrics["cells"] == metrics["measured"] == grid and metrics["failed"] == 0
    assert 0 <= metrics["solved_below_threshold_on_test"] <= metrics["solved_cells"]

    client, parents, children = mlflow_runs(repo)
    assert len(parents) == 1 and len(children) == grid
    parent = parents[0].info.run_id
    assert metrics["mlflow_parent_run"] == parent and set(table.parent_run_id) == {parent}
    assert parents[0].data.metrics["trials_finished"] == len(trials) and parents[0].data.metrics["trials_running"] == 0
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent}
    assert {c.data.tags["cell_id"] for c in children} == set(table.cell_id)
    assert set(table.mlflow_run_id) == {c.info.run_id for c in children}
    for child in children:
        assert child.info.status == "FINISHED" and child.data.tags["status"] in ("solved", "unsolved", "undecided")
        assert 0 <= child.data.metrics["final_accuracy"] <= 1 and child.data.metrics["paper_gflops"] > 0
        assert child.data.params["arch"] in cfg.sweep.grid.architectures
        assert len(client.get_metric_history(child.info.run_id, "val_token_accuracy")) >= 2  # a per-step curve
    row = table.set_index("mlflow_run_id").loc[children[0].info.run_id]
    assert children[0].data.metrics["final_accuracy"] == pytest.approx(row.final_accuracy)
    artifacts = {a.path for a in client.list_artifacts(parent, "report")}
    assert "report/index.html" in artifacts and "report/min_gflops.md" in artifacts


def test_the_report_page_works_in_chromium(repo):
    """report/index.html as the report stage wrote it: every figure (learning curves too) loads in a real browser,
    and the claim table has a row per claim."""
    assert report_problems(repo / "report") == []
    assert list((repo / "report").glob("curves_*.png"))  # drawn from the MLflow histories, which only this run has


def test_dvc_plots_show_and_diff_draw_every_plot_in_chromium_and_exp_show_the_claims(repo, tmp_path):
    """`dvc plots show` draws the report stage's results/plots/ with our templates (.dvc/plots/): a plot of learning
    curves per (task, size), a line per architecture, width, depth and seed against step and against training
    PFLOPs; the frontier, a marker per (task, size, architecture, depth) in a panel per task; the accuracy heatmaps,
    a panel per (task, architecture, depth) of a rect per cell. Chromium draws each, with DVC's scripts from the CDN,
    without a script error or warning. `dvc plots diff` against a commit of these outputs draws everything once per
    revision, the lines told apart by the revision's name. `dvc exp show` lists the headline metrics and claims."""
    cfg = load_config(repo / "params.yaml")
    sweep, datasets = cfg.sweep, cfg.sweep_datasets()
    lines = {f"{a} D={w} d{d}" for a in sweep.grid.architectures for w in sweep.grid.widths for d in sweep.grid.depths}
    series = {f"{a} d{d}" for a in sweep.grid.architectures for d in sweep.grid.depths}
    curves = {f"results_plots_curves_{task}_{size}_csv": (task, size) for task, size in datasets}
    assert run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "outputs", "dvc.lock"],
               repo).returncode == 0  # HEAD: this run's outputs, which DVC reads back from its cache
    for args, revs in ((["show"], ["workspace"]), (["diff", "HEAD"], ["HEAD", "workspace"])):
        result = run(["dvc", "plots", *args, "--out", str(tmp_path / args[0])], repo)
        assert result.returncode == 0, result.stderr[-2000:]
        drawn, problems = vega_plots(tmp_path / args[0] / "index.html")
        assert problems == [], args
        plots = {p.id: p for p in drawn}
        assert len(drawn) == len(plots) and set(plots) == {*curves, "results_plots_frontier_csv",
                                                             "results_plots_accuracy_csv"}, args
        assert all(p.error is None and p.width > 0 and p.height > 0 for p in drawn), args
        for plot_id, (task, size) in curves.items():
            plot, steps = plots[plot_id], pd.read_csv(repo / "results" / "plots" / "curves" / f"{task}_{size}.csv")
            assert plot.titles == [f"results/plots/curves/{task}_{size}.csv"]
            assert set(plot.scales["color"]) == lines and plot.scales["strokeDash"] == revs
            # in each of the two panels, each revision: a line per (architecture, width, depth, seed), a point a step
            assert plot.marks["line"] == 2 * len(revs) * len(lines) * len(sweep.grid.seeds)
            assert plot.marks["symbol"] == 2 * len(revs) * len(steps)
        frontier = plots["results_plots_frontier_csv"]
        assert set(frontier.scales["color"]) == series and frontier.scales["strokeDash"] == revs
        assert frontier.marks["symbol"] == len(revs) * len(datasets) * len(series)
        assert {task for task, _ in datasets} <= set(frontier.titles)
        heatmaps = plots["results_plots_accuracy_csv"]
        assert heatmaps.marks["rect"] == heatmaps.marks["text"] == len(revs) * len(datasets) * len(lines)
        assert {f"{task} · {a} d{d} · {rev}" for task, _ in datasets for a in sweep.grid.architectures
                for d in sweep.grid.depths for rev in revs} <= set(heatmaps.titles)
    shown = json.loads(run(["dvc", "exp", "show", "--json"], repo).stdout)
    metrics = json.loads((repo / "results" / "report.json").read_text())
    headline = ("cells", "solved_cells", "undecided", "mean_final_accuracy", "claims_hold", "claims_fail",
                "claims_not_tested")
    for row in shown:  # the workspace and HEAD
        got = row["data"]["metrics"]["results/report.json"]["data"]
        assert {key: got[key] for key in headline} == {key: metrics[key] for key in headline}, row["rev"]


def test_second_repro_does_no_work(repo):
    before = (repo / "results" / "sweep.csv").stat().st_mtime_ns
    result = run(["dvc", "repro"], repo)
    assert result.returncode == 0
    stages = len(load_config(repo / "params.yaml").tasks) + 2  # a generate per task, sweep, report
    assert result.stdout.count("didn't change, skipping") == stages and "Running stage" not in result.stdout
    assert (repo / "results" / "sweep.csv").stat().st_mtime_ns == before
    assert len(mlflow_runs(repo)[1]) == 1


def test_a_changed_claim_rule_makes_dvc_report_the_report_stage_changed_and_nothing_else(repo):
    """DVC's deps are the code each stage imports (tests/test_layout.py): a claim's rule is the report's code."""
    rules = repo / "pipeline" / "reporting" / "rules.py"
    original = rules.read_text()
    assert "\nCHANCE_MARGIN = 0.05" in original
    try:
        rules.write_text(original.replace("\nCHANCE_MARGIN = 0.05", "\nCHANCE_MARGIN = 0.06"))
        changed = json.loads(run(["dvc", "status", "--json"], repo).stdout)
        assert set(changed) == {"report"}, changed
        assert {"changed deps": {"pipeline/reporting/rules.py": "modified"}} in changed["report"]
    finally:
        rules.write_text(original)
    assert json.loads(run(["dvc", "status", "--json"], repo).stdout) == {}


def test_bad_param_fails_before_ray_and_mlflow(repo):
    params = repo / "params.yaml"
    original = params.read_text()
    ray_dirs = set((repo / "ray_results").iterdir())
    try:
        params.write_text(original.replace("sweep: {}", "sweep: {grid: {widths: [16, 15]}}"))
        result = run(["dvc", "repro"], repo)
        assert result.returncode != 0
        assert "sweep.grid.widths: 15 is not divisible by sweep.model.heads = 2" in result.stdout + result.stderr
    finally:
        params.write_text(original)
    assert set((repo / "ray_results").iterdir()) == ray_dirs and len(mlflow_runs(repo)[1]) == 1


def test_unreachable_or_unusable_mlflow_fails_before_ray(repo, tmp_path):
    ray_dirs = set((repo / "ray_results").iterdir())
    (tmp_path / "notes.db").write_text("not a database\n" * 100)
    for uri, error in [("http://127.0.0.1:9", "MLflow server at http://127.0.0.1:9 is unreachable"),
                       (f"sqlite:///{tmp_path}/notes.db", f"{tmp_path}/notes.db is not an SQLite database")]:
        result = run([sys.executable, "-m", "pipeline.sweep", "--out", str(repo / "elsewhere")], repo,
                     MLFLOW_TRACKING_URI=uri)
        assert result.returncode == 2 and error in result.stderr, result.stderr[-2000:]
    with mlflow_server(tmp_path / "shared", auth=True) as server:  # a shared server that refuses the credentials
        result = run([sys.executable, "-m", "pipeline.sweep", "--out", str(repo / "elsewhere")], repo,
                     MLFLOW_TRACKING_URI=server.uri, MLFLOW_TRACKING_USERNAME=server.admin[0],
                     MLFLOW_TRACKING_PASSWORD="not-the-password")
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"MLflow server at {server.uri} refuses the credentials: it was sent user 'admin'" in result.stderr
    assert set((repo / "ray_results").iterdir()) == ray_dirs and no_outputs(repo / "elsewhere")


def test_unreachable_ray_fails_fast_and_before_any_compute(repo):
    ray_dirs = set((repo / "ray_results").iterdir())
    result = run([sys.executable, "-m", "pipeline.sweep", "--out", str(repo / "elsewhere")], repo,
                 RAY_ADDRESS="127.0.0.1:9")
    assert result.returncode == 2 and "Ray head at 127.0.0.1:9 is unreachable" in result.stderr
    assert set((repo / "ray_results").iterdir()) == ray_dirs and no_outputs(repo / "elsewhere")
    assert len(mlflow_runs(repo)[1]) == 1  # no parent run was started


def test_corrupt_dataset_is_named_before_any_compute(repo):
    cfg = load_config(repo / "params.yaml")
    task, size = cfg.sweep_datasets()[0]
    path = dataset_path(repo / "data", task, size, "test")
    saved = path.read_bytes()
    try:
        path.write_bytes(saved[: len(saved) // 2])
        result = run([sys.executable, "-m", "pipeline.sweep", "--out", str(repo / "elsewhere")], repo)
        assert result.returncode == 2 and f"dataset file {path} is corrupt" in result.stderr
        path.unlink()
        result = run([sys.executable, "-m", "pipeline.sweep", "--out", str(repo / "elsewhere")], repo)
        assert result.returncode == 2 and f"dataset file {path} is missing" in result.stderr
    finally:
        path.write_bytes(saved)
    assert no_outputs(repo / "elsewhere")


# `dvc exp run` with its -S overrides as the docs write them: each argument a run of quoted and bare pieces
EXP_RUN = re.compile(r"dvc exp run((?:\s+-S\s+(?:'[^']*'|\"[^\"]*\"|[^\s`'\"])+)+)")


def documented_exp_runs() -> list[tuple[str, list[str]]]:
    """Every `dvc exp run -S ...` written in the README, docs/, params.yaml or a profile in conf/: (file, its args).
    A profile's file means its commands for that profile, so they get its -S profile=<name> first."""
    found = []
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "params.yaml"]
    for path in [*docs, *sorted((ROOT / "conf").glob("*.yaml"))]:
        for match in EXP_RUN.finditer(path.read_text()):
            args = shlex.split(match.group(1))
            if path.parent.name == "conf" and not any(a.lstrip("+").startswith("profile=") for a in args):
                args = ["-S", f"profile={path.stem}", *args]
            found.append((path.relative_to(ROOT).as_posix(), args))
    return found


def test_every_documented_exp_run_override_works_as_written(tmp_path):
    """Each documented `dvc exp run -S key=value`, given to the real DVC: queued, DVC parses the overrides and
    writes them into params.yaml exactly as a run does, without training (the training of each profile is tested
    elsewhere). The params it queued must pass every check the pipeline makes before it starts and carry each
    value."""
    commands = documented_exp_runs()
    assert {"README.md", "params.yaml"} <= {source for source, _ in commands}  # the pattern still finds them
    dst = copy_repo(tmp_path / "repo")
    for i, (source, args) in enumerate(commands):
        result = run(["dvc", "exp", "run", "--queue", "--name", f"doc-{i}", *args], dst)
        assert result.returncode == 0, f"{source}: dvc exp run {shlex.join(args)}: {result.stderr[-1000:]}"
    shown = json.loads(run(["dvc", "exp", "show", "--json"], dst).stdout)
    queued = {rev["name"]: rev["data"]["params"]["params.yaml"]["data"]
              for commit in shown for exp in commit.get("experiments") or [] for rev in exp["revs"]}
    for i, (source, args) in enumerate(commands):
        params = tmp_path / f"doc-{i}.yaml"
        params.write_text(yaml.safe_dump(queued[f"doc-{i}"]))
        try:
            cfg = load_config(params)
            check_architectures(cfg)
        except ConfigError as err:
            pytest.fail(f"{source}: dvc exp run {shlex.join(args)}: {err}")
        for key, value in (arg.lstrip("+").split("=", 1) for arg in args[1::2]):
            assert functools.reduce(getattr, key.split("."), cfg) == yaml.safe_load(value), (source, key)


def test_an_extended_sweep_trains_only_the_new_cells_and_reuses_the_rest(repo):
    """Runs last: adds a seed to two of the architectures (their cells of seed 0 reused, those of seed 1 trained);
    then goes back, and everything is reused without Ray. A reused trial is referred to, never copied: its row keeps
    its original run, the new parent lists it with a link, and a sweep that trains nothing adds no child run."""
    params = repo / "params.yaml"
    original = params.read_text()
    # the failed repro of the bad-param test removed the sweep's outputs, as DVC does before it runs a stage;
    # they come back from DVC's run cache, without training
    assert run(["dvc", "repro"], repo).returncode == 0
    first = pd.read_csv(repo / "results" / "sweep.csv")
    first_trials = pd.read_csv(repo / "results" / "trials.csv").set_index(["cell_id", "lr"]).mlflow_run_id
    try:
        params.write_text(original.replace("sweep: {}",
                                           "sweep: {grid: {architectures: [standard, lstm], seeds: [0, 1]}}"))
        result = run(["dvc", "repro"], repo)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        table = pd.read_csv(repo / "results" / "sweep.csv")
        kept = first[first.arch.isin(["standard", "lstm"])]
        assert len(table) == 2 * len(kept) and table.measured.all() and set(table.seed) == {0, 1}
        assert f"{len(kept)} already finished" in result.stdout and f"{len(kept)} to train" in result.stdout
        again = table[table.seed == 0].set_index("cell_id").final_accuracy
        assert sorted(again.index) == sorted(kept.cell_id)
        assert again.equals(kept.set_index("cell_id").final_accuracy.loc[again.index])
        assert (table[table.seed == 0].mlflow_run_id.sort_values().tolist()
                == kept.mlflow_run_id.sort_values().tolist())  # the original runs, not copies
        client, parents, children = mlflow_runs(repo)
        newest = max(parents, key=lambda r: r.info.start_time).info.run_id
        mine = [c for c in children if c.data.tags["mlflow.parentRunId"] == newest]
        assert sorted(c.data.tags["cell_id"] for c in mine) == sorted(table[table.seed == 1].cell_id)  # trained only
    finally:
        params.write_text(original)
    result = run(["dvc", "repro"], repo)  # back to the first params: DVC restores its outputs from the run cache
    assert result.returncode == 0 and (repo / "results" / "sweep.csv").exists(), result.stdout + result.stderr
    accuracy = first.set_index("cell_id").final_accuracy.sort_index()
    assert pd.read_csv(repo / "results" / "sweep.csv").set_index("cell_id").final_accuracy.sort_index().equals(accuracy)
    ray_dirs = set((repo / "ray_results").iterdir())
    client, parents, children = mlflow_runs(repo)
    result = run([sys.executable, "-m", "pipeline.sweep", "--out", str(repo / "again")], repo)
    assert result.returncode == 0
    assert f"{len(first_trials)} already finished" in result.stdout and "0 to train" in result.stdout
    assert set((repo / "ray_results").iterdir()) == ray_dirs  # nothing to train: Ray never started
    assert pd.read_csv(repo / "again" / "sweep.csv").set_index("cell_id").final_accuracy.sort_index().equals(accuracy)
    # an unchanged rerun: one parent run more, no child run more; each trial's row names its original run
    _, parents_after, children_after = mlflow_runs(repo)
    assert len(parents_after) == len(parents) + 1 and len(children_after) == len(children)
    again = pd.read_csv(repo / "again" / "trials.csv").set_index(["cell_id", "lr"])
    assert again.mlflow_run_id.sort_index().equals(first_trials.sort_index())
    assert again.reused_from.sort_index().equals(first_trials.sort_index())
    parent = client.get_run(json.loads((repo / "again" / "sweep.json").read_text())["mlflow_parent_run"])
    listed = json.loads((Path(client.download_artifacts(parent.info.run_id, "tables/reused.json"))).read_text())
    rows = [dict(zip(listed["columns"], row)) for row in listed["data"]]
    assert sorted(r["mlflow_run_id"] for r in rows) == sorted(first_trials)
    assert all(r["link"].endswith(f"/runs/{r['mlflow_run_id']}?workflowType=machine_learning") for r in rows)
    assert f"{len(first_trials)} of {len(first_trials)} trials were finished by earlier sweeps" in \
        parent.data.tags["mlflow.note.content"]



def test_the_mlflow_ui_shows_the_sweep_as_a_person_expects(repo, tmp_path):
    """The real MLflow UI, served by `mlflow server` over the tiny pipeline's store and opened in Chromium at the
    address the sweep prints: the runs view (not the GenAI overview) lists the sweep, whose expander shows its
    children; a child's page names its train and test datasets and draws its validation curve; the parent's
    report artifact opens, and its per-cell table is shown as a table."""
    from mlflow.tracking import MlflowClient

    from pipeline.tracking.services import ui_link
    from tests.helpers.browser import Page
    from tests.helpers.mlflow_ui import chart_points, click_in_row, shows, type_into, wait_for_frame, wait_until
    from tests.helpers.services import mlflow_server

    store = f"sqlite:///{repo / 'mlflow.db'}"
    client = MlflowClient(store)
    parent = client.get_run(json.loads((repo / "results" / "sweep.json").read_text())["mlflow_parent_run"])
    experiment = parent.info.experiment_id
    children = client.search_runs([experiment], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    curves = {c.info.run_id: len(client.get_metric_history(c.info.run_id, "val_accuracy")) for c in children}
    child = client.get_run(max(curves, key=curves.get))  # the longest curve
    assert curves[child.info.run_id] >= 2
    task, size = child.data.params["task"], child.data.params["size"]
    with mlflow_server(tmp_path, backend=store) as server:
        printed = ui_link(server.uri, experiment)
        with Page(printed, width=1400, height=1000) as page:
            wait_until(page, shows(parent.info.run_name), "the sweep's parent run")
            assert f"{task}-{size}-train" in page.evaluate("document.body.innerText"), "the parent's datasets"
            click_in_row(page, parent.info.run_name)
            wait_until(page, shows(child.info.run_name), "the parent's children after its expander")
        with Page(ui_link(server.uri, experiment, child.info.run_id), width=1400, height=1000) as page:
            digest = child.inputs.dataset_inputs[0].dataset.digest
            wait_until(page, shows(f"{task}-{size}-train ({digest})"), "the child's train dataset")
        model_metrics = ui_link(server.uri, experiment, child.info.run_id).replace("?", "/model-metrics?")
        with Page(model_metrics, width=1400, height=1000) as page:
            wait_until(page, "!!document.querySelector('input[placeholder=\"Search metric charts\"]')", "the charts")
            type_into(page, "Search metric charts", "val_accuracy")  # the chart may be below the fold
            points = wait_until(page, chart_points("val_accuracy"), "the child's val_accuracy chart")
            assert points == curves[child.info.run_id], (points, curves[child.info.run_id])
        report = ui_link(server.uri, experiment, parent.info.run_id).replace("?", "/artifacts/report/index.html?")
        with Page(report, width=1400, height=1000) as page:
            wait_until(page, "!!document.querySelector('iframe')", "the report artifact's viewer")
            wait_for_frame(page, "Capacity Atlas: profile tiny")
        table = ui_link(server.uri, experiment, parent.info.run_id).replace("?", "/artifacts/tables/sweep.json?")
        with Page(table, width=1400, height=1000) as page:
            wait_until(page, shows(child.data.params["cell_id"]), "the per-cell table as a table")
