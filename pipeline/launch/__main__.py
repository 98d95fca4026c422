"""``python -m pipeline.launch``: the launchers' command line (``pipeline.launch.commands``).

A stop request (SIGTERM, SIGINT: `ray job stop`, a pod's deletion, Ctrl-C) ends it with one line and 128 + the
signal's number, whatever it is doing, its imports included: ops/ray-job reports that status as the job's."""

import sys

from pipeline.common.signals import Stopped, exit_on_signals  # standard library only: in force before the imports

with exit_on_signals():
    try:
        from pipeline.launch.commands import main

        status = main()
    except Stopped as err:
        print(f"python -m pipeline.launch: {err}", file=sys.stderr)
        status = 128 + err.signum
sys.exit(status)
