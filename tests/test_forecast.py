"""The forecast before launch (pipeline.forecast, pipeline.costs): the grid's FLOPs against a sum over its
cells made here, the wall time a throughput file implies on a hand-checked case, the replayed savings against the
benchmark's file, bad input named before any compute, one measured throughput, and the command end to end on `tiny`
with its throughput measured on this CPU."""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, replace

import pandas as pd
import pytest
import torch

import models
import pipeline.costs.throughput
import pipeline.forecast
import tasks
from pipeline.common.cell import Cell
from pipeline.common.config import Config, load_config
from pipeline.costs.prediction import REPLAYED, REPLAYED_CELLS, Cluster, forecast
from pipeline.costs.rates import ALONE, Affine, ForecastError, Measurement, Mode, Throughput, packed
from pipeline.costs.throughput import measure, shapes_to_measure
from pipeline.forecast import number
from pipeline.search.cells import build_cells, defined_cells, model_costs
from tests.helpers import ROOT, make_cell, write_params
from tests.helpers.without import run_without

TASKS = "tasks: [" + ", ".join(tasks.TASKS) + "]\n"  # every registered task, as params.yaml lists them
# 2 architectures x 2 widths on one dataset: 4 trials of 8 steps of 32 sequences, on a CPU profile, as many at once as
# the CPUs hold (tiny runs one at a time)
FOUR = ("sweep: {grid: {architectures: [standard, lstm], widths: [8, 16], datasets: {arithmetic: [2]}}, "
        "resources: {max_concurrent_trials: null}}\n")


def load(tmp_path, profile: str, overrides: str = "") -> Config:
    return load_config(write_params(tmp_path / "params.yaml", f"profile: {profile}\n{TASKS}{overrides}"))


def costed(cfg: Config) -> dict:
    return {at: replace(c, **model_costs(c, cfg.sweep.model.heads)) for at, c in defined_cells(cfg).items()}


def grid_flops(cfg: Config) -> float:
    """Training FLOPs of every (cell, learning rate) at its first budget, summed here from the config alone."""
    s, total = cfg.sweep, 0.0
    for task, size in cfg.sweep_datasets():
        gen = cfg.generate.for_task(task)
        built = tasks.get_task(task, size, **gen.task_params.get(task, {}))
        per_epoch = math.ceil(gen.train_samples / s.optim.batch_size)
        steps = s.optim.max_steps if s.optim.max_steps > 0 else s.optim.epochs * per_epoch
        for arch in s.grid.architectures_for(task):
            for width in s.grid.widths_for(arch):
                for depth in s.grid.depths_for(arch):
                    with torch.device("meta"):
                        model = models.build_model(arch, vocab_size=built.vocab_size, width=width, depth=depth,
                                                   heads=s.model.heads, max_len=built.max_length(),
                                                   **s.grid.arch_options.get(arch, {}))
                    forward = model.exact_flops(built.max_length())
                    runs = len(s.search.learning_rates(arch)) * len(s.grid.seeds)
                    total += 3 * forward * steps * s.optim.batch_size * runs
    return total


@pytest.mark.parametrize("profile, overrides", [
    ("tiny", ""),  # a step budget
    ("paper", "sweep: {grid: {datasets: {lis: [40], ed: [6]}, widths: [32, 64]}}\n"),  # epochs of 1M samples, two tasks
])
def test_the_grids_flops_are_the_sum_over_its_cells(tmp_path, profile, overrides):
    cfg = load(tmp_path, profile, overrides)
    cells = costed(cfg)
    archs = {c.arch for c in cells}
    fc = forecast(cfg, cells, Throughput("test", {a: {0: 1e12} for a in archs}), Cluster(2, 8, "H100", 64))
    assert fc.cells == len(cells) and fc.trials == len(cells)  # one learning rate each
    assert fc.grid.pflops * 1e15 == pytest.approx(grid_flops(cfg), rel=1e-9)
    assert fc.extended.pflops == pytest.approx(fc.grid.pflops * cfg.sweep.verdict.max_budget_factor)
    # at 1 TFLOP/s a trial takes its FLOPs / 1e12 seconds, one GPU (or CPU) each
    per_hour = cfg.sweep.resources.gpus_per_trial or cfg.sweep.resources.cpus_per_trial
    assert fc.grid.device_hours == pytest.approx(grid_flops(cfg) / 1e12 / 3600 * per_hour)


