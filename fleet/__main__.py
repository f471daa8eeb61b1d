"""``python -m fleet``: the same as ``ldp-fleet``."""

from fleet.cli import main

raise SystemExit(main())
