"""What the command-line tools need from their host: the installed version, and a quiet end on a closed pipe."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import sys
from collections.abc import Callable

from runtime.exit_status import ExitStatus

__all__ = ["package_version", "quiet_on_closed_pipe"]


def package_version() -> str:
    """The installed distribution's version (``"(not installed)"`` when run from a bare checkout)."""
    try:
        return importlib.metadata.version("ldp-telemetry")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def quiet_on_closed_pipe(run: Callable[[], int]) -> int:
    """Run a command; if the reader of stdout went away (``| head -1``), end quietly: no traceback,
    the command's status if it had finished (status 0 if the pipe closed while it was printing)."""
    status: int = ExitStatus.OK  # what was printed before the reader left was the whole answer it wanted
    try:
        status = run()
        sys.stdout.flush()
    except BrokenPipeError:
        # Python would report the failed flush at exit again: point stdout at /dev/null first.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return status
