"""The README's first command, ``deploy/run-demo.sh``, end to end at a small size.

Once as the README runs it (one collector on a SQLite file) and once as "Outgrowing one
machine" shows a group on one machine (``--collectors 2 --postgres``): a broker, the
collectors and a simulated fleet, every estimate within 5 standard errors of the truth
(the script's exit status is ldp-fleet's, which says so), and the working files removed.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "options",
    [
        pytest.param([], id="one-collector-sqlite"),
        pytest.param(["--collectors", "2", "--postgres"], id="group-postgres"),
    ],
)
def test_the_demo_runs_and_every_estimate_is_within_5_se(tmp_path: Path, options: list[str]) -> None:
    out = tmp_path / "results"
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "TMPDIR": str(tmp_path)}
    run = subprocess.run(
        ["deploy/run-demo.sh", "--devices", "150", "--days", "1", "--no-wait", "--out", str(out), *options],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,  # a hang guard only
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "every error within 5 SE" in run.stdout
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert results
    if "--collectors" in options:
        assert "Every collector of the group serves the same estimates" in run.stdout
        assert "starting PostgreSQL" in run.stderr
    # Only the results stay: the broker's, collectors' and database's files are removed.
    leftovers = [p.name for p in tmp_path.glob("ldp-demo.*/*")]
    assert leftovers == [], leftovers


def test_the_demo_with_a_registry_change_counts_every_report_under_its_own_definition(tmp_path: Path) -> None:
    """`run-demo.sh --registry-change`: half the fleet moves mid-run; exit 0 means counted and within 5 SE."""
    out = tmp_path / "results"
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "TMPDIR": str(tmp_path)}
    run = subprocess.run(
        ["deploy/run-demo.sh", "--registry-change", "--devices", "100", "--days", "3", "--no-wait", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,  # a hang guard only
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "registry change: half the fleet moves to deploy/fleet.usecases.v2.toml on day 2" in run.stderr
    assert "ldp-fleet: receipts: " in run.stderr
    assert "safari-energy-domains: " in run.stderr
    assert "refused: retired" in run.stderr
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert results["receipts"]["missing"] == 0
    definitions = {info["definition"] for info in results["use_cases"].values()}
    assert len([d for d in definitions if d.startswith("emoji@")]) == 2
    assert any(d.startswith("crash-reported@") for d in definitions)
    assert "(current definition, cms" in run.stdout
    assert "(earlier definition, cms" in run.stdout


def test_the_demo_refuses_a_registry_change_shorter_than_three_days(tmp_path: Path) -> None:
    """Before, during and after the change take three days: fewer is a usage error that says so."""
    run = subprocess.run(
        ["deploy/run-demo.sh", "--registry-change", "--days", "2", "--no-wait"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 2
    assert "--registry-change needs --days 3 or more" in run.stderr
