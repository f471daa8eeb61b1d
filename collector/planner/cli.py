"""``ldp-collector plan``: parse the subcommand, run its planner, print the plan or say why there is none."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from collector.planner.inputs import PlanError, Result, positive
from collector.planner.output import plain, text
from collector.planner.parser import Planner, build_parser

__all__ = ["main", "plan"]


def _run(args: argparse.Namespace) -> Result:
    for name in ("epsilon", "n", "target_se", "target_error", "m", "k"):
        positive(getattr(args, name, None), name)
    planner: Planner = args.planner
    return planner(args)


def plan(argv: Sequence[str]) -> Result:
    """Parse ``argv`` (the arguments after ``plan``) and return the plan as a dictionary.

    Raises:
        PlanError: when the inputs cannot give a plan.
        SystemExit: on a usage error (argparse).
    """
    return _run(build_parser().parse_args(list(argv)))


def main(argv: list[str] | None = None) -> int:
    """``ldp-collector plan``: print a plan; 0 on success, 2 on a usage error or an unreachable target.

    Args:
        argv: the arguments after ``plan`` (default: ``sys.argv[1:]``).
    """
    try:
        args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # argparse: --help exits 0, usage errors 2
        return exc.code if isinstance(exc.code, int) else 2
    try:
        result = _run(args)
    except PlanError as exc:
        print(f"ldp-collector plan: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(plain(result), indent=2, sort_keys=True))
    else:
        print(text(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
