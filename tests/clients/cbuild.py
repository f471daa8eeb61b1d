"""Building C against the agent's C client (clients/c/) for the tests, with every warning an error.

The compiler is ``$CC`` or ``cc``; ``deploy/test.sh`` installs one (gcc) when the machine has
none, so a missing compiler fails these tests rather than skipping them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "clients" / "c"
DRIVER = ROOT / "tests" / "clients" / "c" / "record.c"
STRICT = ("-std=c99", "-pedantic", "-Wall", "-Wextra", "-Werror")
"""The flags the client, the tests' programs and the generated code are compiled with."""


def compiler() -> str:
    """The C compiler, or the test fails saying how to get one."""
    found = shutil.which(os.environ.get("CC", "cc"))
    if found is None:
        pytest.fail("no C compiler (cc): deploy/test.sh installs gcc and make, or set CC")
    return found


@dataclass(frozen=True)
class CBuild:
    """The client built in ``directory``: its static library, and the tests' record driver.

    Attributes:
        directory: where everything was built.
        library: ``libldp_client.a``, built by clients/c/Makefile.
        driver: ``record`` (tests/clients/c/record.c) linked with the library.
        checked_driver: the same built with AddressSanitizer and UndefinedBehaviorSanitizer, every
            finding fatal, where the compiler has them (None elsewhere).
    """

    directory: Path
    library: Path
    driver: Path
    checked_driver: Path | None

    def compile(self, sources: Sequence[Path], output: Path, *flags: str) -> subprocess.CompletedProcess[str]:
        """Compile and link ``sources`` with the client (strict flags and ``flags``); not checked."""
        return subprocess.run(
            [compiler(), *STRICT, *flags, f"-I{CLIENT}", *map(str, sources), str(self.library), "-o", str(output)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )


def build(directory: Path) -> CBuild:
    """Build the library with its Makefile (``make check``: every warning an error) and the driver."""
    cc = compiler()
    if shutil.which("make") is None:
        pytest.fail("no make: deploy/test.sh installs it")
    made = subprocess.run(
        ["make", "-C", str(CLIENT), f"BUILD={directory}", f"CC={cc}", "check"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    library = directory / "libldp_client.a"
    result = CBuild(directory, library, directory / "record", None)
    linked = result.compile([DRIVER], result.driver)
    assert linked.returncode == 0, linked.stderr
    checked = directory / "record-checked"
    sanitized = subprocess.run(
        [
            cc,
            *STRICT,
            "-g",
            "-fsanitize=address,undefined",
            "-fno-sanitize-recover=all",
            f"-I{CLIENT}",
            str(DRIVER),
            str(CLIENT / "ldp_client.c"),
            "-o",
            str(checked),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return CBuild(directory, library, result.driver, checked if sanitized.returncode == 0 else None)