def test_the_cells_are_the_sweeps_before_any_data_exists(tiny_cfg, tiny_data):
    """The cells a forecast counts are the ones the sweep builds from the files; L is the task's longest sequence,
    the files' own but for arithmetic, where it is the bound the files stay within."""
    built, defined = build_cells(tiny_cfg, tiny_data), defined_cells(tiny_cfg)
    assert list(built) == list(defined)
    for at, cell in built.items():
        mine = defined[at]
        assert (mine.vocab, mine.family, mine.train_samples, mine.lrs) == (cell.vocab, cell.family,
                                                                          cell.train_samples, cell.lrs)
        assert mine.max_len == cell.max_len if at.task != "arithmetic" else mine.max_len >= cell.max_len


def test_a_throughput_file_gives_the_wall_time_it_implies(tmp_path, capsys):
    """Rates set so that the four trials take 4, 3, 2 and 1 hours: on one CPU slot 10 h; on two, longest first,
    4 + 1 and 3 + 2 = 5 h; on four, 4 h; 10 core-hours each time; extended 2x, all doubled."""
    cfg = load(tmp_path, "tiny", FOUR)
    cells = costed(cfg)
    hours = {("standard", 16): 4, ("lstm", 16): 3, ("standard", 8): 2, ("lstm", 8): 1}
    s = cfg.sweep
    rates: dict = {}
    for c in cells.values():
        rates.setdefault(c.arch,
                         {})[str(c.width)] = 3 * c.exact_gflops * 1e9 * s.optim.max_steps * s.optim.batch_size / (
            hours[c.arch, c.width] * 3600)
    path = tmp_path / "throughput.json"
    path.write_text(json.dumps({"device": "made-up", "flops_per_s": rates}))
    throughput = Throughput.load(path, ["standard", "lstm"])
    for slots, wall in ((1, 10), (2, 5), (4, 4)):
        fc = forecast(cfg, cells, throughput, Cluster(1, 0, None, slots))
        assert (fc.slots, fc.grid.wall_hours, fc.grid.device_hours) == (slots, pytest.approx(wall), pytest.approx(10))
        assert (fc.extended.wall_hours, fc.extended.device_hours) == (pytest.approx(2 * wall), pytest.approx(20))
    params = tmp_path / "params.yaml"
    assert pipeline.forecast.main(["--params", str(params), "--throughput", str(path), "--cpus-per-node", "2"]) == 0
    out = capsys.readouterr().out
    assert "cells: 4 " in out and "throughput (from" in out and "1 node x 2 CPUs = 2 trial slots" in out
    assert "Many trials a GPU" not in out  # a CPU profile's trials share no GPU
    assert [line.split()[-2:] for line in out.splitlines() if line.startswith("grid, ")] == [["5.0", "h"],
                                                                                           ["10.0", "h"]]
    # from a file the forecast measures nothing: it runs without Lightning (seconds of imports), Ray or MLflow
    done = run_without("pipeline.forecast", "--params", str(params), "--throughput", str(path), "--cpus-per-node", "2",
                       blocked="lightning,ray,mlflow,dvc", timeout=120)
    assert done.returncode == 0 and done.stdout == out, done.stderr[-2000:]


