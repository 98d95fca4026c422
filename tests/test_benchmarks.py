import contextlib
import json
import multiprocessing
import time
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

import models
from benchmarks import bench_fused, bench_gpu, bench_models, bench_pack, results
from pipeline.costs.rates import ALONE, Mode, Throughput
from pipeline.forecast import main as forecast_main
from tests.helpers import write_params
from tests.helpers.tables import recorded_grid
from tests.helpers.without import run_without

SECTION_KEYS = {"command", "date", "commit", "dirty", "machine", "settings", "figures"}
FIGURE_KEYS = {"median", "min", "max", "values", "unit"}


def read_results(path, benchmark: str) -> dict:
    """The sections of a benchmark's results file, each checked to say how it was measured."""
    data = json.loads(path.read_text())
    assert data["benchmark"] == benchmark
    for section in data["sections"].values():
        assert SECTION_KEYS <= section.keys()
        assert section["command"].startswith(f"python -m benchmarks.{benchmark}")
        assert len(section["commit"]) == 40 or section["commit"] == "unknown"
    return data["sections"]


def is_figure(f) -> bool:
    """A figure: the median of its repeated values, with their spread."""
    return FIGURE_KEYS <= f.keys() and f["min"] <= f["median"] <= f["max"] and len(f["values"]) >= 1


@pytest.mark.slow
def test_model_benchmark_quick_path_runs_every_section(capsys, tmp_path):
    """The benchmark at toy sizes (about 95 s, bench_memory generating its data included): every architecture
    trains, cached decoding agrees token for token with recomputation, every section prints, and every section's
    figures are written, the memory's beside the rest."""
    bench_models.main(["--quick", "--out", str(tmp_path / "models.json")])
    out = capsys.readouterr().out
    for section in ("training tokens/s", "local attention at L=256", "a classification's step", "greedy decoding",
                    "CPU peak", "training utilisation", "memory"):
        assert section in out
    assert " NO " not in out  # "same tokens" column
    sections = read_results(tmp_path / "models.json", "bench_models")
    assert set(sections) == {"training", "local_attention", "answers", "decoding", "peak", "utilisation"}
    assert all(f["same_tokens"] for f in sections["decoding"]["figures"].values() if "same_tokens" in f)
    assert is_figure(read_results(tmp_path / "bench_memory.json", "bench_memory")["trial"]["figures"]
                     ["training_peak_VmHWM"])


@pytest.mark.slow  # over 10 s on 2 cores: the fast tier stays a developer's loop
def test_fused_benchmark_quick_times_both_sides_for_every_architecture(capsys, tmp_path):
    """bench_fused --quick: a row per architecture, K separate steps and the fused one each timed, their ratio, and
    what runs member by member said in the row."""
    bench_fused.main(["--quick", "--out", str(tmp_path / "fused.json")])
    figures = read_results(tmp_path / "fused.json", "bench_fused")["cpu"]["figures"]
    assert set(figures) == {f"{arch}_w16" for arch in bench_fused.ARCHS}
    for row in figures.values():
        assert all(is_figure(row[k]) and row[k]["median"] > 0 for k in ("separate_s", "fused_s", "ratio"))
        assert row["ratio"]["median"] == pytest.approx(row["separate_s"]["median"] / row["fused_s"]["median"])
    assert figures["lstm_w16"]["notes"] and figures["transformer_w16"]["notes"] and not figures["mamba_w16"]["notes"]
    assert "nn.LSTM has no vmap batching rule" in capsys.readouterr().out


@pytest.mark.slow  # about 10 s on 2 cores
def test_restack_benchmark_quick_drops_the_frozen_members_and_keeps_every_record(tmp_path):
    """bench_restack --quick: restacked whatever it costs, the fused trial takes two fits where it kept its frozen
    members in one, every member's record the same both ways (the benchmark stops otherwise), both sides timed."""
    from benchmarks import bench_restack

    assert bench_restack.main(["--quick", "--out", str(tmp_path / "restack.json")]) == 0
    row = read_results(tmp_path / "restack.json", "bench_restack")["cpu"]["figures"]["trial"]
    assert row["fits_dropped"] == [2] and all(is_figure(row[k]) for k in ("dropped_s", "kept_s", "ratio"))


@pytest.mark.slow  # over 10 s on 2 cores: the fast tier stays a developer's loop
def test_gpu_benchmark_quick_runs_every_architecture_on_this_device(capsys, tmp_path):
    """bench_gpu --quick on a CPU (a GPU run is the same code): a row per architecture with tokens/s, utilisation
    and the micro-batch, written with how it was measured; nothing fits in a budget below one sample."""
    bench_gpu.main(["--quick", "--repeats", "1", "--out", str(tmp_path / "gpu.json")])
    out = capsys.readouterr().out
    figures = read_results(tmp_path / "gpu.json", "bench_gpu")["quick"]["figures"]
    assert set(figures) == set(models.ARCHITECTURES)
    for arch, row in figures.items():
        assert is_figure(row["tokens_per_s"]) and row["tokens_per_s"]["median"] > 0 and 0 < row["mfu"]["median"] < 100
        assert row["micro_batches"] == 1 and f"{arch} " in out
    bench_gpu.main(["--quick", "--repeats", "1", "--archs", "standard", "--memory-gb", "0.1",
                    "--out", str(tmp_path / "gpu.json")])
    assert read_results(tmp_path / "gpu.json", "bench_gpu")["quick"]["figures"]["standard"]["micro_batches"] > 1


