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