def test_a_run_is_priced_trial_by_trial_at_the_steps_each_trained(tmp_path, capsys):
    """--against a run's trials.csv: each trial it trained priced at its own steps (here at one made-up rate for
    every architecture, so a trial of S steps costs S x its step's FLOPs / the rate), beside its seconds; reused
    trials and those that trained no step left out; a file that is not a trials table, or a trial of another grid,
    named before any compute."""
    cfg = load(tmp_path, "tiny", FOUR)
    cells, s = costed(cfg), cfg.sweep
    rate = 1e9
    path = tmp_path / "throughput.json"
    path.write_text(json.dumps({"device": "made-up", "flops_per_s": {a: rate for a in ("standard", "lstm")}}))
    rows = []
    for k, (at, cell) in enumerate(sorted(cells.items())):
        steps = 4 * (k + 1)
        took = 2 * 3 * cell.exact_gflops * 1e9 * steps * s.optim.batch_size / rate  # twice the forecast's
        rows.append(at._asdict() | {"lr": 3e-3, "train_steps": steps, "train_seconds": took, "reused_from": ""})
    rows.append(rows[0] | {"reused_from": "abc"})  # reused: not trained by this run
    rows.append(rows[0] | {"train_steps": 0})  # failed before its first step
    trials = tmp_path / "trials.csv"
    pd.DataFrame(rows).to_csv(trials, index=False)
    params = str(tmp_path / "params.yaml")
    argv = ["--params", params, "--throughput", str(path), "--against", str(trials), "--cpus-per-node", "2"]
    assert pipeline.forecast.main(argv) == 0
    out = capsys.readouterr().out.split(f"against {trials}: each trial it trained, priced at the steps it trained\n")[1]
    lines = out.strip().splitlines()
    assert len(lines) == 1 + len(cells) + 2 and all(line.endswith("  0.50") for line in lines[1:-2])
    assert lines[-2].startswith(f"  in all: {len(cells)} trials, forecast ") and lines[-2].endswith("(0.50); trial by "
                                                                                                  "trial 0.50 to 0.50")
    # on 2 slots, the trials in the searcher's order (the largest expected cost first), each on the slot free first
    slots = [0.0, 0.0]
    for row in sorted(rows[: len(cells)], key=lambda r: -cells[Cell(*(r[k] for k in Cell._fields))].exact_gflops):
        slots[slots.index(min(slots))] += row["train_seconds"] / 2
    assert lines[-1] == f"  on 2 slots, handed out as the sweep hands them out: {max(slots):.1f} s"
    (tmp_path / "sweep.json").write_text(json.dumps({"wall_seconds": 600.0}))  # the run's summary beside it
    assert pipeline.forecast.main(argv) == 0
    said = f"{max(slots):.1f} s (the sweep took 10.0 min: {tmp_path / 'sweep.json'})"
    assert capsys.readouterr().out.rstrip().endswith(said)
    pd.DataFrame(rows).drop(columns="train_seconds").to_csv(trials, index=False)
    other = pd.DataFrame([rows[0] | {"width": 999}])
    for table, named in ((None, "not a sweep's results/trials.csv (no train_seconds column)"),
                         (other, "is not a cell of profile tiny with these overrides")):
        if table is not None:
            table.to_csv(trials, index=False)
        assert pipeline.forecast.main(argv) == 2
        assert named in capsys.readouterr().err


def test_a_width_between_two_measured_takes_their_log_log_interpolation():
    throughput = Throughput("made-up", {"standard": {32: 1e12, 128: 4e12}, "lstm": {0: 5e11}})
    assert throughput.rate("standard", 64) == pytest.approx(2e12)  # halfway on log axes
    assert throughput.rate("standard", 16) == 1e12 and throughput.rate("standard", 1024) == 4e12  # the nearest
    assert throughput.rate("lstm", 64) == throughput.rate("lstm", 1024) == 5e11  # one number: every width


def test_the_replayed_savings_are_the_benchmarks_file():
    """The first draw of every ratio the forecast divides by is the one docs/benchmarks/bench_frontier.json holds,
    replayed on a grid with the profile's number of cells."""
    sections = json.loads((ROOT / "docs/benchmarks/bench_frontier.json").read_text())["sections"]
    for profile, strategies in REPLAYED.items():
        section = sections[f"replay {profile}"]
        assert section["settings"]["cells"] == REPLAYED_CELLS[profile]
        assert len(defined_cells(load_config(profile=profile))) == REPLAYED_CELLS[profile]
        for name, ratios in strategies.items():
            assert ratios[0] == round(section["figures"][name]["grid_over_strategy"]["median"], 2), (profile, name)


def test_a_search_is_forecast_as_the_grid_over_its_replayed_savings_and_says_it_is_modelled(tmp_path, capsys):
    cfg = load(tmp_path, "paper",
               "sweep: {grid: {datasets: {lis: [40]}, widths: [32, 64]}, search: {strategy: frontier}}\n")
    fc = forecast(cfg, costed(cfg), Throughput("made-up", {a: {0: 1e14} for a in cfg.sweep.grid.architectures}),
                  Cluster(1, 8, "H100", None))
    frontier = next(f for f in fc.searches if f.strategy == "frontier")
    assert frontier.first.pflops == pytest.approx(fc.grid.pflops / 4.82)
    assert frontier.extended.pflops == pytest.approx(fc.extended.pflops / 4.82)
    assert frontier.first.wall_hours == pytest.approx(frontier.first.device_hours / 8)  # perfect packing on 8 GPUs
    assert fc.search == "frontier" and fc.shape_differs  # 12 cells, not the 576 replayed
    path = tmp_path / "h100.json"
    path.write_text(json.dumps({"device": "NVIDIA H100",
                                "flops_per_s": {a: 1e14 for a in cfg.sweep.grid.architectures}}))
    params = str(tmp_path / "params.yaml")
    assert pipeline.forecast.main(["--params", params, "--throughput", str(path), "--gpu", "H100"]) == 0
    out = capsys.readouterr().out
    assert "MODELLED, not measured" in out and "bench_frontier --synthetic paper" in out
    assert "frontier *" in out and "NOTE: this grid has 12 cells" in out
    assert "NOTE: throughput measured on" not in out  # it was the cluster's kind of GPU