def test_gpu_benchmark_measures_each_kernel_beside_its_torch_form_and_writes_row_by_row(capsys, tmp_path, monkeypatch):
    """Where the Triton kernels run, a scan's torch form gets its own row beside the kernel's, with the kernel's
    speed-up printed (the loop checked on the CPU with the torch form in both rows); the file holds every row
    measured so far after each one."""
    monkeypatch.setattr(bench_gpu, "kernels_run_on", lambda device: True)
    written = []
    monkeypatch.setattr(bench_gpu.Results, "write", lambda self, path: written.append(set(self.sections["quick"]
                                                                                              ["figures"])))
    bench_gpu.main(["--quick", "--repeats", "1", "--steps", "1", "--archs", "retnet", "standard", "lstm"])
    out = capsys.readouterr().out
    assert written == [{"standard"}, {"standard", "retnet"}, {"standard", "retnet", "retnet@torch"},
                       {"standard", "retnet", "retnet@torch", "lstm"}]
    assert "retnet@torch" in out and "(the Triton kernel:" in out and "lstm@torch" not in out


def test_gpu_benchmarks_variant_rows_say_why_they_are_not_measured_on_a_cpu(capsys, tmp_path):
    """The rows of issue 46's paper shapes (the standard model's step graphed, the linear kernel at head dim 256 in
    key tiles and in one) are measured on a GPU only: on a CPU each row says why, after the architectures' rows."""
    bench_gpu.main(["--quick", "--repeats", "1", "--steps", "1", "--archs", "standard", "--variants",
                    "standard@graphed", "linear@dk256", "linear@dk256-one-tile", "--out", str(tmp_path / "gpu.json")])
    figures = read_results(tmp_path / "gpu.json", "bench_gpu")["quick"]["figures"]
    assert list(figures) == ["standard", "standard@graphed", "linear@dk256", "linear@dk256-one-tile"]
    assert "graphed needs a GPU" in figures["standard@graphed"]["error"]
    assert all("the Triton kernel runs on CUDA" in figures[n]["error"] for n in ("linear@dk256",
                                                                                "linear@dk256-one-tile"))
    assert "linear@dk256 " in capsys.readouterr().out


def pack_rows(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "bench_pack.jsonl").read_text().splitlines()]


@pytest.mark.slow  # over 10 s on 2 cores: the fast tier stays a developer's loop
def test_pack_benchmark_quick_writes_its_rows_in_priority_order_and_the_forecasts_throughput(tmp_path, capsys):
    """bench_pack --quick on a CPU (the GPU run is the same code at the issue's shapes): a line a row, the first
    saying how it was measured; one trial alone and K fused measured eager, the graphed ones saying that graphs need
    a GPU; and a throughput file the forecast reads, with an affine fit of each architecture alone and
    packed two a device, and charges as measured."""
    bench_pack.main(["--quick", "--out", str(tmp_path), "--rounds", "1", "--budget-s", "900", "--parts", "fused",
                     "lightning", "profile", "throughput"])  # a budget that a busy machine does not cut
    rows = pack_rows(tmp_path)
    assert rows[0]["part"] == "run" and rows[0]["command"].startswith("python -m benchmarks.bench_pack --quick")
    assert rows[-1]["part"] == "end" and rows[-1]["stopped"] is None
    parts = [r["part"] for r in rows[1:-1]]
    assert parts == sorted(parts, key=list(bench_pack.PARTS).index) and set(parts) == set(bench_pack.PARTS) - {
        "packing"}
    for arch in bench_pack.QUICK.archs:
        mine = {r["variant"]: r for r in rows if r["part"] == "fused" and r["arch"] == arch}
        assert mine["alone, eager"]["status"] == "measured" and is_figure(mine["alone, eager"]["trial_steps_per_s"])
        assert mine["7 fused, eager"]["status"] == "measured" and is_figure(mine["7 fused, eager"]["trial_steps_per_s"])
        assert all("graphed needs a GPU" in mine[f"{k}, graphed"]["status"] for k in ("alone", "7 fused"))
    lightning = next(r for r in rows if r["part"] == "lightning")
    assert is_figure(lightning["lightning_steps_per_s"]) and is_figure(lightning["bare_x_lightning"])
    profiled = {r["step"]: r for r in rows if r["part"] == "profile"}
    assert profiled["eager"]["top_level_cpu_ops_a_step"] > 0 and profiled["eager"]["gpu_busy"] is None
    assert profiled["graphed"]["status"].startswith("not measured")
    measured = [r for r in rows if r["part"] == "throughput" and r["status"] == "measured" and r["way"] != "fused"]
    assert len(measured) == 16  # 2 architectures x 4 shapes, alone and packed
    fused = [(r["arch"], r["status"]) for r in rows if r["part"] == "throughput" and r["way"] == "fused"]
    assert {status for arch, status in fused if arch == "standard"} == {"measured"}
    assert {status.split(" (")[0] for arch, status in fused if arch == "lstm"} == {
        "not measured: the sweep cannot fuse lstm"}
    throughput = Throughput.load(tmp_path / "throughput-tiny.json", ["standard", "lstm"])
    assert throughput.modes() == [ALONE, Mode(processes=2), Mode(models=bench_pack.K)]  # alone first, then by field
    # each way priced from what it measured: the affine fit, or (toy CPU steps: noise may hide the FLOPs' share)
    # the tiny profile's two widths each measured
    ways = [(a, m) for a in ("standard", "lstm") for m in throughput.modes() if (a, m.models) != ("lstm", bench_pack.K)]
    assert {throughput.basis(a, m, [8, 16]) for a, m in ways} <= {"affine", "every width"}
    params = write_params(tmp_path / "params.yaml",
                          "profile: tiny\ntasks: [arithmetic, lis]\nsweep: {grid: {architectures: "
                                                    "[standard, lstm]}, resources: {gpus_per_trial: 0.5}}\n")
    capsys.readouterr()
    assert forecast_main(["--params", str(params), "--throughput", str(tmp_path / "throughput-tiny.json")]) == 0
    out = capsys.readouterr().out
    assert "2 processes a GPU, eager *" in out and "one trial alone, eager" in out


