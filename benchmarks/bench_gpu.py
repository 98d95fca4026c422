"""Training throughput of every architecture at paper shapes on this machine's accelerator: tokens per second, model
FLOP utilisation against the device's peak, peak memory, and the micro-batch the trial would choose.

    python -m benchmarks.bench_gpu                 # CUDA: width 512, depth 5, L = 500, batch 512, bf16 (minutes)
    python -m benchmarks.bench_gpu --quick         # width 64, depth 2, L = 128, batch 32: seconds, a CPU too

Per architecture, standard first, after 3 warm-up steps (the third timed), ``--repeats`` runs of as many optimiser
steps of AdamW on random tokens as fit ``--budget-s`` (1 to 10; ``--steps`` fixes them) are timed, the device
synchronised at both ends, and its row is printed and written at once: a run stopped by a time limit keeps every row
it finished. An architecture that runs out of memory gets a row saying so. Tokens/s counts every position of
the batch; utilisation = 3 x the model's exact forward FLOPs per token x tokens/s / peak (bf16 dense peak on a GPU,
named with its device; on a CPU the float32 peak of ``bench_models.theoretical_peak``). The batch is the
profile's global batch split into the micro-batches ``pipeline.training.memory`` chooses for the device's memory
(``--memory-gb`` to plan for another card). Figures go to ``docs/benchmarks/bench_gpu.json`` (``--out``).
The targets (issue: paper scale on GPUs): standard at width >= 512 above 40% of peak, every architecture within 2x
of standard per token.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import time

import torch
import torch.nn.functional as F

import models
from benchmarks.bench_models import theoretical_peak
from benchmarks.results import Results, figure, out_option, out_path
from models import kernels
from pipeline.training.memory import GB, budget_bytes, fit_memory
from pipeline.training.steps import StepForward, effective

# dense bf16 peaks (NVIDIA's data sheets, without sparsity), by a part of the device's name
PEAK_BF16 = {"H200": 989e12, "H100 PCIe": 756e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12}
VOCAB = 32
WITH_KERNEL = ("linear", "linear_nofm", "mamba", "retnet")  # their scans have a Triton kernel and a torch form


def peak(device: torch.device, threads: int) -> tuple[float, str]:
    if device.type != "cuda":
        return theoretical_peak(threads)
    name = torch.cuda.get_device_name(device)
    for part, flops in PEAK_BF16.items():
        if part in name:
            return flops, f"{name}: bf16 dense {flops / 1e12:.0f} TFLOP/s"
    raise SystemExit(f"bench_gpu: no bf16 peak known for {name!r}; add it to PEAK_BF16")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def training_step(model, batches: list[torch.Tensor], opt, autocast) -> None:
    """One optimiser step accumulating the micro-batches ``batches`` (B_i, L + 1)."""
    for x in batches:
        with autocast:
            logits = model(x[:, :-1])  # (B_i, L, V)
        loss = F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten()) / len(batches)
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def timed(run, device: torch.device, times: int = 1) -> float:
    """Seconds ``run()`` takes ``times`` times over, the device synchronised at both ends."""
    synchronize(device)
    start = time.perf_counter()
    for _ in range(times):
        run()
    synchronize(device)
    return time.perf_counter() - start


def measure(
    arch: str, args, shape: tuple[int, int, int, int], device: torch.device, autocast, step_mode: str = "eager"
) -> dict:
    """One architecture's row: built, planned into micro-batches, warmed up (3 steps), then ``args.repeats`` runs
    of ``args.steps`` timed steps, or of as many as fit ``args.budget_s`` (at least 1, at most 10). ``step_mode``:
    the model's forward as a trial's ``sweep.resources.step`` runs it (``pipeline.training.steps``)."""
    width, depth, length, batch = shape
    gpu = device.type == "cuda"
    torch.manual_seed(0)
    model = models.build_model(arch, vocab_size=VOCAB, width=width, depth=depth, heads=4, max_len=length + 1)
    model = model.to(device)
    with torch.random.fork_rng(devices=[device] if gpu else []):
        fit = fit_memory(model, length, batch, budget_bytes(args.memory_gb, 1.0, device), device, lambda: autocast)
    micro = list(torch.randint(2, VOCAB, (batch, length + 1), device=device).tensor_split(fit.micro_batches))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    # after the plan, which measures the eager model; compiling happens in the warm-up steps
    forward = torch.compile(model) if args.compile else StepForward(model, step_mode, device)  # type: ignore[arg-type]
    step = functools.partial(training_step, forward, micro, opt, autocast)
    timed(step, device, 2)
    one = timed(step, device)  # the third warm-up step, timed: how many steps the budget holds
    steps = args.steps or max(1, min(10, int(args.budget_s / (args.repeats * one))))
    if gpu:
        torch.cuda.reset_peak_memory_stats(device)
    rates = [steps / timed(step, device, steps) for _ in range(args.repeats)]
    per_token = 3 * model.exact_flops(length) / length  # training FLOPs per token
    if isinstance(forward, StepForward) and forward.mode != step_mode:  # it fell back to eager
        return {"error": f"not measured: {forward.why}"}
    tokens_per_s = [r * batch * length for r in rates]
    row = {"tokens_per_s": figure(tokens_per_s, "tokens/s"),
           "mfu": figure([100 * t * per_token / args.peak for t in tokens_per_s], "%"),
           "steps": steps, "micro_batches": fit.micro_batches, "micro_batch": len(micro[0]),
           "planned_gb": fit.needed(len(micro[0])) / GB}
    if gpu:
        row["peak_memory_gb"] = torch.cuda.max_memory_allocated(device) / GB
    return row


# rows beside the architectures' (issue 46 item 5, paper shapes): the standard model's step as a trial compiles or
# graphs it (sweep.resources.step), and the linear kernel at head dim 256 (width 1024 over 4 heads: the DP paper's
# widest) with its keys in tiles against the one tile it took before (models.linear_triton.KEY_TILE); measured on a GPU
# only
VARIANTS = ("standard@compiled", "standard@graphed", "linear@dk256", "linear@dk256-one-tile")


def variant(name: str, args, shape: tuple[int, int, int, int], device: torch.device, autocast) -> dict:
    """A ``VARIANTS`` row, or why it is not measured here."""
    arch, how = name.split("@")
    if how in ("compiled", "graphed"):
        why = effective(how, device)[1]  # type: ignore[arg-type]
        return {"error": f"not measured: {why}"} if why else measure(arch, args, shape, device, autocast, how)
    if not kernels_run_on(device):
        return {"error": "not measured: the Triton kernel runs on CUDA (here its torch form would be measured)"}
    from models import linear_triton

    wide = (1024, *shape[1:])  # 4 heads of 256
    tile = linear_triton.KEY_TILE
    try:
        linear_triton.KEY_TILE = 256 if how.endswith("one-tile") else tile  # one tile: the kernel before tiling
        return measure(arch, args, wide, device, autocast)
    finally:
        linear_triton.KEY_TILE = tile


def kernels_run_on(device: torch.device) -> bool:
    """Whether the scans' Triton kernels run on ``device`` (CUDA with triton installed)."""
    return kernels.triton_ready(torch.zeros(1, device=device))


