"""``--help`` of the deploy scripts: on stdout, status 0, and nothing run before it.

A help text on stderr escapes ``| less`` and ``| grep``; ``deploy/test.sh --help`` used to
install packages and run ruff and mypy before pytest printed its options.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("script", "first_words"),
    [
        ("deploy/run-demo.sh", "Run the whole system on this machine"),
        ("deploy/install.sh", "Install one role of ldp-telemetry on this host"),
        ("deploy/test.sh", "Install everything the tests need on a fresh machine"),
    ],
)
def test_help_goes_to_stdout_with_status_0(script: str, first_words: str) -> None:
    run = subprocess.run([script, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(first_words)
    assert run.stderr == ""


def test_test_sh_help_runs_no_check_first() -> None:
    """No ruff, mypy or pytest run before the help: their banners never appear."""
    run = subprocess.run(
        ["deploy/test.sh", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert run.returncode == 0
    assert "== ruff" not in run.stdout
    assert "== mypy" not in run.stdout
    assert "Usage: deploy/test.sh [pytest arguments]" in run.stdout


def test_run_demo_help_names_the_smallest_useful_fleet() -> None:
    run = subprocess.run(
        ["deploy/run-demo.sh", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert "Fewer than about 100 give nothing to" in run.stdout
    assert "ends with status 7" in run.stdout


def test_a_wrong_command_line_still_gets_the_usage_on_stderr() -> None:
    run = subprocess.run(
        ["deploy/install.sh", "broker", "collector"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert run.returncode == 2
    assert run.stdout == ""
    assert run.stderr.startswith("Install one role of ldp-telemetry on this host")
