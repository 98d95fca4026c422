import pytest

from benchmarks import bench_models


@pytest.mark.slow
def test_model_benchmark_quick_path_runs_every_section(capsys):
    """The benchmark at toy sizes (about 15 s): every architecture trains, cached decoding agrees token for token
    with recomputation, and every section prints."""
    bench_models.main(["--quick"])
    out = capsys.readouterr().out
    for section in ("training tokens/s", "local attention at L=256", "greedy decoding", "Lightning vs a bare",
                    "CPU peak", "training utilisation", "memory"):
        assert section in out
    assert " NO " not in out  # "same tokens" column


def test_generator_benchmark_runs(capsys):
    """The generator benchmark's kernel table at tiny settings (a few seconds): every lis size prints a row."""
    from benchmarks import bench_generators

    assert bench_generators.main(["--tasks", "lis", "--seconds", "0.01", "--stage-samples", "0"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("lis ")]
    assert [int(r[1]) for r in rows] == [40, 110, 175, 250]
