"""The scale mode publishes a period while it builds the next: a broker lost meanwhile still ends the
run with the connection's TransportError (``ldp-fleet`` exits 8 on it), not a hang or a task's traceback."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from agent.config import BrokerConfig
from agent.errors import TransportError
from fleet.scale import run_scale
from fleet.tally import Progress
from tests.fleet.support import every_use_case_plan
from tests.support.broker import Broker


def test_a_broker_lost_mid_run_ends_the_scale_mode_with_a_transport_error(mosquitto: Broker) -> None:
    plan = dataclasses.replace(
        every_use_case_plan(devices=200, days=3, seed=1),
        broker=BrokerConfig(host=mosquitto.host, port=mosquitto.port, tls=False),
        receipts=False,
    )
    slots: list[int] = []

    def progress(p: Progress) -> None:
        slots.append(p.slot)
        if len(slots) == 2:
            mosquitto.stop()

    with pytest.raises(TransportError, match=r"connection ended|closed"):
        asyncio.run(asyncio.wait_for(run_scale(plan, progress=progress), 120))
    assert len(slots) < plan.slots  # it stopped at the loss, not at the end
