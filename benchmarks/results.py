"""Benchmark results as files: every benchmark writes the figures it prints to a JSON file (``--out``), which
``docs/benchmarks.md`` quotes.

A file holds one benchmark's sections. Each section says how it was measured (the command line, the date, the git
commit and whether the tree was dirty, the machine's CPUs, the settings) and holds its figures: each figure is the
median of its repeated measurements with their spread (min..max) and every value, or an exact count. A run
replaces the sections it measured and keeps the others, so a partial run (``--training-only``, ``--tasks lis``)
updates its own part of the file only.

    python -m benchmarks.results docs/benchmarks/bench_models.json    # the file's figures as Markdown
    python -m benchmarks.results --versions                           # what this machine's figures rest on
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shlex
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "benchmarks"  # the default folder of every benchmark's file


def figure(values, unit: str = "") -> dict:
    """Repeated measurements of one figure: median, min, max (the spread) and every value, in ``unit``."""
    v = [float(x) for x in (values if isinstance(values, (list, tuple)) else [values])]
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "values": v, "unit": unit}


def provenance(module: str, argv: list[str] | None) -> dict:
    """How a section was measured: the command line, the date, the commit (dirty: tracked files differ from it)
    and the machine."""
    from pipeline.common.provenance import git_commit

    commit = git_commit(ROOT)
    args = sys.argv[1:] if argv is None else argv
    return {"command": shlex.join(["python", "-m", module, *args]),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "commit": commit.sha, "dirty": commit.dirty,
            "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                        "python": platform.python_version()}}


class Results:
    """The sections one run of a benchmark measured, written (merged into the file's other sections) by
    ``write``."""

    def __init__(self, benchmark: str, argv: list[str] | None):
        self.benchmark = benchmark
        self.run = provenance(f"benchmarks.{benchmark}", argv)
        self.sections: dict[str, dict] = {}

    def section(self, name: str, settings: dict | None = None) -> dict:
        """A new section's figures (a dict to fill: figure name -> ``figure(...)``, or nested by row)."""
        self.sections[name] = {**self.run, "settings": settings or {}, "figures": {}}
        return self.sections[name]["figures"]

    def write(self, path: Path | None) -> Path | None:
        """Merge this run's sections into ``path`` (created with its folder if missing); None writes nothing."""
        if path is None or not self.sections:
            return None
        path = Path(path)
        try:
            old = json.loads(path.read_text())
        except (OSError, ValueError):
            old = {}
        sections = old.get("sections", {}) if old.get("benchmark") == self.benchmark else {}
        sections.update(self.sections)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps({"benchmark": self.benchmark, "sections": dict(sorted(sections.items()))},
                                  indent=1, allow_nan=True) + "\n")
        tmp.replace(path)
        print(f"wrote {', '.join(self.sections)} to {path}", file=sys.stderr)
        return path


def out_option(ap: argparse.ArgumentParser, name: str, quick_note: bool = True) -> None:
    """The ``--out`` option every benchmark takes: default ``docs/benchmarks/<name>.json``, none for ``--quick``."""
    ap.add_argument("--out", type=Path, default=None, metavar="PATH",
                    help=f"JSON file the figures are written to (default: docs/benchmarks/{name}.json"
                         + ("; with --quick, none unless given" if quick_note else "") + ")")


def out_path(args: argparse.Namespace, name: str) -> Path | None:
    """Where a run writes: ``--out`` if given; else the docs' file, except for a --quick run (toy figures)."""
    if args.out is not None:
        return args.out
    return None if getattr(args, "quick", False) else RESULTS / f"{name}.json"


# ---- reading a file back, for the docs -----------------------------------------------------------------------
def fmt(f, digits: int = 3) -> str:
    """A figure as 'median (min..max) unit', or a plain value."""
    if isinstance(f, dict) and "median" in f:
        def n(x: float) -> str:
            return f"{x:.{digits}g}" if math.isfinite(x) and abs(x) < 100 else f"{x:,.0f}"
        spread = "" if f["min"] == f["max"] else f" ({n(f['min'])}..{n(f['max'])})"
        unit = f.get("unit") or ""
        return f"{n(f['median'])}{'' if unit in ('', 'x', '%') else ' '}{unit}{spread}"
    return str(f)


def rows(figures: dict, prefix: str = "") -> list[tuple[str, str]]:
    """(name, formatted figure) for every figure, nested names joined by ' / '."""
    out = []
    for name, f in figures.items():
        if isinstance(f, dict) and "median" not in f:
            out.extend(rows(f, f"{prefix}{name} / "))
        else:
            out.append((prefix + name, fmt(f)))
    return out


def markdown(data: dict) -> str:
    lines = [f"# {data['benchmark']}"]
    for name, s in data["sections"].items():
        dirty = " (dirty)" if s["dirty"] else ""
        how = f"`{s['command']}`, {s['date'][:10]}, commit {s['commit'][:7]}{dirty}, {s['machine']['cpus']} CPUs"
        lines += ["", f"## {name}", "", how, ""]
        if s.get("settings"):
            lines += ["settings: " + ", ".join(f"{k} {v}" for k, v in s["settings"].items()), ""]
        lines += ["| figure | median (min..max) |", "|---|---|"]
        lines += [f"| {n} | {v} |" for n, v in rows(s["figures"])]
    return "\n".join(lines)


VERSIONED = ("torch", "lightning", "triton", "numpy", "numba", "pyarrow", "pandas", "pydantic")


def versions() -> list[str]:
    """This interpreter's and the measured stack's versions, and the accelerator torch sees: what a figure rests on."""
    import importlib.metadata

    import torch

    found = [f"python {platform.python_version()}"]
    for name in VERSIONED:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name} absent")
    if torch.cuda.is_available():
        found.append(f"cuda {torch.version.cuda}, {torch.cuda.get_device_name()}")
    else:
        found.append("no CUDA device")
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.results", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--versions", action="store_true", help="print the versions a figure rests on, one a line")
    args = ap.parse_args(argv)
    if args.versions:
        print("\n".join(versions()))
    for path in args.files:
        print(markdown(json.loads(path.read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
