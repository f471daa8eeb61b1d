"""Write the state directory of tests/compat/fixtures/ledger-v1/: a ledger of version 1.

Run with the code of the release before the ledger named brokers on ``sys.path`` first, from
a checkout of it (commit 4c821b8)::

    cd <checkout at 4c821b8> && PYTHONPATH=. python <this file> OUT_DIR

The state has consent, one report acknowledged without receipts ("sent"), one counted by its
receipt, one refused by the collector, one refused by the broker, and reports still waiting,
under the tests' key (tests/agent/conftest.py) with a fake clock, so it is the same each time.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import agent.state
from agent.core import Agent
from agent.sealed import Sealer
from protocol.randomness import SeededRandom
from protocol.receipts import Receipt
from protocol.registry import parse_registry
from tests.agent.conftest import KEY, REGISTRY, START
from tests.support.clocks import FakeClock

assert agent.state.LEDGER_VERSION == 1, "run this with the code of the release whose ledger is version 1"

out = Path(sys.argv[1])
registry = parse_registry(REGISTRY.encode("utf-8"), source="usecases.toml")
clock = FakeClock(START)
device = Agent(registry=registry, state_dir=out, sealer=Sealer(KEY), clock=clock, rng=SeededRandom(25))
device.grant_consent()
for name, value in {"flag": 1, "seconds": 600, "hist": 300.0, "procs": "bash", "words": "hello"}.items():
    device.record(name, value)
clock.set(START + 86_400)
device.collect()
waiting = device.outbox()
assert len(waiting) >= 5, len(waiting)
device.acknowledge(waiting[:1])
device.mark_sent(waiting[1:3])
device.mark_refused([(waiting[3], "not authorized")])
device.settle([Receipt(waiting[1].entry.report_id, True), Receipt(waiting[2].entry.report_id, False, "late")])
print(json.dumps({e.report_id.hex(): e.status for e in device.ledger()}))
