"""A forecast before launch: what `dvc repro` on a profile will train, and for how long on a cluster.

    python -m pipeline.forecast --profile paper --nodes 4 --gpus-per-node 8 --gpu H100
    python -m pipeline.forecast --profile paper --save-throughput h100.json        # on a GPU node: measure, keep
    python -m pipeline.forecast --profile paper --throughput h100.json --nodes 4   # anywhere: plan from that file
    python -m pipeline.forecast --profile cpu-claims --against results/trials.csv  # and against a run, trial by trial

For the profile (params.yaml's, or --profile, with params.yaml's overrides) it prints the grid's cells, learning rates
and trials, their training FLOPs at the first and the extended step budget, and their GPU-hours and wall time on the
cluster described, from a training throughput measured now on this machine's device or read from a --throughput
file (one trial a GPU, or many: fused, packed, compiled or graphed), each trial handed to the cluster's slots as the
sweep's searcher hands them out; with --against, each trial a run trained priced at the steps it trained, beside
the seconds it took. What a search would save is modelled from the replay benchmark, and said so. How
each rate is measured or modelled: docs/profiles.md, "What a profile costs before launch". Exit status 0; 2 for
input that cannot give a forecast, named before any compute.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import get_args

import torch

from pipeline.common.config import ROOT, Config, ConfigError, EvaluationSection, Precision, StepMode, load_config
from pipeline.costs.prediction import (
    REPLAY_COMMAND,
    Cluster,
    Forecast,
    Hindsight,
    Priced,
    Row,
    forecast,
    hindsight,
    hindsight_wall,
)
from pipeline.costs.rates import ALONE, EVERY_WIDTH, SOURCES, ForecastError, Throughput
from pipeline.search.cells import check_architectures, check_precision, defined_cells, model_costs


def number(x: float) -> str:
    """A figure for people: thousands separated, two or three significant digits."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}" if x >= 1 else f"{x:.2g}"


