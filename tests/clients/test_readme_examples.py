"""The README's "Recording from an application" runs as written: its shell lines, Python and C programs,
in order, against a real agent daemon with deploy/usecases.example.toml."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clients.cbuild import compiler
from tests.clients.conftest import ROOT, RunningAgent, agent_daemon

SECTION = "### Recording from an application"


def _blocks() -> list[tuple[str, str]]:
    """The section's fenced code blocks, in order, as (language, text)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split(SECTION, 1)[1].split("\n### ", 1)[0]
    return re.findall(r"```(\w+)\n(.*?)```", section, re.S)


@pytest.fixture
def example_agent() -> Iterator[RunningAgent]:
    """A daemon with the example registry of deploy/, consent granted."""
    with agent_daemon((ROOT / "deploy" / "usecases.example.toml").read_text(encoding="utf-8")) as agent:
        yield agent


def test_the_readme_names_the_three_ways_each_with_its_examples() -> None:
    """The section has the command, the Python and C library programs and the generated API's, in that order."""
    assert [language for language, _ in _blocks()] == ["sh", "python", "c", "sh", "sh", "python", "c", "sh"]


def test_every_example_of_the_section_runs_against_a_real_agent(example_agent: RunningAgent, tmp_path: Path) -> None:
    """Each shell line exits 0 in a copy of the tree's deploy/ and clients/c/, with the programs the
    section writes; the agent holds what they recorded."""
    compiler()  # fails, saying how to get one, when the machine has no C compiler
    work = tmp_path / "app"
    (work / "clients").mkdir(parents=True)
    shutil.copytree(ROOT / "clients" / "c", work / "clients" / "c")
    (work / "deploy").symlink_to(ROOT / "deploy")
    env = dict(
        os.environ,
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        LDP_AGENT_CONFIG=str(example_agent.config),
        LDP_AGENT_SOCKET=str(example_agent.socket),
    )
    outputs = []
    for language, text in _blocks():
        if language in ("python", "c"):
            name = re.match(r"(?:#|/\*) (\S+)", text)
            assert name, f"a {language} example starts with a comment naming its file: {text[:40]!r}"
            (work / name[1]).write_text(text, encoding="utf-8")
            continue
        for line in text.splitlines():
            done = subprocess.run(
                ["bash", "-c", f"set -euo pipefail; {line}"],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
            outputs.append(done.stdout)
    said = "".join(outputs)
    assert "app-usage-seconds: recorded: added to this period's total" in said
    assert "refused: use case 'dark-mode-enabled' (rr)" in said
    assert "emoji: recorded, 2 of at most 1 today" in said  # the command's emoji, then the C program's
    rows = {r["use_case"]: r for r in json.loads(example_agent.cli("status", "--json").stdout)["use_cases"]}
    assert rows["emoji"]["pending_records"] == 1  # two recorded, one a day kept (a random one)
    assert rows["app-usage-seconds"]["open_counters"] == 1  # key firefox: the command, the library, the generated
    assert rows["dark-mode-enabled"]["pending_records"] == 1
