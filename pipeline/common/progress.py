"""Progress a person can follow: a live bar on a terminal, a line every 30 s in logs (CI, dvc repro > file)."""

from __future__ import annotations

import sys

from tqdm import tqdm

SHOWN = True  # False in worker processes that run whole jobs side by side: their bars would overwrite each other


def hide_bars() -> None:
    """No progress bars from this process (a worker beside others: one bar for all of them is the parent's)."""
    global SHOWN
    SHOWN = False


def progress(total: int, desc: str, unit: str = "it") -> tqdm:
    live = sys.stderr.isatty()
    hidden = {} if SHOWN else {"disable": True}  # never disable=False: it would override $TQDM_DISABLE
    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        unit_scale=True,
        dynamic_ncols=True,
        mininterval=0.2 if live else 30.0,
        leave=True,
        **hidden,
    )
