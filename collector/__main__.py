"""``python -m collector``: the same as the ``ldp-collector`` console script."""

import sys

from collector.cli import main

sys.exit(main())
