"""``python -m pipeline.nightly``: the night's command line (``pipeline.nightly.rerun``)."""

import sys

from pipeline.nightly.rerun import main

sys.exit(main())
