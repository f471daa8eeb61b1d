"""End to end in scale mode: devices in bulk through Mosquitto's deploy TLS config and ACL to a real
collector, every report with its receipt, every estimate within 5 SE of the truth."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleet.cli import main
from fleet.scale import SCALE_LABEL
from tests.fleet.support import running_stack

pytestmark = pytest.mark.slow

REGISTRY = Path(__file__).resolve().parents[2] / "deploy" / "fleet.usecases.toml"


def test_scale_mode_through_tls_broker_and_acl_matches_the_truth(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """300 devices x 2 days in scale mode: labelled as such first and in the results, each device
    under its own identity and allowance, every report counted (receipts), every estimate within 5 SE."""
    out = tmp_path / "results.json"
    with running_stack(tmp_path / "stack", tls=True) as stack:
        status = main(
            [
                *("--registry", str(REGISTRY), "--devices", "300", "--days", "2", "--seed", "20240302"),
                *("--scale", "--ingest-timeout", "600", "--output", str(out)),
                *stack.fleet_args(),
            ]
        )
    captured = capsys.readouterr()
    assert status == 0, captured.out + captured.err
    assert captured.err.splitlines()[0] == f"ldp-fleet: {SCALE_LABEL}"
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["mode"] == SCALE_LABEL
    assert doc["ok"] is True
    reports = 300 * (2 * 8 + 6 * 2)  # 6-hour use cases x 8 periods, daily x 2
    assert doc["timing"]["reports"] == reports
    assert doc["receipts"]["counted"] == reports
    for name, uc in doc["use_cases"].items():
        compared = uc["comparison"]
        assert compared["compared"] > 0, name
        assert compared["max_abs_z"] <= 5.0, name
        for row in compared["periods"]:
            assert row["reports"] == row["truth_reports"] == 300, (name, row)
    assert "errors within 5 SE" in captured.out


def test_scale_mode_refuses_what_it_does_not_simulate(capsys: pytest.CaptureFixture[str]) -> None:
    """A registry change, state files and worker processes belong to complete agents only."""
    status = main(["--registry", str(REGISTRY), "--devices", "10", "--scale", "--workers", "2", "--no-tls"])
    assert status != 0
    assert "--scale" in capsys.readouterr().err