def test_bad_input_is_named_before_any_compute(tmp_path, capsys, monkeypatch):
    def computed(*args, **kwargs):
        raise AssertionError("computed before the input was checked")

    monkeypatch.setattr(pipeline.forecast, "model_costs", computed)
    monkeypatch.setattr(pipeline.costs.throughput, "measure_all", computed)  # imported when the forecast measures
    lstm_only = tmp_path / "lstm.json"
    lstm_only.write_text(json.dumps({"device": "x", "flops_per_s": {"lstm": 1e12}}))
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"device": "x", "flops_per_s": {"lstm": -1}}))
    for argv, named in [
        (["--profile", "nope"], "profile: 'nope' is not allowed; allowed values: cpu-claims, cpu-repro, laptop, paper"),
        (["--profile", "tiny", "--throughput", str(tmp_path / "missing.json")], "missing.json: no such file"),
        (["--profile", "tiny", "--throughput", str(lstm_only)], "has no throughput for standard, sparse, linear"),
        (["--profile", "tiny", "--throughput", str(broken)], "lstm: -1: a rate is a positive, finite FLOP/s"),
        (["--profile", "paper", "--cpus-per-node", "2"], "a trial needs 1 GPU(s) and 4 CPU(s)"),
        (["--profile", "paper", "--device", "cpu", "--precision", "16-mixed"], "16-mixed needs a GPU"),
    ]:
        assert pipeline.forecast.main(argv) == 2, argv
        assert named in capsys.readouterr().err
    for argv, named in [(["--nodes", "0"], "argument --nodes: 0 is below 1"),
                        (["--measure-steps", "x"], "argument --measure-steps: invalid positive value: 'x'")]:
        with pytest.raises(SystemExit) as stop:
            pipeline.forecast.main(argv)
        assert stop.value.code == 2 and named in capsys.readouterr().err


def test_measure_counts_the_model_flops_of_real_steps(tiny_cfg):
    """One architecture's throughput: the FLOPs of its timed steps are 3 x its exact forward FLOPs x the sequences
    (equal length, no padding), as a trial counts them."""
    cell = next(c for c in costed(tiny_cfg).values() if c.arch == "standard")
    m = measure(tiny_cfg, cell, length=12, batch=8, steps=2, warmup=1, device=torch.device("cpu"),
                precision="32-true")
    with torch.device("meta"):
        model = models.build_model("standard", vocab_size=cell.vocab_size, width=cell.width, depth=cell.depth,
                                   heads=tiny_cfg.sweep.model.heads, max_len=12)
    assert m.micro_batches == 1 and m.seconds > 0  # no memory budget on a CPU: the whole batch at once
    assert m.flops_per_s * m.seconds == pytest.approx(3 * model.exact_flops(12) * 8 * 2)
    assert m.mode == ALONE
    # then one validation as the trial validates, of one evaluation batch at most
    e = tiny_cfg.sweep.evaluation
    assert m.validation_samples == min(e.val_samples, e.eval_batch_size) and m.validation_seconds > 0
    graphed = measure(tiny_cfg, cell, length=12, batch=8, steps=1, warmup=1, device=torch.device("cpu"),
                      precision="32-true", step="graphed")
    assert graphed.step == "eager"  # CUDA graphs need a GPU: the step ran eager, and the measurement says so
    # three learning rates as one fused trial, as the sweep trains them: every member's FLOPs
    fused = measure(tiny_cfg, cell, length=12, batch=8, steps=2, warmup=1, device=torch.device("cpu"),
                    precision="32-true", models=3)
    assert fused.mode == Mode(models=3) and fused.flops_per_s * fused.seconds == pytest.approx(
        3 * 3 * model.exact_flops(12) * 8 * 2)
    assert fused.validation_seconds > 0
    unvalidated = measure(tiny_cfg, cell, length=12, batch=8, steps=1, warmup=1, device=torch.device("cpu"),
                          precision="32-true", validate=False)
    assert (unvalidated.validation_samples, unvalidated.validation_seconds) == (0, 0.0)


