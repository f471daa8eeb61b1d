"""``python -m agent``: the same as the ``ldp-agent`` console script."""

from agent.cli import main

raise SystemExit(main())
