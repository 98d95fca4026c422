"""``python -m pipeline.launch``: the launchers' command line (``pipeline.launch.commands``)."""

import sys

from pipeline.launch.commands import main

sys.exit(main())