def test_cpu_trials_measured_side_by_side_count_the_same_flops_each_in_its_own_process(tiny_cfg):
    """A CPU machine's trial slots measured at once (``measure_side_by_side``: two processes, started together at
    each shape): one measurement a cell, of its shape, with the FLOPs of the steps as one trial counts them."""
    from pipeline.costs.throughput import measure_side_by_side

    cells = [c for c in costed(tiny_cfg).values() if c.arch in ("standard", "lstm") and c.seed == 0][:2]
    settings = dict(length=12, batch=8, steps=2, warmup=1, device=torch.device("cpu"), precision="32-true",
                    step="eager")  # fmt: skip
    done = measure_side_by_side(tiny_cfg, cells, 2, settings)
    assert [(m.arch, m.width, m.length) for m in done] == [(c.arch, c.width, 12) for c in cells]
    for m, cell in zip(done, cells, strict=True):
        with torch.device("meta"):
            model = models.build_model(cell.arch, vocab_size=cell.vocab_size, width=cell.width, depth=cell.depth,
                                       heads=tiny_cfg.sweep.model.heads, max_len=12)
        assert m.flops_per_s * m.seconds == pytest.approx(3 * model.exact_flops(12) * 8 * 2)


def test_the_command_runs_on_tiny_with_its_throughput_measured_on_this_cpu(tmp_path, capsys):
    saved = tmp_path / "cpu.json"
    assert pipeline.forecast.main(["--profile", "tiny", "--measure-steps", "1", "--save-throughput", str(saved)]) == 0
    measured = capsys.readouterr().out
    assert "cells: 44 (task x size x architecture x width x depth x seed)" in measured
    assert "trials: 44" in measured and "throughput (measured now, saved to" in measured and "on cpu (" in measured
    assert "the configured search is the grid" in measured
    grid = [line for line in measured.splitlines() if line.startswith("grid, first budget")]
    assert len(grid) == 1 and "44" in grid[0]
    assert pipeline.forecast.main(["--profile", "tiny", "--throughput", str(saved)]) == 0  # the same rates, read back
    again = capsys.readouterr().out
    assert [line for line in again.splitlines() if line.startswith("grid, ")] == [
        line for line in measured.splitlines() if line.startswith("grid, ")]
    assert "width 8 (depth 1, L=" in again  # how each rate was measured travels with the file


# ---- rates: measured, or an affine fit; many trials a GPU charged as measured ----------------------------------
# a separations-shaped GPU grid, small: 2 architectures x 3 widths x 2 depths on one dataset, 7 learning rates each
SMALL_GPU = ("sweep: {grid: {architectures: [transformer, lstm], widths: [64, 128, 256], depths: [1, 2], arch_depths: "
             "{lstm: [1, 2]}, datasets: {index_lookup: [20]}}, search: {strategy: grid}}\n")
FAST, SLOW = (2e-3, 5e-4, 1e14), (3e-3, 6e-4, 5e13)  # (fixed s, s a layer, FLOP/s): two made-up step laws


def seconds(law, depth: int, flops: float) -> float:
    fixed, per_layer, rate = law
    return fixed + per_layer * depth + flops / rate


def lawful(arch, width, depth, flops, law, mode=ALONE, length=100, batch=64) -> Measurement:
    """A measurement of 4 steps that took exactly what ``law`` says, of ``mode.trials`` trials of ``flops`` a step."""
    t = seconds(law, depth, flops)
    return Measurement(arch, width, depth, length, batch, 1, "bf16-mixed", 4, 4 * t, flops / t * mode.trials,
                       mode.models, mode.processes, mode.step)


def measured_by(law, archs=("transformer", "lstm"), mode=ALONE, widths=(64, 128, 512), depths=(1, 6)) -> list:
    return [lawful(a, w, d, 1e6 * w * w * d, law, mode) for a in archs for w in widths for d in depths]


def step_flops(cell, s) -> float:
    """One trial's training FLOPs a step, from the config and the model alone."""
    return 3 * cell.exact_gflops * 1e9 * s.optim.batch_size


