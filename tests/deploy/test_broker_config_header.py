"""The header of ``deploy/mosquitto/mosquitto.conf`` names the topics the ACL actually grants."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _header() -> str:
    lines = (ROOT / "deploy/mosquitto/mosquitto.conf").read_text(encoding="utf-8").splitlines()
    header = []
    for line in lines:
        if not line.startswith("#"):
            break
        header.append(line.lstrip("# "))
    return " ".join(header)


def test_the_header_names_the_report_and_receipt_topics_of_the_acl() -> None:
    header = _header()
    acl = (ROOT / "deploy/mosquitto/acl").read_text(encoding="utf-8")
    # The ACL's rules, and the header's words for them.
    assert "pattern write ldp/v1/reports/%u/+" in acl
    assert "ldp/v1/reports/<user name>/<use case>" in header
    assert "pattern read ldp/v1/receipts/%u/%c" in acl
    assert "ldp/v1/receipts/<user name>/<client id>" in header
    assert "ldp/v1/reports/<use_case>" not in header
