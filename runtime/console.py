"""What the command-line tools need from their host: the installed version, and a quiet end on a closed pipe."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from runtime.exit_status import ExitStatus

__all__ = ["VersionAction", "package_version", "quiet_on_closed_pipe"]


def package_version() -> str:
    """The installed distribution's version (``"(not installed)"`` when run from a bare checkout)."""
    # importlib.metadata brings email, zipfile, csv and the compressors with it: CPU and
    # memory that a device's commands and daemon would pay for nothing unless --version is
    # asked (docs/benchmarks.md, "Imports a device defers or avoids").
    import importlib.metadata  # noqa: PLC0415

    try:
        return importlib.metadata.version("ldp-telemetry")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


class VersionAction(argparse.Action):
    """``--version`` that looks the version up only when asked: ``"PROG VERSION"``, then exit 0."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        kwargs.setdefault("help", "show program's version number and exit")
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        sys.stdout.write(f"{parser.prog} {package_version()}\n")  # on stdout, as argparse's own action
        parser.exit()


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