def test_the_affine_fit_finds_the_fixed_cost_the_cost_a_layer_and_the_rate():
    fit = Affine.fit(measured_by(FAST, archs=("transformer",)))
    assert isinstance(fit, Affine)
    assert (fit.fixed, fit.per_layer, fit.rate) == (pytest.approx(2e-3), pytest.approx(5e-4), pytest.approx(1e14))
    assert fit.worst < 1e-9 and fit.widths == (64, 128, 512) and fit.depths == (1, 6)
    # one depth but two lengths: its cost a layer is in the fixed cost
    one_depth = [lawful("t", w, 2, 1e6 * w * w * n, FAST, length=n) for w in (64, 128, 512) for n in (100, 400)]
    fit = Affine.fit(one_depth)
    assert isinstance(fit, Affine) and fit.per_layer == 0 and fit.fixed == pytest.approx(2e-3 + 2 * 5e-4)
    assert "it needs 3 widths or more" in Affine.fit(measured_by(FAST, archs=("t",), widths=(64, 512)))
    assert "2 depths or lengths or more" in Affine.fit(measured_by(FAST, archs=("t",), depths=(1,)))
    flat = [replace(m, seconds=0.02) for m in measured_by(FAST, archs=("t",))]  # the same time at every FLOP count
    assert "do not grow with the steps' FLOPs" in Affine.fit(flat)


def test_a_trials_rate_is_its_own_shape_measured_then_the_fit_then_its_width():
    exact = lawful("transformer", 64, 1, 5e9, SLOW, length=102)  # its own shape, off the fitted law
    throughput = Throughput.of_measured("GPU", [*measured_by(FAST), exact])
    shape = (64, 1, 102, 64)
    price = throughput.price("transformer", ALONE, shape, 10, 10 * 5e9)
    assert price == (pytest.approx(10 * seconds(SLOW, 1, 5e9)), "measured")
    other, fit = throughput.price("transformer", ALONE, (256, 2, 102, 64), 10, 10 * 7e9), throughput.affine(
        "transformer", ALONE)
    assert other.source == "affine" and other.seconds == pytest.approx(10 * fit.step_seconds(2, 7e9))
    assert fit.worst > 0.05  # the odd point is in the fit too: a measured shape's own rate goes before it
    two = Throughput.of_measured("GPU", measured_by(FAST, widths=(64, 512)))  # no fit: a width's rate, or between
    assert two.price("lstm", ALONE, (64, 2, 102, 64), 10, 1e12).source == "width measured"
    assert two.price("lstm", ALONE, (128, 2, 102, 64), 10, 1e12).source == "interpolated"
    assert two.basis("lstm", ALONE, [64, 128]) == "rates" and two.basis("lstm", Mode(7), [64]) is None


def test_the_grid_on_a_fit_costs_the_sum_of_its_trials_steps(tmp_path, capsys):
    cfg = load(tmp_path, "separations", SMALL_GPU)
    cells, s = costed(cfg), cfg.sweep
    alone = Throughput.of_measured("H100", measured_by(FAST))
    fc = forecast(cfg, cells, alone, Cluster(1, 8, "H100", None))
    steps = s.optim.max_steps
    hours = sum(7 * steps * seconds(FAST, c.depth, step_flops(c, s)) for c in cells.values()) / 3600
    assert fc.grid.device_hours == pytest.approx(hours) and fc.configured.sources == {"affine": fc.trials}
    assert [p.mode for p in fc.modes] == [ALONE]
    # one trial a GPU the only way measured: the forecast says the others are not, and what measures them
    alone.dump(tmp_path / "alone.json")
    assert pipeline.forecast.main(["--params", str(tmp_path / "params.yaml"), "--throughput",
                                   str(tmp_path / "alone.json"), "--gpu", "H100"]) == 0
    out = capsys.readouterr().out
    assert "no rate measured that way, so none is" in out and f"`{pipeline.forecast.PACK_COMMAND}` measures" in out