@pytest.mark.parametrize("arch", bench_pack.ARCHS)
def test_pack_benchmark_times_the_same_model_alone_and_fused(arch, monkeypatch):
    """A ratio of one trial alone to K fused is read against issue 46's targets: both sides must train the same model
    (its layers, dropout and initialisation), not one with dropout's extra work beside one without."""
    shape, cpu, built = bench_pack.QUICK.shapes[0], torch.device("cpu"), []
    monkeypatch.setattr(bench_pack, "StepForward", lambda model, step, device: built.append(model) or SimpleNamespace(
        why=None))
    bench_pack.alone_step(arch, shape, cpu, "eager")
    real = bench_pack.stacked.fused_step
    monkeypatch.setattr(bench_pack.stacked, "fused_step", lambda *a, **k: built.append(real(*a, **k)) or built[-1])
    bench_pack.fused_step(arch, shape, 2, cpu, graphed=False)
    alone, first = built[0], built[1].model.member(0)
    assert repr(alone) == repr(first)  # dropout's p among the rest
    for (name, a), (_, b) in zip(alone.state_dict().items(), first.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_a_graphed_variant_that_could_not_compile_is_a_failed_row_not_a_graphed_figure(tmp_path, monkeypatch):
    """A step whose compile fails runs eager (``StepForward``'s fallback): timed, it would be an eager step's rate
    under a graphed name, so its row says why it failed and it is not measured (its compile replaced by its why)."""
    why = "sweep.resources.step: graphed failed (RuntimeError: no graphs here); eager"

    def step(arch, shape, device, how):
        return bench_pack.Step(lambda: None, SimpleNamespace(why=why if how == "graphed" else "", graph_breaks=0))

    monkeypatch.setattr(bench_pack, "alone_step", step)
    rows = bench_pack.RowLog(tmp_path / "rows.jsonl")
    variants = bench_pack.built([(1, False), (1, True)], "transformer", bench_pack.QUICK.shapes[0], bench_pack.QUICK,
                                torch.device("cpu"), rows, {"part": "fused"})  # fmt: skip
    assert list(variants) == ["alone, eager"]
    assert [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()] == [
        {"part": "fused", "variant": "alone, graphed", "status": f"failed: {why}"}]


def test_pack_benchmarks_fused_part_finishes_the_separations_shape_graphed_before_the_next_depth(tmp_path,
                                                                                                  monkeypatch):
    """Issue 46's targets are read at the separations shape (widths 64 and 128, depth 1, L = 102), graphed among them:
    its rows, eager and then graphed, come before depth 6's (the variants' building replaced by their calls)."""
    calls = []

    def built(wanted, arch, shape, *args):
        calls.append((shape.width, shape.depth, "graphed" if wanted[0][1] else "eager"))
        return {}

    monkeypatch.setattr(bench_pack, "built", built)
    plan = bench_pack.FULL._replace(archs=("transformer",))
    with bench_pack.Clock(60, ["fused"]) as clock:
        bench_pack.part_fused(plan, torch.device("cpu"), clock, bench_pack.RowLog(tmp_path / "r"), 1)
    assert calls == [(64, 1, "eager"), (128, 1, "eager"), (64, 1, "graphed"), (128, 1, "graphed"),
                     (64, 6, "eager"), (128, 6, "eager"), (64, 6, "graphed"), (128, 6, "graphed")]


def test_pack_benchmarks_lightning_part_times_its_two_sides_in_turn(tmp_path, monkeypatch):
    """Lightning against a bare loop, side by side: the order turned every round, so a drift of the machine favours
    neither (its measurements replaced by their calls, so, no time)."""
    calls = []

    def timed(name):
        def measured(cfg, cell, **kwargs):
            calls.append(name)
            return SimpleNamespace(flops_per_s=1.0, step_flops=1.0)
        return measured

    monkeypatch.setattr(bench_pack, "measure", timed("lightning"))
    monkeypatch.setattr(bench_pack, "bare_measure", timed("bare"))
    with bench_pack.Clock(60, ["lightning"]) as clock:
        bench_pack.part_lightning(bench_pack.QUICK, torch.device("cpu"), clock, bench_pack.RowLog(tmp_path / "r"), 4)
    assert calls == ["lightning", "bare", "bare", "lightning"] * 2


def test_pack_benchmark_stops_at_its_budget_and_keeps_the_rows_before(tmp_path, monkeypatch):
    """The time guard: a step slower than the budget is cut mid-row; the rows before stay, and the last line says
    why it stopped."""
    def step(arch, shape, device, how):
        if how != "eager":
            raise NotImplementedError("not here")
        return bench_pack.Step(lambda: time.sleep(0.01 if arch == "transformer" else 1.0), None)  # mamba's: past it

    monkeypatch.setattr(bench_pack, "alone_step", step)
    start = time.monotonic()
    bench_pack.main(["--quick", "--out", str(tmp_path), "--rounds", "1", "--budget-s", "1.5", "--parts", "fused"])
    assert time.monotonic() - start < 6  # not cut, mamba's row alone would take 7 s
    rows = pack_rows(tmp_path)
    assert rows[0]["part"] == "run" and rows[-1]["stopped"] == "the budget of 1.5 s is spent"
    kept = {r["variant"]: r["status"] for r in rows[1:-1]}  # the first architecture's, cut in the second's
    assert {r["arch"] for r in rows[1:-1]} == {"transformer"} and kept["alone, eager"] == "measured"
    assert list(kept) == ["alone, eager", "7 fused, eager"]  # the priority order


def test_a_part_past_its_share_is_cut_mid_row_and_the_next_part_runs(tmp_path, monkeypatch):
    """A part's share is a deadline: a row still running at its end (mamba's steps, slower than the part's share) is
    cut, the part's rows before it kept, and the next part runs in its own share (its measurements replaced by their
    results, so, no time)."""
    def step(arch, shape, device, how):
        if how != "eager":
            raise NotImplementedError("not here")
        return bench_pack.Step(lambda: time.sleep(0.01 if arch == "transformer" else 3.0), None)  # mamba's: 12 s

    def measured(cfg, cell, **kwargs):
        return SimpleNamespace(flops_per_s=1.0, step_flops=1.0)

    monkeypatch.setattr(bench_pack, "alone_step", step)
    monkeypatch.setattr(bench_pack, "measure", measured)
    monkeypatch.setattr(bench_pack, "bare_measure", measured)
    # 4 s each: time for transformer's rows, and for the next part after the cut, on a busy machine
    monkeypatch.setitem(bench_pack.PARTS, "lightning", bench_pack.PARTS["fused"])
    bench_pack.main(["--quick", "--out", str(tmp_path), "--rounds", "1", "--budget-s", "8", "--parts", "fused",
                     "lightning"])
    rows = pack_rows(tmp_path)[1:]
    fused = [r for r in rows if r["part"] == "fused"]
    assert [r["arch"] for r in fused[:-1]] == ["transformer", "transformer"]
    assert fused[-1]["status"].startswith("cut: the fused part's share of the budget (")
    assert [r["status"] for r in rows if r["part"] == "lightning"] == ["measured"]
    assert rows[-1] == {"part": "end", "seconds": rows[-1]["seconds"], "stopped": None}


def test_a_pack_cut_while_starting_leaves_no_process_behind(monkeypatch):
    """A part's deadline can fall while a pool starts its processes: those started are ended, not left holding a
    device (the second start replaced by the cut)."""
    started = []
    real = multiprocessing.context.SpawnProcess.start

    def start(self):
        if started:
            raise bench_pack.PartUp("cut")
        real(self)
        started.append(self)

    monkeypatch.setattr(multiprocessing.context.SpawnProcess, "start", start)
    with pytest.raises(bench_pack.PartUp):
        bench_pack.Pack(3, 1)
    assert len(started) == 1 and not started[0].is_alive()


@pytest.mark.slow
def test_pack_benchmark_packs_processes_on_one_device(tmp_path):
    """Part packing: 1 and 2 processes (--quick), each a trial's Lightning steps, timed together; run as the lent
    GPU machine runs it, without Ray, MLflow or DVC."""
    done = run_without("benchmarks.bench_pack", "--quick", "--out", str(tmp_path), "--rounds", "2",
                       "--parts", "packing")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [r for r in pack_rows(tmp_path) if r["part"] == "packing"]
    assert [(r["processes"], r["status"], r["share"]) for r in rows] == [(1, "measured", 1), (2, "measured", 0.5)]
    assert all(is_figure(r["trial_steps_per_s"]) and len(r["trial_steps_per_s"]["values"]) == 2 for r in rows)


def test_pack_benchmarks_packing_part_times_the_sizes_in_turn_and_keeps_a_failed_sizes_rounds(tmp_path, monkeypatch):
    """The pack sizes side by side: in one pool, the order turned every round, each size's ratio over one process
    taken in the same rounds; a size that fails keeps the rounds it measured and says why it stopped (the pool's
    measurements replaced by their calls, so, no time)."""
    calls = []

    class Pool:
        def measure(self, profile, cell, size, **kwargs):
            calls.append(size)
            if size == 2 and calls.count(2) == 2:
                raise RuntimeError("out of memory")
            rate = 10.0 * size * (1 + len(calls) / 100)  # a drift: the same within a round, not across rounds
            return SimpleNamespace(flops_per_s=rate, step_flops=1.0), None

    @contextlib.contextmanager
    def pool(processes, threads, sizes):
        assert (processes, sizes) == (2, (1, 2))
        yield Pool()

    monkeypatch.setattr(bench_pack, "pack", pool)
    with bench_pack.Clock(60, ["packing"]) as clock:
        bench_pack.part_packing(bench_pack.QUICK, torch.device("cpu"), clock, bench_pack.RowLog(tmp_path / "r"), 3)
    assert calls == [1, 2, 2, 1, 1]  # round 2 turned; 2 failed there, and is not asked again in round 3
    one, two = (json.loads(line) for line in (tmp_path / "r").read_text().splitlines())
    assert (one["rounds"], one["stopped"], two["rounds"]) == (3, None, 1)
    assert two["stopped"] == "failed: RuntimeError: out of memory"
    assert two["x_one"]["values"] == [pytest.approx(2 * 1.02 / 1.01)]  # round 1's: 10 x 1.01 beside 20 x 1.02


@pytest.mark.slow  # over 10 s on 2 cores: the fast tier stays a developer's loop
def test_generator_benchmark_writes_its_figures(capsys, tmp_path):
    """The generator benchmark's kernel table at tiny settings (a few seconds): every lis size prints a row and is
    written with its figures; a second run of another task adds its section and keeps the first."""
    from benchmarks import bench_generators

    out = tmp_path / "generators.json"
    tiny = ["--seconds", "0.01", "--stage-samples", "0", "--rounds", "2", "--out", str(out)]
    assert bench_generators.main(["--tasks", "lis", *tiny]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("lis ")]
    assert [int(r[1]) for r in rows] == [40, 110, 175, 250]
    lis = read_results(out, "bench_generators")["kernel/lis"]
    assert lis["settings"]["rounds"] == 2 and "--tasks lis" in lis["command"]
    assert list(lis["figures"]) == ["40", "110", "175", "250"]
    for row in lis["figures"].values():
        assert {"reference_per_s", "ours_per_s", "ratio"} == row.keys() and all(map(is_figure, row.values()))
        assert len(row["ratio"]["values"]) == 2
    assert bench_generators.main(["--tasks", "ed", *tiny]) == 0
    assert set(read_results(out, "bench_generators")) == {"kernel/lis", "kernel/ed"}
    assert results.main([str(out)]) == 0
    assert "| 250 / ratio |" in capsys.readouterr().out  # the Markdown the docs quote


@pytest.mark.slow  # 9 s: the generate stage of each benchmark's params
def test_the_benchmarks_that_generate_data_run_the_generate_stage_on_params_it_takes(tmp_path):
    """bench_generators' stage timing and bench_memory's dataset each write a params file of their own for the
    generate stage's command: run for real at a few hundred samples (about 3 s)."""
    from benchmarks import bench_generators, bench_memory

    assert bench_generators.stage_seconds("lis", [4], 200, 1) > 0
    size = {"n": 4, "train": 300, "test": 50}
    data = bench_memory.ensure_data(size, tmp_path, workers=1)
    assert (data / "lis").is_dir() and bench_memory.ensure_data(size, tmp_path, workers=1) == data  # reused


def test_model_benchmark_writes_its_figures(tmp_path, monkeypatch):
    """bench_models --quick --training-only with the timing replaced (so, seconds): the sections of section 1, every
    architecture's throughput and cost against standard, the local patterns' blockwise speed-up, and a
    classification's step and prefill, whole against its answer alone (timed for real: a few tiny steps)."""
    monkeypatch.setattr(bench_models, "train_rates",
                        lambda variants, *args: {v: bench_models.Timing([0.010, 0.012, 0.011]) for v in variants})
    bench_models.main(["--quick", "--training-only", "--out", str(tmp_path / "models.json")])
    sections = read_results(tmp_path / "models.json", "bench_models")
    assert set(sections) == {"training", "local_attention", "answers"}
    answers = sections["answers"]["figures"]["L=32"]
    assert set(answers) == {"whole_ms", "answers_ms", "step_speedup", "prefill_speedup"}
    assert all(is_figure(f) for f in answers.values())
    training = sections["training"]["figures"]
    assert set(training) == set(bench_models.models.ARCHITECTURES)
    assert training["standard"]["cost_per_token_vs_standard"]["median"] == 1.0
    assert all(is_figure(f) for row in training.values() for f in row.values())
    assert is_figure(sections["local_attention"]["figures"]["sliding_window"]["blockwise_speedup"])


def test_frontier_benchmark_writes_its_figures(tmp_path, monkeypatch):
    """bench_frontier with the three live sweeps replaced by their results (so, seconds; the grid's recorded
    trials are a made-up grid): every mode's trials, FLOPs, wall time, dropped runs, whether its table equals the
    grid's, its minimum widths, and every strategy replayed on the grid's record. A --quick run writes nothing
    unless asked; a full run writes to docs/benchmarks/ by default."""
    from benchmarks import bench_frontier

    table = pd.DataFrame({"task": ["lis"], "size": [4], "depth": [2], "arch": ["standard"], "width": [16],
                          "min_paper_gflops": [0.1], "min_exact_gflops": [0.1]})
    recorded_grid(tmp_path, curves=True)
    fake = {name: {"trials": 120 - 40 * i, "pflops": 0.004 / (i + 1), "wall": 100.0, "dropped": 3 * i,
                   "out": tmp_path, "table": table} for i, name in enumerate(bench_frontier.MODES)}
    monkeypatch.setattr(bench_frontier, "run_modes", lambda grid, work: fake)
    monkeypatch.setattr(results, "RESULTS", tmp_path / "docs")
    assert bench_frontier.main(["--quick"]) == 0
    assert not (tmp_path / "docs").exists()
    assert bench_frontier.main([]) == 0
    live = read_results(tmp_path / "docs" / "bench_frontier.json", "bench_frontier")["live"]
    assert live["settings"]["widths"] == bench_frontier.GRID["sweep"]["grid"]["widths"]
    assert live["settings"]["lrs"] == bench_frontier.GRID["sweep"]["search"]["lrs"]
    halving = live["figures"]["frontier+halving"]
    assert halving["trials"] == 40 and halving["same_table"] is True and halving["dropped"] == 6
    assert halving["grid_over_mode"]["median"] == pytest.approx(3.0)
    assert halving["min_widths"] == [{"task": "lis", "size": 4, "depth": 2, "arch": "standard", "width": 16}]
    replayed = live["figures"]["replayed frontier+halving"]
    assert replayed["same_table"] is True and replayed["grid_over_strategy"]["median"] > 1
    assert live["figures"]["oracle (verify only)"]["grid_over_strategy"]["median"] > 1


def test_memory_benchmark_writes_its_figures(tmp_path, monkeypatch):
    """bench_memory with its child processes replaced by their results (so, seconds): every phase's resident
    memory, the training peak and the saved activations by shape."""
    from benchmarks import bench_memory

    def mem(gb: float) -> dict:
        return {k: int(gb * 2 ** 30) for k in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem")}

    size = bench_memory.QUICK
    B, H, T = size["batch"], size["heads"], 83

    def child(args):
        if args[0] == "read":
            return {"imports": mem(0.5), "read": mem(0.6), "read_seconds": 0.2, "touched": mem(0.6),
                    "checksum": 1, "tokens": 1000}
        saved = [[[B, H, T, T], 4, 4 * B * H * T * T * 4], [[B, T, size["width"]], 11, 2 << 20]]
        return {"before": mem(0.6), "after": mem(0.7), "train_seconds": 5.0, "saved_without_dropout": saved[1:],
                "steps": 3, "T": T, "B": B, "V": 193, "params": 125_121, "saved": saved}

    monkeypatch.setattr(bench_memory, "ensure_data", lambda size, scratch, workers: tmp_path / "data")
    monkeypatch.setattr(bench_memory, "child", child)
    assert bench_memory.main(["--quick", "--out", str(tmp_path / "memory.json")]) == 0
    trial = read_results(tmp_path / "memory.json", "bench_memory")["trial"]
    assert trial["settings"]["n"] == size["n"]
    figures = trial["figures"]
    assert set(figures["after_reading_later_reader"]) == {"VmRSS", "RssAnon", "RssFile"}
    assert figures["training_peak_VmHWM"]["median"] == mem(0.7)["VmHWM"]
    assert figures["attention_matrices_per_layer"]["median"] == pytest.approx(4 / size["depth"])
    assert figures["saved_by_shape"][0] == {"shape": [B, H, T, T], "tensors": 4, "bytes": 4 * B * H * T * T * 4}


def test_verdict_benchmark_retrains_unsolved_cells_and_counts_flips_per_reason(tiny_data, tmp_path, capsys):
    """Two sweeps' tables, one unsolved cell each (one converged, one stopped by a plateau rule of old) and an
    undecided one that is not re-trained: each is re-trained for 2x its steps, and the flips are counted."""
    from benchmarks import bench_verdicts

    base = {"task": "lis", "size": 3, "arch": "standard", "width": 8, "depth": 1, "seed": 0, "lr": 3e-3,
            "measured": True, "final_accuracy": 0.1, "train_steps": 4}
    for label, reason in (("old", "plateau: no gain"), ("new", "converged below 0.9: over steps ...")):
        rows = [base | {"status": "unsolved", "reason": reason},
                base | {"width": 16, "status": "undecided", "reason": "budget: still improving"}]
        (tmp_path / label).mkdir()
        pd.DataFrame(rows).to_csv(tmp_path / label / "sweep.csv", index=False)
    out = tmp_path / "verdicts.json"
    assert bench_verdicts.main(["--sweep", f"old={tmp_path / 'old'}", "--sweep", f"new={tmp_path / 'new'}",
                                "--data", str(tiny_data), "--profile", "tiny", "--factor", "2", "--slots", "1",
                                "--out", str(out)]) == 0
    sections = read_results(out, "bench_verdicts")
    for label, kind in (("old", "plateau"), ("new", "converged")):
        (cell,) = sections[label]["figures"]["cells"]
        assert cell["kind"] == kind and cell["retrain_steps"] <= 8
        assert sections[label]["settings"]["undecided_cells"] == 1
        by_reason = {r["kind"]: r for r in sections[label]["figures"]["by_reason"]}
        assert by_reason[kind]["unsolved"] == by_reason["all"]["unsolved"] == 1
        assert by_reason[kind]["flipped"] == (cell["retrain_status"] == "solved")
    assert "flip to solved with 2x the steps" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench_verdicts.main(["--sweep", str(tmp_path / "old")])  # no LABEL=


@pytest.mark.slow
def test_driver_benchmark_feeds_the_real_callbacks_and_a_real_server(tmp_path, capsys):
    """bench_driver at toy size over a real `mlflow server` (its own check: every simulated trial is a finished
    child run with its whole curve and verdict): it prints and writes per-result times and results per second."""
    from benchmarks import bench_driver

    bench_driver.main(["--trials", "12", "--validations", "3", "--running", "5", "--repeats", "1",
                       "--out", str(tmp_path / "driver.json")])
    out = capsys.readouterr().out
    assert "12 trials x (3 validations + 1 final), 5 at a time, MLflow server" in out and "results/s" in out
    figures = read_results(tmp_path / "driver.json", "bench_driver")["server"]["figures"]["gather 0.2 s"]
    assert set(figures) == {"result_median_ms", "result_p95_ms", "start_median_ms", "complete_median_ms",
                            "results_per_s"}
    assert all(is_figure(f) for f in figures.values()) and figures["results_per_s"]["median"] > 0


def test_batch_benchmark_times_both_collates_side_by_side(tmp_path, capsys):
    from benchmarks import bench_batches

    bench_batches.main(["--quick", "--samples", "600", "--batch", "64", "--out", str(tmp_path / "b.json")])
    out = capsys.readouterr().out
    assert "vectorised" in out and "per sample" in out and "ratio" in out
    figures = read_results(tmp_path / "b.json", "bench_batches")["collate_lis10"]["figures"]
    assert all(is_figure(figures[k]) for k in ("vectorised_batches_per_s", "per_sample_batches_per_s", "ratio"))


PILOT = """profile: separations
tasks: [eq_one]
generate: {train_samples: 400, test_samples: 64, val_samples: 64, workers: 1, datasets: {eq_one: [10]}}
sweep: {grid: {architectures: [transformer, lstm], widths: [8], depths: [1], arch_depths: {lstm: [1]}},
        search: {strategy: grid, lrs: [1.0e-3]}, optim: {epochs: 100, max_steps: 8, precision: 32-true},
        verdict: {max_budget_factor: 1, convergence_min_steps: 4}, evaluation: {val_every_steps: 4, val_samples: 64},
        resources: {gpus_per_trial: 0, cpus_per_trial: 1}}
"""


@pytest.mark.slow
def test_pilot_trains_each_trial_in_parallel_and_writes_a_line_per_verdict(tmp_path, capsys):
    """benchmarks.pilot run as on a lent GPU, without Ray, MLflow or DVC (about 45 s, most of it starting the trial
    processes): the grid's trials run two at once, each written as it ends with its cell and verdict, and how they
    were measured beside them; a deadline that leaves no time writes every trial as cut off instead of dropping it;
    a params file that cannot run is named before any compute."""
    from benchmarks import pilot

    params = write_params(tmp_path / "pilot.yaml", PILOT)
    done = run_without("benchmarks.pilot", "--params", str(params), "--out", str(tmp_path / "a"), "--parallel", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in (tmp_path / "a" / "pilot.jsonl").read_text().splitlines()]
    assert sorted(r["arch"] for r in lines) == ["lstm", "transformer"]
    assert all(r["train_steps"] == 8 and r["task"] == "eq_one" and r["status"] == "undecided" for r in lines)
    assert json.loads((tmp_path / "a" / "pilot.json").read_text())["command"].startswith("python -m benchmarks.pilot")

    assert pilot.main(["--params", str(params), "--out", str(tmp_path / "b"), "--deadline-s", "0.001", "--claims"]) == 0
    cut = [json.loads(line) for line in (tmp_path / "b" / "pilot.jsonl").read_text().splitlines()]
    assert len(cut) == 2 and {r["status"] for r in cut} == {"cut off"}
    # a claims run: the cells' checks as a sweep's report gives them; a cut-off cell is undecided, so decides nothing
    checks = {c["id"]: c for c in json.loads((tmp_path / "b" / "claims.json").read_text())}
    assert checks["sep_eq_one_all_models"]["status"] == "not tested"  # N = 10: not a length of the paper's
    assert "undecided (still training or not started" in checks["sep_eq_one_all_models"]["detail"]

    bad = write_params(tmp_path / "bad.yaml", PILOT.replace("[transformer, lstm]", "[transformer, nosuch]"))
    assert pilot.main(["--params", str(bad), "--out", str(tmp_path / "c")]) == 2
    assert "nosuch" in capsys.readouterr().err and not (tmp_path / "c").exists()


def test_eq_shortcut_learns_the_count_shortcut_and_scores_the_exact_rule(tmp_path, capsys):
    """benchmarks.eq_shortcut --quick (a few seconds): the count model, trained as the pilots train (Adam, batch 64,
    fresh strings), holds 99% on eq_one with 16 symbols; the paper's exact count rule scores 100% on the test
    strings; an impossible N is named before any training."""
    from benchmarks import eq_shortcut

    assert eq_shortcut.main(["--quick", "--out", str(tmp_path / "s.json")]) == 0
    row = read_results(tmp_path / "s.json", "eq_shortcut")["quick"]["figures"]["N=20 alphabet=16 lr=0.01"]
    assert row["held 99%"] == "1 of 1 seeds" and is_figure(row["steps to hold 99%"])
    assert row["test accuracy"]["median"] > 95 and row["count rule, test accuracy"]["min"] == 100
    with pytest.raises(SystemExit):
        eq_shortcut.main(["--sizes", "21"])
    assert "size N must be even" in capsys.readouterr().err


@pytest.mark.slow
def test_a_fused_step_launches_at_most_a_quarter_of_k_trials_kernels_and_no_step_waits_on_the_host():
    """benchmarks.bench_launches (under a minute): for every architecture a fused trial stacks, at depths 1
    and 6, a trial's real step counted op by op (Lightning, the loss, the verdict's checks, the optimizer): 7 trials
    alone launch at least 4 times the kernels of one fused trial of 7, and neither reads anything back to the host
    in a step (float32; bf16 for two, its casts on both sides; eq_ncp's loss for one)."""
    from benchmarks import bench_launches

    rows = bench_launches.table(bench_launches.fusable(), [1, 6], 7, ["32-true"])
    rows += bench_launches.table(["transformer", "linear_nofm"], [1], 7, ["bf16-mixed"])
    rows += bench_launches.table(["transformer"], [1], 7, ["32-true"], task="eq_ncp")  # its own loss
    assert len(rows) == 2 * len(bench_launches.fusable()) + 3 and "lstm" not in bench_launches.fusable()
    low = [(r["arch"], r["depth"], r["precision"], round(r["ratio"], 2)) for r in rows if r["ratio"] < 4]
    assert not low, f"7 x alone / fused below 4: {low}"
    syncs = [(r["arch"], r["depth"], r["alone_syncs"], r["fused_syncs"]) for r in rows
             if r["alone_syncs"] or r["fused_syncs"]]
    assert not syncs, f"host syncs in a step: {syncs}"


@pytest.mark.slow
def test_a_fused_trial_graphed_whole_launches_a_handful_of_kernels_outside_its_graph():
    """benchmarks.bench_launches --graphed: a fused trial of 7 graphed whole (its CPU twin, counted as a GPU would
    launch it once recorded: what runs outside the graph, one replay, its inputs' copies) launches a handful of
    kernels a step, at least 20 times fewer than 7 trials alone, and reads nothing back to the host."""
    from benchmarks import bench_launches

    rows = bench_launches.table(["transformer", "mamba", "linear_nofm"], [1], 7, ["32-true"], graphed=True)
    launches = {r["arch"]: r["graphed_kernels"] for r in rows}
    assert max(launches.values()) <= 16, launches
    assert min(r["graphed_ratio"] for r in rows) >= 20 and not any(r["graphed_syncs"] for r in rows), rows


def test_a_classifications_members_are_scored_in_a_quarter_of_their_launches_one_by_one():
    """benchmarks.bench_launches --tasks validation (seconds, fast tier): a validation of 7 members of a
    classification, batched (``Fused.greedy``), launches at most a quarter of the kernels of the members decoded one
    by one with their caches, and reads back to the host at most once a token and once more (3 syncs)."""
    from benchmarks import bench_launches

    rows = [bench_launches.validation(arch, 1, 7) for arch in bench_launches.fusable()]
    low = [(r["arch"], round(r["ratio"], 2)) for r in rows if r["ratio"] < 4]
    assert not low, f"alone / batched below 4: {low}"
    assert {r["fused_syncs"] for r in rows} == {3} and min(r["alone_syncs"] for r in rows) == 14


def test_the_launch_counter_counts_kernels_and_host_reads_and_not_views():
    """The counter itself: a view and an allocation are no kernel, a _foreach op is one, a .item(), a .tolist() and
    a boolean index each a sync."""
    from benchmarks.bench_launches import Launches

    x = torch.ones(4)
    with Launches() as mode:
        y = x.view(2, 2).t()  # views
        torch.empty(3)  # an allocation
        z = y + 1  # a kernel
        torch._foreach_add_([x, x.clone()], 1.0)  # a clone, then one foreach
        z.sum().item()  # a kernel, and a read
        x.tolist()
        x[x > 0]  # a comparison, and a boolean index
    assert mode.kernels == 6 and mode.syncs == 3, (mode.kernels, mode.syncs, mode.ops)