def flops(x: float) -> str:
    for unit, scale in (("EFLOP", 1e18), ("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9)):
        if x >= scale:
            return f"{number(x / scale)} {unit}"
    return f"{number(x / 1e6)} MFLOP"


def duration(hours: float) -> str:
    if hours >= 2 * 8766:
        return f"{number(hours / 8766)} years"
    if hours >= 48:
        return f"{number(hours / 24)} days"
    return f"{number(hours)} h" if hours >= 1 else f"{number(hours * 60)} min" if hours >= 1 / 60 else "under a minute"


def words(values) -> str:
    return " ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def render(fc: Forecast, cfg: Config, params: str, throughput: Throughput, cluster: Cluster, source: str) -> str:
    """The forecast as it is printed: the grid, the throughput it rests on, the cluster, then the costs."""
    lines = [
        *grid_lines(fc, cfg, params),
        "",
        f"throughput ({source}), model FLOP/s of training steps, on {throughput.device}:",
        *rate_lines(fc, cfg.sweep, throughput),
        *cluster_lines(fc, throughput, cluster),
        "",
        f"{'':26} {'trials':>7} {'training FLOPs':>16} {fc.unit + '-hours':>16}   wall",
        row(fc.grid, fc.trials, "grid, first budget"),
        row(fc.extended, fc.trials, f"grid, extended {fc.factor}x"),
        "  wall: the trials on the slots longest first, as the sweep hands them out (a list schedule). The extended",
        "  line is the most the grid trains: a trial stops once solved or converged, and how early is not forecast.",
        f"  rates: {sources(fc.configured.sources)}",
        f"  validation: {validation(fc.configured, cfg.sweep.evaluation, fc.trials)}",
        "",
        *mode_lines(fc),
        *search_lines(fc),
    ]
    return "\n".join(lines)


def grid_lines(fc: Forecast, cfg: Config, params: str) -> list[str]:
    """What the profile trains: its cells, trials, budget and search."""
    s = cfg.sweep
    tasks = dict.fromkeys(t for t, _ in cfg.sweep_datasets())
    shapes: dict[str, list[str]] = {}  # what an architecture trains -> the architectures that train it
    for arch, lrs in fc.lrs.items():
        widths, depths = words(s.grid.widths_for(arch)), words(s.grid.depths_for(arch))
        shape = f"widths {widths} · depths {depths} · learning rates {words(lrs)}"
        shapes.setdefault(shape, []).append(arch)
    budget = f"{' / '.join(f'{n:,}' for n in fc.steps)} steps of batch {s.optim.batch_size}"
    return [
        f"Forecast for profile {fc.profile} (conf/{fc.profile}.yaml with {params}'s overrides), before launch",
        "",
        f"cells: {fc.cells:,} (task x size x architecture x width x depth x seed)",
        *(f"  {t}: sizes {words(n for u, n in cfg.sweep_datasets() if u == t)}" for t in tasks),
        *(f"  {', '.join(archs)}: {shape}" for shape, archs in shapes.items()),
        f"  seeds: {words(s.grid.seeds)}",
        f"trials: {fc.trials:,} (cell, learning rate) runs in the full grid",
        f"budget: {budget}"
        + (f" ({s.optim.epochs} epochs)" if s.optim.max_steps <= 0 else "")
        + (f", extended up to {fc.factor}x while a trial still improves" if fc.factor > 1 else ", never extended"),
        f"search: sweep.search.strategy {s.search.strategy}, lr_search {s.search.lr_search}"
        + (f", predict {words(s.search.predict)}" if s.search.predict else ""),
    ]


def cluster_lines(fc: Forecast, throughput: Throughput, cluster: Cluster) -> list[str]:
    """The cluster's trial slots, and what the rates measured elsewhere or not at all mean for its hours."""
    kind = f"{cluster.gpus} GPUs" + (f" ({cluster.gpu})" if cluster.gpu else "") if fc.unit == "GPU" else ""
    lines = [
        f"cluster: {cluster.nodes} node{'s' * (cluster.nodes > 1)} x {kind or f'{cluster.cpus} CPUs'} = "
        f"{fc.slots} trial slots, {fc.per_trial:g} {fc.unit}{'s' * (fc.per_trial != 1)} a trial"
    ]
    elsewhere = cluster.gpu and cluster.gpu.lower() not in throughput.device.lower()
    if fc.unit == "GPU" and (throughput.device.startswith("cpu") or elsewhere):
        lines.append(
            f"  NOTE: throughput measured on {throughput.device}, not on the cluster's GPUs: the hours below are that "
            "device's"
        )
    if fc.per_trial > 1:
        lines.append(
            f"  note: a trial on {fc.per_trial:g} devices is taken to train {fc.per_trial:g}x as fast as on one"
        )
    mine = fc.configured
    if mine.alone and mine.mode != ALONE:
        lines.append(
            f"  note: no rate of {', '.join(mine.alone)} was measured as {mine.mode}: their trials are charged at "
            f"their rate alone, {mine.per_slot:g} of it each (no faster in all than one trial a GPU)"
        )
    return lines


PACK_COMMAND = "python -m benchmarks.bench_pack --out docs/benchmarks"
LISTED = 24  # measurements listed one a line; more are summed up a line per architecture and way


def rate_lines(fc: Forecast, s, throughput: Throughput) -> list[str]:
    """Each measured step, then per architecture and way of training what its trials' rates rest on: measured,
    or modelled (an affine fit, an interpolation between widths), and why where a way has none."""
    mine = [m for m in throughput.measured if m.arch in fc.lrs]
    lines = [
        f"  {m.arch:>14}  {flops(m.flops_per_s)}/s at width {m.width} (depth {m.depth}, L={m.length}, batch "
        f"{m.batch} in {m.micro_batches}, {m.precision}; {m.steps} steps in {m.seconds:.3g} s"
        + (f"; validated {m.validation_samples} in {m.validation_seconds:.3g} s)" if m.validation_samples else ")")
        + ("" if m.mode == ALONE else f" {m.mode}")
        for m in (mine if len(mine) <= LISTED else [])
    ]
    groups: dict[tuple, list] = {}  # many: a line per architecture and way
    for m in mine if len(mine) > LISTED else []:
        groups.setdefault((m.arch, m.mode), []).append(m)
    for (arch, mode), ms in groups.items():
        rates = sorted(m.flops_per_s for m in ms)
        shapes = ", ".join(f"{k} {words(sorted({getattr(m, k) for m in ms}))}" for k in ("width", "depth", "length"))
        lines.append(
            f"  {arch:>14}  {mode}: {len(ms)} shapes measured ({shapes}), {flops(rates[0])}/s to {flops(rates[-1])}/s "
            "the GPU"
        )
    if not throughput.measured:  # a file by hand: its rates
        for arch in fc.lrs:
            rates = sorted(throughput.rates[arch].items())
            lines.append(f"  {arch:>14}  " + ", ".join(f"{flops(r)}/s at " + (f"width {w}" if w else "every width")
                                                       for w, r in rates))  # fmt: skip
    modes = [p.mode for p in fc.modes] or [fc.configured.mode]
    lines.append("what each architecture's rates rest on:")
    for arch in fc.lrs:
        widths = s.grid.widths_for(arch)
        for mode in modes:
            basis = throughput.basis(arch, mode, widths)
            fit = throughput.affine(arch, mode)
            if basis == "affine":
                how = f"MODELLED, affine: {fit}"
            elif basis == "every width":
                how = f"measured at every width it trains ({words(widths)}); {fit}"
            elif basis == "rates":
                given = sorted(throughput.rates[arch])
                how = (
                    "one rate for every width, given"
                    if given == [EVERY_WIDTH]
                    else "its widths' rates, MODELLED between them (log-log) and beyond (the nearest); " + str(fit)
                )
            elif throughput.of(arch, mode):
                how = f"not at every width it trains, {fit}: trained alone"
            else:
                continue
            lines.append(f"  {arch:>14}  {mode}: {how}")
    return lines


def validation(p: Priced, e: EvaluationSection, trials: int) -> str:
    """What the trials' validations add to their time, as measured (one evaluation batch of random sequences a shape,
    as a trial validates: ``throughput.timed_validation``), and where nothing priced them."""
    if p.unvalidated == trials:
        return "NOT PRICED: no validation was measured (a throughput file from before they were): steps alone above"
    when = f"every {e.val_every_steps:,} steps" if e.val_every_steps else "every epoch"
    said = f"{when} on {e.val_samples:,} sequences, {p.validating:.0%} of the trials' time, measured"
    missing = f"; NOT PRICED for {p.unvalidated:,} trials (none measured for their architecture)"
    return said + missing * bool(p.unvalidated)


def sources(counts: dict[str, int]) -> str:
    """How many trials took their rate each way, most direct first."""
    said = {
        "measured": "measured at their own shape",
        "affine": "MODELLED by the affine fit",
        "width measured": "measured at their width (another depth or L)",
        "interpolated": "MODELLED between measured widths",
        "one rate": "one rate given for every width",
    }
    return "; ".join(f"{counts[k]:,} trials {said[k]}" for k in SOURCES if counts.get(k))


def mode_lines(fc: Forecast) -> list[str]:
    """The first budget under every way of training trials a GPU measured: the GPU-hours with and without many
    trials a GPU (fused in one step, packed as processes), the configured one marked; where only one way was
    measured, that the others are not, and what measures them. None on a CPU profile."""
    if not fc.modes:
        return []
    if len(fc.modes) == 1:
        return [
            "Many trials a GPU (fused in one step, packed as processes): no rate measured that way, so none is",
            f"forecast; `{PACK_COMMAND}` measures them on a GPU (docs/gpu.md).",
            "",
        ]
    lines = [
        "The grid's first budget under each way of training measured, many trials a GPU or one (an architecture",
        "with no rate measured that way is charged alone: listed):",
        f"{'':40} {'slots':>6} {'GPU-hours':>12}   {'wall':12} trials at their rate alone",
    ]
    for p in fc.modes:
        mark = " *" if p is fc.configured else ""
        lines.append(
            f"{str(p.mode) + mark:40} {p.slots:>6,} {number(p.row.device_hours):>12}   {duration(p.row.wall_hours):12} "
            f"{', '.join(p.alone) or '-'}"
        )
        lines.append(f"{'':42}rates: {sources(p.sources)}")
    return [
        *lines,
        "* the profile's own (sweep.resources.gpus_per_trial, sweep.resources.step): the grid line above",
        "",
    ]


def row(r: Row, trials: int, label: str) -> str:
    return (
        f"{label:26} {trials:>7,} {flops(r.pflops * 1e15):>16} {number(r.device_hours):>16}   {duration(r.wall_hours)}"
    )


def search_lines(fc: Forecast) -> list[str]:
    configured = {f.strategy for f in fc.searches}
    if fc.search == "grid":
        last = ["the configured search is the grid: the lines above"]
    elif fc.search in configured:
        last = []
    else:
        last = [
            f"the configured search, {fc.search}, has no replay on the {fc.profile} shape: the grid's lines bound it"
        ]
    if not fc.searches:
        return last
    lines = [
        "What a search trains, MODELLED, not measured: the grid's FLOPs over the grid-over-search FLOP ratio that its",
        f"replay through the sweep's searcher measured on a synthetic grid of the {fc.profile} shape (the papers'",
        "reported frontiers with made-up curves, not training; a range where several draws were replayed):",
        f"`{REPLAY_COMMAND.format(profile=fc.profile)}`, docs/benchmarks.md.",
        "FLOPs and hours: first budget / the best ratio .. extended / the worst; wall at least: hours / slots (perfect",
        "packing, a lower bound).",
    ]
    if fc.shape_differs:
        lines.append(
            f"  NOTE: this grid has {fc.cells:,} cells, not the replayed shape's: the ratios may not carry over"
        )
    lines.append(f"{'':26} {'grid / it':>13} {'training FLOPs':>24} {fc.unit + '-hours':>24}   wall at least")
    for f in fc.searches:
        span = f"{min(f.ratios):.2f}x" + (f"..{max(f.ratios):.2f}x" if len(set(f.ratios)) > 1 else "")
        lines.append(
            f"{f.strategy + ' *' * (f.strategy == fc.search):26} {span:>13} "
            f"{flops(f.first.pflops * 1e15) + '..' + flops(f.extended.pflops * 1e15):>24} "
            f"{number(f.first.device_hours) + '..' + number(f.extended.device_hours):>24}   "
            f"{duration(f.first.wall_hours)}..{duration(f.extended.wall_hours)}"
        )
    if fc.search in configured:
        lines.append("* the configured search")
    return lines + last


TRIAL_COLUMNS = ("task", "size", "arch", "width", "depth", "seed", "lr", "train_steps", "train_seconds", "reused_from")


def read_trials(path: Path) -> list[dict]:
    """The rows of a sweep's results/trials.csv, checked to have what ``hindsight`` reads."""
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in TRIAL_COLUMNS if c not in (reader.fieldnames or [])]
            rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise ForecastError(f"--against {path}: cannot be read ({err})") from None
    if missing:
        raise ForecastError(f"--against {path}: not a sweep's results/trials.csv (no {', '.join(missing)} column)")
    return rows


def against_lines(path: Path, seen: list[Hindsight], slots: int) -> list[str]:
    """Each trial's forecast beside its time, then the sums and the spread of their ratio, and the wall those
    trials take on ``slots`` slots at their forecast times."""
    lines = ["", f"against {path}: each trial it trained, priced at the steps it trained"]
    if not seen:
        return [*lines, "  no trial trained there (every one reused, or none ran a step)"]
    width = max(len(h.trial) for h in seen)
    lines.append(f"  {'trial':<{width}} {'steps':>8} {'forecast':>10} {'took':>10}  forecast/took")
    for h in sorted(seen, key=lambda h: -h.took):
        lines.append(f"  {h.trial:<{width}} {h.steps:>8,} {minutes(h.forecast):>10} {minutes(h.took):>10}  "
                     f"{h.forecast / h.took:.2f}")  # fmt: skip
    ratios = sorted(h.forecast / h.took for h in seen)
    forecast, took = sum(h.forecast for h in seen), sum(h.took for h in seen)
    lines.append(f"  in all: {len(seen)} trials, forecast {minutes(forecast)}, took {minutes(took)} "
                 f"({forecast / took:.2f}); trial by trial {ratios[0]:.2f} to {ratios[-1]:.2f}")  # fmt: skip
    wall = f"  on {slots} slots, handed out as the sweep hands them out: {minutes(hindsight_wall(seen, slots))}"
    return [*lines, wall + run_wall(path.parent / "sweep.json")]


def run_wall(summary: Path) -> str:
    """The run's own wall time, from the sweep's summary beside its trials.csv, where it has one."""
    try:
        return f" (the sweep took {minutes(float(json.loads(summary.read_text())['wall_seconds']))}: {summary})"
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.1f} s"


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1")
    return value


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m pipeline.forecast", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--params",
        metavar="FILE",
        default=str(ROOT / "params.yaml"),
        help="params file (default: %(default)s)",
    )
    ap.add_argument("--profile", metavar="NAME", help="profile in conf/ (default: the params file's)")
    cluster = ap.add_argument_group("the cluster")
    cluster.add_argument("--nodes", metavar="N", type=positive, default=1, help="nodes, all alike (default: 1)")
    cluster.add_argument("--gpus-per-node", metavar="N", type=positive, default=8, help="GPUs a node (default: 8)")
    cluster.add_argument(
        "--gpu", metavar="KIND", help="the GPUs' kind (e.g. H100): printed, and checked against the device measured"
    )
    cluster.add_argument(
        "--cpus-per-node",
        metavar="N",
        type=positive,
        help="CPUs a node (default: on a CPU profile this machine's; on a GPU profile not limiting)",
    )
    tp = ap.add_argument_group("throughput: measured here, or read from a file")
    either = tp.add_mutually_exclusive_group()
    either.add_argument(
        "--throughput",
        metavar="FILE",
        type=Path,
        help='measured elsewhere, JSON: {"device": NAME, "flops_per_s": {ARCH: FLOP/s, or {WIDTH: FLOP/s, ...}}, '
        '"measured": [{"arch": ARCH, "width": W, "depth": D, "length": L, "batch": B, "seconds": S, "steps": N, '
        '"flops_per_s": R, "models": K, "processes": P, "step": eager|compiled|graphed, ...}, ...]} (--save-throughput '
        "and benchmarks/bench_pack.py write one): a trial's rate is its own shape's where measured, else an affine "
        "fit of the step's seconds (fixed + a layer's + FLOPs / rate) on three widths or more and two depths or "
        "lengths or more, else its width's, else the log-log interpolation between two measured widths",
    )
    either.add_argument(
        "--save-throughput", metavar="FILE", type=Path, help="write what is measured here to FILE, as it is measured"
    )
    tp.add_argument("--device", choices=["cpu", "cuda"], help="where to measure (default: cuda if there is one)")
    tp.add_argument("--precision", choices=get_args(Precision), help="measured in (default: sweep.optim.precision)")
    tp.add_argument("--step", choices=get_args(StepMode), help="how the steps run (default: sweep.resources.step)")
    tp.add_argument(
        "--measure-widths",
        metavar="W",
        type=positive,
        nargs="+",
        help="widths (default: each architecture's narrowest; on a GPU its widest and a middle one too)",
    )
    tp.add_argument(
        "--measure-depths",
        metavar="N",
        type=positive,
        nargs="+",
        help="depths (default: each one's shallowest; on a GPU its deepest too, at its narrowest and widest width)",
    )
    tp.add_argument(
        "--measure-budget-s",
        metavar="S",
        type=float,
        help="start no new round of measurements after S seconds, once every architecture has one (default: none)",
    )
    tp.add_argument("--measure-length", metavar="L", type=positive, help="tokens (default: the median dataset's L)")
    tp.add_argument(
        "--measure-every-length",
        action="store_true",
        help="measure at every dataset's L, not the median one's (a profile that decides a claim is checked so: a "
        "classification's step computes its answer's logits alone, and its cost grows with L slower than its FLOPs)",
    )
    tp.add_argument(
        "--measure-batch",
        metavar="N",
        type=positive,
        help="sequences a step (default: sweep.optim.batch_size; on a CPU a smaller one measures in seconds)",
    )
    tp.add_argument("--measure-steps", metavar="N", type=positive, default=3, help="timed steps (default: 3)")
    tp.add_argument("--warmup-steps", metavar="N", type=positive, default=1, help="untimed steps first (default: 1)")
    ap.add_argument(
        "--against",
        metavar="TRIALS_CSV",
        type=Path,
        help="a sweep's results/trials.csv of this profile: each trial it trained priced at the steps it trained, "
        "beside the seconds it took (how far the forecast is from that run, trial by trial)",
    )
    return ap


