"""End to end: hundreds of agents through Mosquitto with the deploy TLS config and ACL to a real collector."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from fleet.cli import main
from runtime.exit_status import ExitStatus
from tests.fleet.support import running_stack

pytestmark = pytest.mark.slow

REGISTRY = Path(__file__).resolve().parents[2] / "deploy" / "fleet.usecases.toml"
SEEDS_USE_CASES = (
    "app-usage-seconds",
    "app-usage-histogram",
    "dark-mode-enabled",
    "emoji",
    "safari-energy-domains",
    "default-browser",
)
"""The registry's use cases of the three designs' mechanisms and RAPPOR: the TLS run leaves out the
frequency-oracle twins, which the demo runs with complete agents (tests/deploy/test_run_demo.py)."""


def test_fleet_through_tls_broker_and_acl_matches_the_truth(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """240 devices x 3 days through TLS + passwords + ACL, each under its own identity and allowance: every
    report is folded and every estimate is within 5 SE of the truth."""
    out = tmp_path / "results.json"
    with running_stack(tmp_path / "stack", tls=True) as stack:
        # Without the simulator's password the broker refuses the fleet (exit status 8, unavailable) ...
        anonymous = stack.fleet_args(password=False)
        refused = main(["--registry", str(REGISTRY), "--devices", "1", "--days", "1", "--quiet", *anonymous])
        assert refused == ExitStatus.UNAVAILABLE
        assert "not authori" in capsys.readouterr().err.lower()
        # ... and with it, every report arrives.
        status = main(
            [
                "--registry",
                str(REGISTRY),
                "--devices",
                "240",
                "--days",
                "3",
                "--seed",
                "20240301",
                "--quiet",
                "--ingest-timeout",
                "600",
                "--output",
                str(out),
                "--plots",
                str(tmp_path / "plots"),
                *(arg for name in SEEDS_USE_CASES for arg in ("--use-case", name)),
                *stack.fleet_args(),
            ]
        )
    printed = capsys.readouterr().out
    assert status == 0, printed
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["ok"] is True
    assert doc["config"]["devices"] == 240
    assert doc["timing"]["reports"] == 240 * (2 * 12 + 4 * 3)  # 6-hour use cases x 12 periods, daily x 3
    for name, uc in doc["use_cases"].items():
        compared = uc["comparison"]
        assert compared["compared"] > 0, name
        assert compared["max_abs_z"] <= 5.0, name
        for row in compared["periods"]:
            assert row["released"], (name, row)
            assert row["reports"] == row["truth_reports"] == 240, (name, row)
    assert "all" in printed
    assert "errors within 5 SE" in printed
    assert len(list((tmp_path / "plots").glob("*.svg"))) == len(doc["use_cases"])


def test_two_worker_processes_give_the_same_truth_as_one(tmp_path: Path) -> None:
    """Splitting the devices across worker processes changes neither the truth nor the verdict."""
    today = dt.datetime.now(dt.UTC).date()
    truths = []
    with running_stack(tmp_path / "stack", tls=False) as stack:
        for workers, days_back in ((1, 3), (2, 6)):
            out = tmp_path / f"w{workers}.json"
            status = main(
                [
                    "--registry",
                    str(REGISTRY),
                    "--use-case",
                    "emoji",
                    "--use-case",
                    "app-usage-seconds",
                    "--devices",
                    "60",
                    "--days",
                    "1",
                    "--start",
                    str(today - dt.timedelta(days=days_back)),
                    "--workers",
                    str(workers),
                    "--ingest-timeout",
                    "600",
                    "--quiet",
                    "--output",
                    str(out),
                    *stack.fleet_args(),
                ]
            )
            assert status == 0
            doc = json.loads(out.read_text(encoding="utf-8"))
            truths.append({name: list(uc["truth"].values()) for name, uc in doc["use_cases"].items()})
    assert truths[0] == truths[1]
