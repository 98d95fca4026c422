"""Stage `sweep`: Ray Tune trials over architecture x width x (task, size) x depth x seed x learning rate, each
trained with Lightning to its verdict (solved, unsolved, undecided, diverged; failed if it raised), recorded in MLflow.

    python -m pipeline.sweep            (dvc.yaml runs it after every `generate`; its settings: the profile's `sweep`)

Before anything trains it checks the config, the datasets, MLflow, the Ray head and the nodes (docs/cluster.md, "What
the driver checks"). ``sweep.search.strategy`` picks the plan, a grid or the width frontier, run as a Ray Tune searcher,
one trial per (cell, learning rate) (docs/verdicts-and-search.md), or with ``sweep.resources.fuse`` a cell's learning
rates as one fused trial, each recorded as its own (docs/gpu.md). Runs MLflow already finished with the same run key are
reused; trials continue from their checkpoints after a lost worker, node or sweep, and SIGTERM or SIGINT stops the sweep
with its runs KILLED (docs/cluster.md, "Surviving failures"). One sweep at a time writes a results directory, and one at
a time trains against a project's stores (docs/profiles.md, "Queued and temporary experiments"). Outputs:
results/sweep.csv (a row per cell), trials.csv (a row per learning-rate run), curves.csv (every validation) and
sweep.json (headline metrics); in MLflow, a parent run per sweep and a child per trial it trains (docs/report.md,
"Looking at the results in MLflow").
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pipeline.common.config import RETRAIN_ENV, ROOT, Config, ConfigError, load_config
from pipeline.common.locks import SWEEP_LOCK, LockBusy, owned
from pipeline.common.signals import STOP, Stopped
from pipeline.data.datasets import DatasetError
from pipeline.tracking.services import ServiceError

RESULTS = ROOT / "results"


def check_before_compute(cfg: Config) -> None:
    """What ``load_config`` cannot check: the architectures and their options in the model registry, bf16 where the
    trials run on this CPU, this machine's torch and driver where they run on its GPUs, and a profile that decides a
    claim within the hours it states."""
    # imported once the settings hold: the registry imports torch, the driver Ray and MLflow (seconds),
    # and a bad setting is named before them
    from pipeline.common.cuda import unusable_gpus
    from pipeline.search.cells import check_architectures, check_precision

    check_architectures(cfg)
    if cfg.cluster.ray() is None and not cfg.sweep.resources.gpus_per_trial:  # trials on this CPU
        check_precision(cfg.sweep.grid.architectures, cfg.sweep.optim.precision)
    # trials on this machine's GPUs (a cluster's nodes are probed when the sweep joins it)
    if cfg.cluster.ray() is None and cfg.sweep.resources.gpus_per_trial and (why := unusable_gpus()):
        raise ConfigError(f"sweep.resources.gpus_per_trial: this machine's {why.removeprefix('its ')}")
    if cfg.decides is not None and cfg.cluster.ray() is None:  # the time it states, on this machine
        from pipeline.costs.prediction import check_decides

        plan = check_decides(cfg)
        print(
            f"sweep: decides {cfg.decides.claim}: the forecast gives {plan.grid.wall_hours:.2f} h at the first "
            f"budgets, at most {plan.extended.wall_hours:.2f} h every budget extended, within the profile's "
            f"{cfg.decides.hours:g} h",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m pipeline.sweep", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--params", default=str(ROOT / "params.yaml"), help="params file (default: %(default)s)")
    ap.add_argument("--data", default=str(ROOT / "data"), help="data directory (default: %(default)s)")
    ap.add_argument("--out", default=str(RESULTS), help="results directory (default: %(default)s)")
    args = ap.parse_args(argv)
    STOP.install()
    if os.environ.get("DVC_STAGE"):  # run by dvc, which dies of a SIGTERM without passing it on: stop with it
        STOP.with_parent()
    try:
        out = Path(args.out)
        # one sweep at a time per results directory: a second stops at once instead of racing the first for its
        # outputs (`dvc repro` holds DVC's own lock too; this covers `python -m pipeline.sweep`)
        busy = (
            f"another sweep is running with results in {out} ({{holder}}); wait for it to end, or stop it "
            "(its finished trials are kept)"
        )
        with owned(out / SWEEP_LOCK, busy):
            cfg = load_config(args.params)
            STOP.install(cfg.cluster.stop_timeout_s)
            if os.environ.get(RETRAIN_ENV) == "1":  # pipeline.nightly --force: a night from scratch
                print(f"sweep: {RETRAIN_ENV}=1: no finished run is reused, no checkpoint continued", flush=True)
                runs = cfg.sweep.runs.model_copy(update={"reuse": False})
                cfg = cfg.model_copy(update={"sweep": cfg.sweep.model_copy(update={"runs": runs})})
            check_before_compute(cfg)
            from pipeline.scheduling.driver import sweep

            sweep(cfg, Path(args.data), out)
    except (ConfigError, DatasetError, ServiceError, LockBusy) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except Stopped as err:
        print(
            f"error: the sweep was {err}: its finished trials are in MLflow, the others continue from their "
            "checkpoints when it runs again",
            file=sys.stderr,
        )
        return err.signum + 128
    except RuntimeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