def measuring_on(args: argparse.Namespace, cfg: Config, archs: list[str]) -> tuple[torch.device, Precision]:
    """Where and in what precision to measure ``archs``; a device or precision this machine lacks is an error."""
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ForecastError("--device cuda: no CUDA device here")
    precision = args.precision or cfg.sweep.optim.precision
    if device.type == "cpu" and precision == "16-mixed":
        raise ForecastError("--precision 16-mixed needs a GPU: on a CPU measure in bf16-mixed or 32-true (--precision)")
    if device.type == "cpu":
        check_precision(archs, precision, "--precision" if args.precision else "sweep.optim.precision")
    return device, precision


def side_by_side(args: argparse.Namespace, cfg: Config, device: torch.device) -> int:
    """Trials measured at once: on a CPU, this machine's trial slots (they share its caches and memory bandwidth),
    unless a measuring budget is set; on a GPU one."""
    if device.type != "cpu" or args.measure_budget_s is not None:
        return 1
    return max(1, (os.cpu_count() or 1) // cfg.sweep.resources.cpus_per_trial)  # a GPU profile measured on a CPU: 1


def measured(
    args: argparse.Namespace, cfg: Config, cells: dict, device: torch.device, precision: Precision
) -> tuple[Throughput, str]:
    """The throughput measured here (kept with --save-throughput), with where it came from in words."""
    from pipeline.costs.throughput import measure_all  # Lightning's seconds of imports, only to measure

    throughput = measure_all(
        cfg,
        cells,
        widths=args.measure_widths,
        depths=args.measure_depths,
        length=args.measure_length,
        batch=args.measure_batch,
        steps=args.measure_steps,
        warmup=args.warmup_steps,
        device=device,
        precision=precision,
        step=args.step or cfg.sweep.resources.step,
        deadline=None if args.measure_budget_s is None else time.monotonic() + args.measure_budget_s,
        measured=args.save_throughput and (lambda so_far: so_far.dump(args.save_throughput)),
        every_length=args.measure_every_length,
        side_by_side=side_by_side(args, cfg, device),
    )
    if not args.save_throughput:
        return throughput, "measured now"
    return throughput, f"measured now, saved to {args.save_throughput}"


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        cfg = load_config(args.params, profile=args.profile)
        check_architectures(cfg)
        s = cfg.sweep
        archs = list(dict.fromkeys(a for task, _ in cfg.sweep_datasets() for a in s.grid.architectures_for(task)))
        given = Throughput.load(args.throughput, archs) if args.throughput else None
        cpus = args.cpus_per_node or (None if s.resources.gpus_per_trial else os.cpu_count() or 1)
        where = Cluster(args.nodes, args.gpus_per_node, args.gpu, cpus)
        where.slots(s.resources)  # a node that holds no trial: named now, not after the measurements
        trials = read_trials(args.against) if args.against else []  # named before any measurement
        if given is None:
            device, precision = measuring_on(args, cfg, archs)  # named before any model is built
        cells = {at: replace(cell, **model_costs(cell, s.model.heads)) for at, cell in defined_cells(cfg).items()}
        if given is None:
            throughput, source = measured(args, cfg, cells, device, precision)
        else:
            throughput, source = given, f"from {args.throughput}"
        params = Path(args.params)
        shown = params.name if params.resolve() == ROOT / "params.yaml" else str(params)
        print(render(forecast(cfg, cells, throughput, where), cfg, shown, throughput, where, source))
        if args.against:
            seen = hindsight(cfg, cells, throughput, trials)
            print("\n".join(against_lines(args.against, seen, where.slots(s.resources))))
    except (ConfigError, ForecastError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
