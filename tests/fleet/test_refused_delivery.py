"""A fleet whose reports the broker's ACL drops, against a collector that already holds data.

The collector's per-period totals then look complete (other devices' reports fill them), so
only the fleet's own commit receipts can tell that none of its reports was counted: the run
must end with the delivery-failure status, say how many of its own reports were counted, and
compare nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.cli import main
from runtime.exit_status import ExitStatus
from tests.fleet.support import running_stack

pytestmark = pytest.mark.slow

REGISTRY = Path(__file__).resolve().parents[2] / "deploy" / "fleet.usecases.toml"
COMMON = ["--registry", str(REGISTRY), "--days", "1", "--seed", "7", "--quiet", "--start", "2026-11-01"]


def test_reports_the_acl_drops_end_as_undelivered_not_as_wrong_estimates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with running_stack(tmp_path / "stack", tls=True, users=("devices",)) as stack:
        # Other devices' reports first: the collector holds data for the same periods.
        first = main([*COMMON, "--devices", "40", "--ingest-timeout", "300", *stack.fleet_args()])
        # (Too few devices for every estimate to be released: its verdict is not the point.)
        assert first in (ExitStatus.OK, ExitStatus.NOT_RELEASED, ExitStatus.BEYOND_TOLERANCE), capsys.readouterr()
        capsys.readouterr()
        # The user "devices" may publish only ldp/v1/reports/devices/<use case>: the broker
        # acknowledges the fleet's deeper topics and drops them (deploy/mosquitto/acl).
        refused = stack.fleet_args(password=False)
        password = stack.directory / "secrets" / "devices.password"
        status = main(
            [
                *COMMON,
                "--devices",
                "5",
                "--ingest-timeout",
                "20",
                *refused,
                "--username",
                "devices",
                "--password-file",
                str(password),
            ]
        )
    out = capsys.readouterr()
    assert status == ExitStatus.UNAVAILABLE, out
    # 5 devices x 1 day: two 6-hour use cases x 4 periods and six daily ones, 14 reports each.
    assert "0 of the fleet's 70 reports counted" in out.err, out.err
    assert "70 refused by the broker: not authorized" in out.err, out.err
    assert "errors within" not in out.out
    assert "beyond the tolerance" not in out.out