def test_a_trials_validations_are_priced_at_what_its_validation_measured(tmp_path, capsys):
    """Every measured shape validated 100 sequences in R seconds a sequence for each second of its step: a trial
    validating every 50 steps on 1,000 sequences costs its steps plus steps // 50 x 1,000 x R x its own step's
    seconds (the nearest measured shape scaled by the two steps' ratio). Measured nowhere: unpriced, and said so."""
    every = SMALL_GPU.replace("{strategy: grid}}", "{strategy: grid}, evaluation: {val_samples: 1000, "
                              "val_every_steps: 50}}")
    cfg = load(tmp_path, "separations", every)
    cells, s = costed(cfg), cfg.sweep
    ratio = 0.01
    validated = [replace(m, validation_samples=100, validation_seconds=100 * ratio * m.step_seconds)
                 for m in measured_by(FAST)]
    fc = forecast(cfg, cells, Throughput.of_measured("H100", validated), Cluster(1, 8, "H100", None))
    steps = s.optim.max_steps
    train = sum(7 * steps * seconds(FAST, c.depth, step_flops(c, s)) for c in cells.values())
    checks = sum(7 * (steps // 50) * 1000 * ratio * seconds(FAST, c.depth, step_flops(c, s)) for c in cells.values())
    assert fc.grid.device_hours == pytest.approx((train + checks) / 3600)
    assert fc.configured.validating == pytest.approx(checks / (train + checks)) and fc.configured.unvalidated == 0
    unpriced = forecast(cfg, cells, Throughput.of_measured("H100", measured_by(FAST)), Cluster(1, 8, "H100", None))
    assert unpriced.grid.device_hours == pytest.approx(train / 3600) and unpriced.configured.unvalidated == fc.trials
    share = f"{checks / (train + checks):.0%}"
    for throughput, says in ((validated, f"validation: every 50 steps on 1,000 sequences, {share} of the trials' time"),
                             (measured_by(FAST), "validation: NOT PRICED: no")):
        Throughput.of_measured("H100", throughput).dump(tmp_path / "t.json")
        assert pipeline.forecast.main(["--params", str(tmp_path / "params.yaml"), "--throughput",
                                       str(tmp_path / "t.json"), "--gpu", "H100"]) == 0
        assert says in capsys.readouterr().out


def test_packed_processes_are_charged_at_their_measured_rate_else_as_no_faster_than_alone(tmp_path, capsys):
    """gpus_per_trial 0.25: four processes a GPU. Measured packed (each process's step at SLOW's law), the GPU-hours
    are a quarter of the processes' hours; not measured, the trials are charged alone, each on a quarter of a GPU:
    the same GPU-hours as one trial a GPU, and said so."""
    packed = SMALL_GPU.replace("{strategy: grid}}", "{strategy: grid}, resources: {gpus_per_trial: 0.25}}")
    cfg = load(tmp_path, "separations", packed)
    cells, s = costed(cfg), cfg.sweep
    four = Mode(processes=4)
    packed_ = Throughput.of_measured("H100", measured_by(FAST) + measured_by(SLOW, mode=four))
    fc = forecast(cfg, cells, packed_, Cluster(1, 8, "H100", None))
    trial_hours = {at: s.optim.max_steps * seconds(SLOW, c.depth, step_flops(c, s)) / 3600 for at, c in cells.items()}
    alone_hours = {at: s.optim.max_steps * seconds(FAST, c.depth, step_flops(c, s)) / 3600 for at, c in cells.items()}
    assert fc.configured.mode == four and fc.configured.slots == 32 and not fc.configured.alone
    assert fc.grid.device_hours == pytest.approx(sum(7 * h / 4 for h in trial_hours.values()))
    alone = next(p for p in fc.modes if p.mode == ALONE)
    assert alone.slots == 8 and alone.row.device_hours == pytest.approx(7 * sum(alone_hours.values()))
    unmeasured = forecast(cfg, cells, Throughput.of_measured("H100", measured_by(FAST)), Cluster(1, 8, "H100", None))
    assert unmeasured.configured.alone == ["transformer", "lstm"]
    assert unmeasured.grid.device_hours == pytest.approx(alone.row.device_hours)  # no gain assumed
    assert unmeasured.grid.wall_hours > alone.row.wall_hours  # each trial 4x as long, on 4x the slots
    path = tmp_path / "packed.json"
    packed_.dump(path)
    params = str(tmp_path / "params.yaml")
    assert pipeline.forecast.main(["--params", params, "--throughput", str(path), "--gpu", "H100"]) == 0
    out = capsys.readouterr().out
    assert "transformer  4 processes a GPU, eager: MODELLED, affine: 3 ms + 0.6 ms a layer" in out
    assert "4 processes a GPU, eager *" in out and "one trial alone, eager" in out and "so none is" not in out
    assert f"rates: {fc.trials} trials MODELLED by the affine fit" in out
    table = [line.replace(" *", "").split(", eager")[1].split()[:2] for line in out.splitlines()
             if line.startswith(("one trial alone", "4 processes"))]  # slots, GPU-hours
    assert table == [["8", number(alone.row.device_hours)], ["32", number(fc.grid.device_hours)]]


def test_fused_models_are_charged_as_one_job_a_cell_and_an_architecture_without_is_charged_alone(tmp_path):
    cfg = load(tmp_path, "separations", SMALL_GPU)
    cells, s = costed(cfg), cfg.sweep
    seven = Mode(models=7, step="graphed")
    # lstm's fused step measured too, but the sweep cannot fuse it (no batching rule): charged alone all the same
    fused = Throughput.of_measured("H100", measured_by(FAST) + measured_by(SLOW, mode=seven))
    fc = forecast(cfg, cells, fused, Cluster(1, 8, "H100", None))
    row = next(p for p in fc.modes if p.mode == seven)
    hours = sum(s.optim.max_steps * (seconds(SLOW, c.depth, step_flops(c, s)) if c.arch == "transformer" else
                               7 * seconds(FAST, c.depth, step_flops(c, s))) for c in cells.values()) / 3600
    assert row.alone == ["lstm"] and row.row.device_hours == pytest.approx(hours)
    assert row.sources == {"affine": fc.trials} and row.row.pflops == pytest.approx(fc.grid.pflops)
    assert str(seven) == "7 fused a step, graphed" and str(Mode(2, 3)) == "2 fused a step x 3 processes a GPU, eager"
    # the profile's own way, read from its settings: sweep.resources.fuse and step
    fusing = load(tmp_path, "separations", SMALL_GPU.replace(
        "{strategy: grid}}", "{strategy: grid}, resources: {fuse: learning_rates, step: graphed}}"))
    configured = forecast(fusing, costed(fusing), fused, Cluster(1, 8, "H100", None)).configured
    assert configured.mode == seven and configured.row.device_hours == pytest.approx(hours)


def test_old_throughput_files_still_load_as_one_trial_alone_and_bad_measurements_are_named(tmp_path):
    for profile in ("paper", "separations"):
        path = ROOT / f"docs/benchmarks/throughput-{profile}.json"
        old = Throughput.load(path, [])
        assert old.modes() == [ALONE] and all(m.mode == ALONE for m in old.measured)
        assert {a: sorted(w) for a, w in old.rates.items()} == {a: sorted(w) for a, w in
                                                                Throughput.of_measured("x", old.measured).rates.items()}
    good = asdict(lawful("lstm", 64, 1, 1e9, FAST))
    for change, named in [({"models": 0}, "models 0 and processes 1 are at least 1"),
                          ({"step": "warp"}, "step 'warp' one of eager, compiled, graphed"),
                          ({"seconds": -1.0}, "must be positive and finite"),
                          ({"validation_samples": 8}, "a validation measured has samples and seconds above 0"),
                          ({"shape": 3}, "not a throughput file")]:
        path = tmp_path / "bad.json"
        path.write_text(json.dumps({"device": "x", "flops_per_s": {"lstm": 1e12}, "measured": [good | change]}))
        with pytest.raises(ForecastError, match=re.escape(named)):
            Throughput.load(path, ["lstm"])


def test_processes_measured_together_are_one_packed_measurement_and_the_default_shapes_fit():
    each = [lawful("lstm", 64, 1, 1e9, FAST), replace(lawful("lstm", 64, 1, 1e9, FAST), seconds=0.5)]
    both = packed(each)
    assert (both.processes, both.seconds, both.flops_per_s) == (2, 0.5, each[0].flops_per_s + each[1].flops_per_s)
    with pytest.raises(ValueError, match="different shapes"):
        packed([each[0], replace(each[0], width=128)])
    cells = [make_cell(arch="lstm", width=w, depth=d) for w in (64, 128, 256, 512) for d in (1, 2, 3)]
    assert shapes_to_measure(cells, None, None, gpu=True) == [(64, 1), (512, 1), (256, 1), (64, 3), (512, 3)]
    assert shapes_to_measure(cells, None, None, gpu=False) == [(64, 1)]
    assert shapes_to_measure(cells, [64, 128], [2], gpu=True) == [(64, 2), (128, 2)]


def test_the_h200s_measured_file_forecasts_every_way_it_measured(tmp_path):
    """docs/benchmarks/throughput-separations-h200.json, bench_pack's part 5 on an H200 (docs/gpu.md): it loads, with
    one trial alone, 7 fused (eager, graphed) and 8 packed a GPU, and the fused graphed grid costs less than alone."""
    cfg = load(tmp_path, "separations", SMALL_GPU)
    measured = Throughput.load(ROOT / "docs/benchmarks/throughput-separations-h200.json", ["transformer", "lstm"])
    assert {str(m) for m in measured.modes()} >= {"one trial alone, eager", "7 fused a step, eager",
                                                  "7 fused a step, graphed", "8 processes a GPU, eager"}  # fmt: skip
    fc = forecast(cfg, costed(cfg), measured, Cluster(4, 8, "H200", None))
    hours = {str(p.mode): p.row.device_hours for p in fc.modes}
    assert hours["7 fused a step, graphed"] < hours["one trial alone, eager"]
