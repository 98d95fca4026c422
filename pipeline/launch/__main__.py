"""``python -m pipeline.launch``: the launchers' command line (``pipeline.launch.commands``).

A stop request (SIGTERM, SIGINT: `ray job stop`, a pod's deletion, Ctrl-C) ends it with one line and 128 + the
signal's number, whatever it is doing, its imports included; once its work is done, one ends the process as the
signal's default does (no traceback from the interpreter's teardown). ops/ray-job reports such a status as a stop."""

import signal
import sys

from pipeline.common.signals import SIGNALS, Stopped, exit_on_signals  # standard library only: before the imports

with exit_on_signals():
    try:
        from pipeline.launch.commands import main

        status = main()
    except Stopped as err:
        print(f"python -m pipeline.launch: {err}", file=sys.stderr)
        status = 128 + err.signum
for sig in SIGNALS:
    if signal.getsignal(sig) is not signal.SIG_IGN:  # one its caller ignores stays ignored
        signal.signal(sig, signal.SIG_DFL)
sys.exit(status)
