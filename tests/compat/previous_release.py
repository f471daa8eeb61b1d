"""The previous release of this project, installed from its wheel, and a way to run its code.

``tests/compat/previous/`` holds the wheel of release 0.1.0 (the last one whose reports carried
the whole registry's hash), built from the git history by ``tests/compat/make_previous_release.sh``.
A wheel of pure Python is installed by unpacking it; :func:`install` does that into a directory
of its own, and :meth:`PreviousRelease.run` runs a script with that directory first on
``sys.path``, so ``import agent`` (or ``collector``, ``protocol``) is the previous release's
code, on this environment's numpy, msgpack, cryptography, aiomqtt and psycopg. Each script
asserts that it runs the old code before it does anything.

What the scripts write (agent state directories, checkpoint stores, reports) is what that
release wrote: the compatibility tests open it with this release's code.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "MECHANISMS",
    "METADATA_KEYS",
    "VERSION",
    "WHEEL",
    "PreviousRelease",
    "for_previous",
    "install",
    "known_to_previous",
    "without_metadata",
]

VERSION = "0.1.0"
WHEEL = Path(__file__).resolve().parent / "previous" / f"ldp_telemetry-{VERSION}-py3-none-any.whl"

MECHANISMS = frozenset({"rr", "one-bit-mean", "dbitflip", "rappor", "cms", "hcms", "sfp"})
"""The mechanisms the previous release knows; it refuses a registry that names another."""

_TABLE = re.compile(r"^\[use_cases\.([a-z0-9][a-z0-9._-]*?)(?:\.(?:parameters|collector))?\]\s*$")
_MECHANISM = re.compile(r'^mechanism\s*=\s*"([^"]+)"', re.M)


def known_to_previous(text: str) -> str:
    """A registry's text without the use cases whose mechanism the previous release does not know
    (every table of such a use case removed; the rest, comments included, as it was)."""
    blocks: list[tuple[str | None, list[str]]] = [(None, [])]
    for line in text.splitlines(keepends=True):
        match = _TABLE.match(line)
        if match and match.group(1) != blocks[-1][0]:
            blocks.append((match.group(1), []))
        blocks[-1][1].append(line)
    mechanism: dict[str, str] = {}
    for name, lines in blocks:
        found = _MECHANISM.search("".join(lines))
        if name is not None and found:
            mechanism[name] = found.group(1)
    return "".join("".join(lines) for name, lines in blocks if name is None or mechanism.get(name, "rr") in MECHANISMS)


_PRELUDE = """
import sys
sys.path.insert(0, {root!r})
import agent, collector, protocol
for _module in (agent, collector, protocol):
    assert _module.__file__.startswith({root!r}), f"not the previous release's code: {{_module.__file__}}"
import protocol.envelope
assert protocol.envelope.FORMAT_VERSION == 1, "the previous release writes wire format 1"
"""


@dataclass(frozen=True)
class PreviousRelease:
    """Release 0.1.0, unpacked into ``root``."""

    root: Path

    def command(self, script: str, *args: str) -> list[str]:
        """The command line that runs ``script`` (Python source) under the previous release."""
        code = _PRELUDE.format(root=str(self.root)) + textwrap.dedent(script)
        return [sys.executable, "-c", code, *args]

    def run(self, script: str, *args: str, timeout: float = 300.0) -> Any:
        """Run ``script`` to its end; what it printed on its last line, parsed as JSON.

        Raises:
            AssertionError: the script failed (with its output).
        """
        done = subprocess.run(self.command(script, *args), capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise AssertionError(f"the previous release's script failed ({done.returncode}):\n{done.stderr[-4000:]}")
        lines = done.stdout.strip().splitlines()
        return json.loads(lines[-1]) if lines else None


METADATA_KEYS = ("strict", "owner", "expires", "data_review", "notification_emails")
"""The registry keys this release added (protocol/metadata.py), which release 0.1.0 refuses as unknown."""


def without_metadata(text: str) -> str:
    """A registry's text with the lines of :data:`METADATA_KEYS` removed: what release 0.1.0 reads."""
    keys = "|".join(METADATA_KEYS)
    return re.sub(rf"^(?:{keys}) = .*\n", "", text, flags=re.MULTILINE)


def for_previous(text: str) -> str:
    """What release 0.1.0 reads of a registry of this release: without the use cases of mechanisms
    it lacks (:func:`known_to_previous`) and without the metadata keys (:func:`without_metadata`)."""
    return without_metadata(known_to_previous(text))


def install(directory: Path) -> PreviousRelease:
    """Unpack the previous release's wheel into ``directory`` (a wheel of pure Python is
    installed by unpacking it)."""
    if not WHEEL.exists():
        raise FileNotFoundError(f"{WHEEL} is missing; tests/compat/make_previous_release.sh makes it")
    directory.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(WHEEL) as wheel:
        wheel.extractall(directory)
    return PreviousRelease(directory)
