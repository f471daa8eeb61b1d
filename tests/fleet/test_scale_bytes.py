"""The scale mode's reports, byte for byte, for a fixed plan and seed (fleet/scale.py).

A run is reproducible (the README's "Randomness is seeded"): the same plan gives the same
reports. These digests pin every report of a small seeded plan (its device, use case, period,
value, topic, report id and encoded bytes, in the order they are made) and every MQTT PUBLISH
packet the scale mode's publisher writes for them, so a change to how the reports are built or
framed cannot change what goes on the wire. A change that is meant to alter the reports must
say why and renew the digests.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter

import msgpack

from agent.config import BrokerConfig
from fleet.plan import FleetPlan
from fleet.scale import ScaleFleet, periods
from fleet.scale_publisher import ReceiptPublisher
from tests.fleet.support import FLEET_REGISTRY, every_use_case_plan

REPORTS_DIGEST = "be4512cbd36613314419d68cadd01229a821039d2ff154c0d7fedafc2c9165fd"
PACKETS_DIGEST = "e0e7a24ac0c8b2f02949de3b68010637147e40c68d7e7c03249f57c679b3eb2c"


def _plan(*, devices: int = 60, days: int = 2, text: bytes | None = None) -> FleetPlan:
    # The digests were pinned before the registry gained its `-olh` pairs; the plan leaves them
    # out, so the digests also show that adding use cases changed no other use case's bytes.
    plan = every_use_case_plan(devices=devices, days=days, seed=7, text=text)
    kept = tuple(n for n in plan.use_cases if not n.endswith("-olh"))
    return dataclasses.replace(plan, use_cases=kept, generators={n: plan.generators[n] for n in kept})


def _digest_reports(fleet: ScaleFleet) -> tuple[str, int]:
    h = hashlib.sha256()
    n = 0
    for slot, batch in periods(fleet):
        for r in batch:
            h.update(repr((slot, r.device, r.use_case.name, r.period, r.value, r.topic)).encode())
            h.update(r.report_id)
            h.update(len(r.payload).to_bytes(4, "big") + r.payload)
            n += 1
    return h.hexdigest(), n


def test_reports_are_byte_for_byte_those_of_the_plan_and_seed() -> None:
    fleet = ScaleFleet(_plan(), "fleet-sim")
    digest, n = _digest_reports(fleet)
    assert n == 60 * 2 * 12  # 6h use cases 4 a day, daily ones 1: the registry's 12 reports per device and day
    assert digest == REPORTS_DIGEST
    assert fleet.result.refused == {}
    assert fleet.result.unsent == {}


def test_held_back_reports_leave_the_others_unchanged() -> None:
    # A daily limit of 2 on the first 6-hour use case: two of its four periods a day are held back.
    text = FLEET_REGISTRY.read_bytes().replace(b'period = "6h"\ndaily_limit = 4', b'period = "6h"\ndaily_limit = 2', 1)
    assert text != FLEET_REGISTRY.read_bytes()
    fleet = ScaleFleet(_plan(devices=20, days=1, text=text), "fleet-sim")
    kept = [r for _, batch in periods(fleet) for r in batch]
    assert fleet.result.unsent == {"app-usage-seconds": 40}
    assert Counter(r.use_case.name for r in kept)["app-usage-seconds"] == 40


def test_every_report_decodes_to_its_envelope() -> None:
    fleet = ScaleFleet(_plan(devices=10, days=1), "fleet-sim")
    for _, batch in periods(fleet):
        for r in batch:
            env = msgpack.unpackb(r.payload)
            assert list(env) == ["v", "u", "h", "p", "i", "r"]
            assert (env["u"], env["h"], env["p"], env["i"]) == (
                r.use_case.name,
                r.use_case.definition,
                r.period,
                r.report_id,
            )
            assert len(env["r"]) == 1
            assert r.topic == f"ldp/v1/reports/fleet-sim/{r.device:07d}/{r.use_case.name}"


def test_anonymous_reports_go_to_the_use_case_topic() -> None:
    fleet = ScaleFleet(_plan(devices=3, days=1), None)
    topics = {r.topic for _, batch in periods(fleet) for r in batch}
    assert topics == {f"ldp/v1/reports/{name}" for name in fleet.plan.use_cases}


def test_publish_packets_are_byte_for_byte_those_of_the_plan_and_seed() -> None:
    fleet = ScaleFleet(_plan(devices=20, days=1), "fleet-sim")
    reports = [r for _, batch in periods(fleet) for r in batch]
    broker = BrokerConfig(host="127.0.0.1", port=1883, tls=False)
    h = hashlib.sha256()
    for receipts in (True, False):
        publisher = ReceiptPublisher(
            broker,
            client_id="fleet-pin",
            identity="fleet-sim",
            window=100,
            on_receipts=(lambda _r: None) if receipts else None,
        )
        for i, r in enumerate(reports):
            h.update(publisher._encode(r, 1 + i % 65_534))
    assert h.hexdigest() == PACKETS_DIGEST
