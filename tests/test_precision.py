"""Mixed precision that is correct: every architecture under bf16 autocast (on CPU) stays finite and agrees with
its float32 forward, far along the sequence too (RetNet's rotary angles in bf16 were 28% off at positions 600-800:
bf16 holds integers exactly only up to 256)."""

from __future__ import annotations

import lightning as L
import pytest
import torch
import yaml

import models
from pipeline.training.settings import TrainSettings
from pipeline.training.train import TrialSpec, run_trial
from tests.helpers import dataset_fields, make_cell, write_params
from tests.helpers.training import needs_cpu_bf16
from tests.helpers.without import run_without

T = 800
TOLERANCE = 0.03  # relative L2 error of the logits; measured 0.3-0.9% for every architecture (width 32, depth 2)


@pytest.mark.parametrize("arch", sorted(models.ARCHITECTURES))
def test_bf16_autocast_agrees_with_float32(arch):
    needs_cpu_bf16(arch)
    torch.manual_seed(0)
    model = models.build_model(arch, vocab_size=16, width=32, depth=2, heads=4, max_len=T, dropout=0.0).eval()
    tokens = torch.randint(0, 16, (2, T))
    with torch.no_grad():
        exact = model(tokens).float()  # (B, T, V)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = model(tokens).float()
    assert torch.isfinite(low).all()
    for span in (slice(0, 256), slice(600, T)):
        error = ((low[:, span] - exact[:, span]).norm() / exact[:, span].norm()).item()
        assert error < TOLERANCE, f"{arch}: bf16 logits {error:.1%} off float32 at positions {span.start}-{span.stop}"


class ScoringDtypes(L.Callback):
    """Records the dtype of the model's logits whenever it runs in eval mode (validation's and the test set's
    greedy decoding)."""

    def __init__(self):
        self.seen: set[torch.dtype] = set()

    def on_fit_start(self, trainer, pl_module):
        def hook(module, inputs, output):
            if not module.training:
                self.seen.add((output[0] if isinstance(output, tuple) else output).dtype)

        pl_module.model.register_forward_hook(hook)


@pytest.mark.parametrize("arch", sorted(models.ARCHITECTURES))
def test_a_bf16_trial_is_scored_under_bf16_too_and_decodes(tiny_cfg, tiny_data, arch):
    """Training under bf16-mixed and scoring in float32 would decide the verdict on another model than trained."""
    needs_cpu_bf16(arch)
    size = tiny_cfg.generate.datasets["lis"][0]
    cell = make_cell("lis", size, arch, 16, 1, 0, **dataset_fields(tiny_data, "lis", size))
    settings = TrainSettings.of(tiny_cfg).params() | {"precision": "bf16-mixed", "max_steps": 4, "val_every_steps": 2,
                                                     "val_samples": 16, "eval_samples": 16, "eval_batch_size": 8}
    dtypes = ScoringDtypes()
    result = run_trial(TrialSpec.for_cell(cell, settings | {"lr": 3e-3}), callbacks=[dtypes])
    assert 0 <= result["final_accuracy"] <= 1 and 0 <= result["val_accuracy"] <= 1
    assert dtypes.seen == {torch.bfloat16}


def test_the_bf16_probe_says_what_a_bf16_lstm_on_this_cpu_does():
    """``models.bf16_on_cpu`` answers for the machine: '' exactly where a wider bf16 LSTM trains here, else the
    CPU's instruction set and oneDNN's error (on AVX2-only CPUs)."""
    model = models.build_model("lstm", vocab_size=16, width=32, depth=2, heads=4, max_len=64, dropout=0.0)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(torch.randint(0, 16, (4, 64))).float().sum().backward()
        trains = True
    except RuntimeError:
        trains = False
    why = models.bf16_on_cpu("lstm")
    assert (why == "") == trains, why
    if why:
        assert why.startswith("lstm cannot train in bf16 on this CPU (torch's CPU capability: ")


def cannot_lstm(arch: str) -> str:
    return "lstm cannot train in bf16 on this CPU (torch's CPU capability: AVX2): oneDNN" if arch == "lstm" else ""


def test_bf16_trials_on_a_cpu_that_cannot_train_an_architecture_so_are_refused_naming_it(monkeypatch):
    from pipeline.common.config import ConfigError
    from pipeline.search.cells import check_precision

    monkeypatch.setattr(models, "bf16_on_cpu", cannot_lstm)
    with pytest.raises(ConfigError, match=r"sweep.optim.precision: bf16-mixed: lstm cannot train in bf16 on this CPU "
                                          r"\(torch's CPU capability: AVX2\).*Train in 32-true"):
        check_precision(["standard", "lstm"], "bf16-mixed")
    check_precision(["standard", "mamba"], "bf16-mixed")
    check_precision(["standard", "lstm"], "32-true")


def test_the_forecast_refuses_to_measure_bf16_where_this_cpu_cannot_before_building_a_model(monkeypatch, capsys):
    import pipeline.costs.throughput
    import pipeline.forecast

    monkeypatch.setattr(models, "bf16_on_cpu", cannot_lstm)
    monkeypatch.setattr(pipeline.costs.throughput, "measure_all", lambda *a, **k: pytest.fail("measured"))
    assert pipeline.forecast.main(["--profile", "tiny", "--device", "cpu", "--precision", "bf16-mixed"]) == 2
    assert "--precision: bf16-mixed: lstm cannot train in bf16" in capsys.readouterr().err


@pytest.mark.skipif(not models.bf16_on_cpu("lstm"), reason="this CPU trains the LSTM in bf16: nothing to refuse")
def test_the_sweep_stage_on_this_cpu_refuses_a_bf16_lstm_before_any_compute(tmp_path):
    """The real refusal, where this machine's CPU lacks bf16 for the LSTM (as CI's AMD EPYC does): exit 2, the
    architecture and the CPU named, no results written."""
    params = {"profile": "tiny", "tasks": ["arithmetic", "lis"], "sweep": {"optim": {"precision": "bf16-mixed"}}}
    p = write_params(tmp_path / "params.yaml", yaml.safe_dump(params))
    done = run_without("pipeline.sweep", "--params", str(p), "--out", str(tmp_path / "results"),
                       blocked="ray,mlflow", timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "sweep.optim.precision: bf16-mixed: lstm cannot train in bf16 on this CPU" in done.stderr
    assert not list((tmp_path / "results").glob("*.csv"))