def line(name: str, row: dict, standard: float | None, kernel_row: dict | None) -> str:
    """A row as printed: tokens/s, MFU, steps, micro-batches, peak memory, its time per token against standard's and,
    for a torch form measured beside its kernel, the kernel's speed-up over it."""
    if "error" in row:
        return f"{name:15s} {row['error']}"
    rate = row["tokens_per_s"]["median"]
    text = (f"{name:15s} {rate:12,.0f} tokens/s  MFU {row['mfu']['median']:5.1f}%  {row['steps']} steps x "
            f"{len(row['tokens_per_s']['values'])}  micro-batch {row['micro_batch']} x {row['micro_batches']}")
    if "peak_memory_gb" in row:
        text += f"  peak {row['peak_memory_gb']:.1f} GB"
    if standard:
        text += f"  {standard / rate:.2f}x standard's time per token"
    if name.endswith("@torch") and kernel_row and "error" not in kernel_row:
        text += f"  (the Triton kernel: {kernel_row['tokens_per_s']['median'] / rate:.2f}x this)"
    return text


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_gpu", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small shapes: checks the script runs (any device)")
    ap.add_argument("--archs", nargs="+", default=sorted(models.ARCHITECTURES), choices=sorted(models.ARCHITECTURES))
    ap.add_argument("--steps", type=int, default=None, help="timed steps per repeat (default: as many as fit "
                                                            "--budget-s, 1 to 10)")
    ap.add_argument("--budget-s", type=float, default=None, help="seconds of timed steps per architecture, all "
                                                                 "repeats together (default 12, --quick 0.5)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--memory-gb", type=float, default=None, help="plan micro-batches for this much (default: the "
                                                                  "device's memory; none on a CPU)")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads (a CPU run)")
    ap.add_argument("--no-torch-forms", action="store_true", help="skip the <arch>@torch rows")
    ap.add_argument("--compile", action="store_true", help="torch.compile each model (section *_compiled; a "
                                                           "model that does not compile gets a row saying why)")
    ap.add_argument("--variants", nargs="*", choices=VARIANTS, default=None,
                    help=f"rows after the architectures' (default: all of {', '.join(VARIANTS)} on a GPU, none "
                         "with --quick or --compile; measured on a GPU only: elsewhere a row says why)")
    out_option(ap, "bench_gpu")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape = (64, 2, 128, 32) if args.quick else (512, 5, 500, 512)
    args.peak, how = peak(device, args.threads)
    args.budget_s = args.budget_s or (0.5 if args.quick else 12.0)
    gpu = device.type == "cuda"
    if gpu:
        torch.backends.cuda.matmul.allow_tf32 = True
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if gpu else contextlib.nullcontext()
    width, depth, length, batch = shape
    settings = {"device": torch.cuda.get_device_name(device) if gpu else "cpu", "peak": how, "width": width,
                "depth": depth, "length": length, "batch": batch, "budget_s": args.budget_s, "repeats": args.repeats,
                "precision": "bf16-mixed" if gpu else "32-true", "compile": args.compile}
    print(f"bench_gpu on {settings['device']} ({how}): width {width}, depth {depth}, L {length}, batch {batch}",
          flush=True)
    res = Results("bench_gpu", argv)
    section = ("quick" if args.quick else "paper_shapes") + ("_compiled" if args.compile else "")
    figures = res.section(section, settings)
    # where the Triton kernels run, each scan's torch form is measured beside its kernel: row "<arch>@torch"
    triton = kernels_run_on(device)
    side_by_side = triton and not args.no_torch_forms
    settings["kernels"] = ("triton, and the torch forms beside them" if side_by_side else
                           "triton" if triton else "torch forms only")
    standard = None
    # standard first, the yardstick of every other row; each row written as soon as it is measured
    for arch in sorted(args.archs, key=lambda a: a != "standard"):
        for backend in ("triton", "torch") if side_by_side and arch in WITH_KERNEL else ("triton",):
            name = arch if backend == "triton" else f"{arch}@torch"
            try:
                with kernels.use(backend):
                    row = measure(arch, args, shape, device, autocast)
            except torch.OutOfMemoryError as e:  # a row, not the end of the benchmark
                row = {"error": f"out of memory: {str(e).splitlines()[0]}"}
            except Exception as e:  # noqa: BLE001 (compile's many error types), recorded as the row
                if not args.compile:
                    raise
                row = {"error": f"does not compile: {type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"}
            figures[name] = row
            if name == "standard" and "error" not in row:
                standard = row["tokens_per_s"]["median"]
            print(line(name, row, standard, figures.get(arch)), flush=True)
            res.write(out_path(args, "bench_gpu"))
            if gpu:
                torch.cuda.empty_cache()
    default = list(VARIANTS) if gpu and not (args.quick or args.compile) else []
    for name in default if args.variants is None else args.variants:
        try:
            row = variant(name, args, shape, device, autocast)
        except torch.OutOfMemoryError as e:
            row = {"error": f"out of memory: {str(e).splitlines()[0]}"}
        figures[name] = row
        print(line(name, row, standard, figures.get(name.split("@")[0])), flush=True)
        res.write(out_path(args, "bench_gpu"))
        if gpu:
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
