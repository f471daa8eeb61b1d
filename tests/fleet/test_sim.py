"""The fleet's devices: real agents on a simulated clock, exact truth, reproducible across worker splits."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent.errors import StateUnreadableError, TransportError
from agent.transport import Connection, MemoryTransport
from fleet import sim
from fleet.plan import FleetPlan
from fleet.sim import MemorySealer, run_shard
from fleet.tally import ShardResult
from fleet.values import parse_spec
from protocol.wire import decode_report
from tests.fleet.support import FLEET_REGISTRY, START, every_use_case_plan

ROOT = Path(__file__).resolve().parents[2]

LIMITED = """
format = 1
[use_cases.seconds]
mechanism = "one-bit-mean"
epsilon = 1
period = "6h"
daily_limit = 2
lifetime_epsilon = 100
parameters = { m = 1000 }
[use_cases.seconds.collector]
min_reports = 1
"""


def _plan(*, devices: int, days: int, text: bytes | None = None, path: Path = FLEET_REGISTRY) -> FleetPlan:
    plan = every_use_case_plan(devices=devices, days=days, seed=11, text=text, path=path)
    return dataclasses.replace(plan, connections=2, window=4)


def _run(plan: FleetPlan, devices: range, transport: object) -> ShardResult:
    return asyncio.run(run_shard(plan, devices, transport=transport))  # type: ignore[arg-type]


def test_truth_counts_exactly_the_reports_published() -> None:
    """Every acknowledged report decodes under the registry, and the truth counts one value per report."""
    plan = _plan(devices=30, days=2)
    transport = MemoryTransport()
    result = _run(plan, range(30), transport)
    registry = plan.registry()
    published: Counter[tuple[str, int]] = Counter()
    for message in transport.published:
        report = decode_report(message.payload, registry)
        assert message.topic == f"ldp/v1/reports/{report.use_case.name}"
        published[(report.use_case.name, report.period)] += 1
    assert result.messages == len(transport.published) == sum(published.values())
    for name, uc in registry.use_cases.items():
        first = uc.period.index_at(START)
        periods = {p for (n, p) in published if n == name}
        assert periods == set(range(first, first + 2 * 86_400 // uc.period.seconds))
        for period, tally in result.truth[uc.ref].items():
            assert tally.n == published[(name, period)] == 30
    assert result.unsent == {}
    assert result.refused == {}


def test_worker_split_changes_nothing() -> None:
    """Two shards produce byte-identical reports and the same truth as one shard of the same devices."""
    plan = _plan(devices=24, days=1)
    whole = MemoryTransport()
    one = _run(plan, range(24), whole)
    parts = [MemoryTransport(), MemoryTransport()]
    merged = _run(plan, range(10), parts[0]).merge(_run(plan, range(10, 24), parts[1]))
    assert sorted(m.payload for m in whole.published) == sorted(m.payload for p in parts for m in p.published)
    assert merged.truth == one.truth
    assert merged.published == one.published


def test_truth_leaves_out_what_the_daily_limit_kept_back() -> None:
    """With a daily limit of 2 and four periods a day, the truth holds only the reported periods' values."""
    plan = _plan(devices=10, days=2, text=LIMITED.encode(), path=Path("limited.toml"))
    transport = MemoryTransport()
    result = _run(plan, range(10), transport)
    # Per device: day 0's cycles close periods 0 and 1 (the 18:00 cycle finds the day's 2 spent),
    # day 1's close 3 and 4, the closing cycle on day 2 closes 7: 5 of 8 periods are reported.
    ref = plan.registry()["seconds"].ref
    reported = sum(t.n for t in result.truth[ref].values())
    assert reported == len(transport.published) == 10 * 5
    assert result.unsent["seconds"] == 10 * 3
    first = 1_700_006_400 // 21_600
    assert sorted(result.truth[ref]) == [first + i for i in (0, 1, 3, 4, 7)]


class FlakyTransport:
    """An in-memory broker whose first connection breaks after a few messages."""

    def __init__(self, break_after: int) -> None:
        self.inner = MemoryTransport()
        self.break_after = break_after
        self.opened = 0

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[Connection]:
        """Open a connection; the first one dies after ``break_after`` publishes."""
        self.opened += 1
        async with self.inner.connect() as conn:
            yield _Breaking(conn, self.break_after if self.opened == 1 else None)


class _Breaking:
    def __init__(self, conn: Connection, budget: int | None) -> None:
        self._conn = conn
        self._budget = budget

    async def publish(self, topic: str, payload: bytes) -> None:
        if self._budget is not None:
            if self._budget <= 0:
                raise TransportError("connection lost")
            self._budget -= 1
        await self._conn.publish(topic, payload)


def test_a_broken_pooled_connection_is_reopened_and_nothing_is_lost() -> None:
    """A dead pooled connection is replaced; every report still arrives exactly once."""
    plan = _plan(devices=12, days=1)
    reference = _run(plan, range(12), MemoryTransport())
    flaky = FlakyTransport(break_after=5)
    result = _run(plan, range(12), flaky)
    assert result.retries >= 1
    assert flaky.opened > plan.connections
    ids = [decode_report(m.payload, plan.registry()).report_id for m in flaky.inner.published]
    assert len(ids) == len(set(ids)) == reference.messages
    assert result.truth == reference.truth


def test_memory_sealer_seals_and_authenticates() -> None:
    """In-memory state is AES-GCM sealed: no plaintext in the blob, and a flipped byte is refused."""
    sealer = MemorySealer(bytes(range(32)))
    path = Path("/nowhere/uc-x.sealed")
    sealer.write(path, "usecase:x", 1, {"secret": "raw-value-12345"})
    blob = sealer._blobs[path]
    assert b"raw-value-12345" not in blob
    assert sealer.read(path, "usecase:x", 1) == {"secret": "raw-value-12345"}
    assert sealer.read(Path("/nowhere/missing"), "usecase:x", 1) is None
    sealer._blobs[path] = blob[:-1] + bytes([blob[-1] ^ 1])
    with pytest.raises(StateUnreadableError):
        sealer.read(path, "usecase:x", 1)


def test_state_on_disk_when_asked(tmp_path: Path) -> None:
    """With a state directory each device's sealed files are written there."""
    plan = _plan(devices=3, days=1)
    plan = FleetPlan(**{**plan.__dict__, "state_dir": str(tmp_path), "use_cases": ("dark-mode-enabled",)})
    _run(plan, range(3), MemoryTransport())
    files = sorted(p.name for p in (tmp_path / "device-0000001").iterdir())
    assert "uc-dark-mode-enabled.sealed" in files
    assert "ledger.sealed" in files


def test_generators_in_the_plan_are_used() -> None:
    """A constant generator makes every reported value that constant."""
    plan = _plan(devices=5, days=1)
    plan = FleetPlan(
        **{
            **plan.__dict__,
            "use_cases": ("app-usage-seconds",),
            "generators": {"app-usage-seconds": parse_spec("constant:value=1234")},
        }
    )
    result = _run(plan, range(5), MemoryTransport())
    for tally in result.truth[plan.registry()["app-usage-seconds"].ref].values():
        assert tally.total == 5 * 1234


def test_the_deployment_registry_runs_too() -> None:
    """Every use case of deploy/usecases.example.toml (SFP and Bloom-filter RAPPOR included) gets values and reports."""
    path = ROOT / "deploy" / "usecases.example.toml"
    plan = _plan(devices=4, days=1, path=path)
    transport = MemoryTransport()
    result = _run(plan, range(4), transport)
    registry = plan.registry()
    seen = {decode_report(m.payload, registry).use_case.name for m in transport.published}
    assert seen == set(registry.use_cases)
    assert set(result.truth) == {uc.ref for uc in registry.use_cases.values()}
    assert result.unsent == {}


class _AuditedAgent:
    """An agent stand-in whose ledger and status say what a test needs."""

    def __init__(self, spent: list[float], shown: float) -> None:
        self._spent = spent
        self._shown = shown

    def ledger(self) -> list[SimpleNamespace]:
        return [SimpleNamespace(use_case="flag", epsilon_total=e) for e in self._spent]

    def use_case_status(self) -> list[SimpleNamespace]:
        return [SimpleNamespace(use_case="flag", epsilon_total=self._shown)]


def test_the_epsilon_audit_finds_epsilon_that_goes_down_or_past_the_cap() -> None:
    """The fleet's end-of-run audit names a ledger whose ε goes down, passes the cap, or a status below it."""
    good = SimpleNamespace(number=1, agent=_AuditedAgent([1.0, 2.0, 3.0], 3.0))
    assert sim._audit_epsilon(good, {"flag": 10.0}) == (1, [])  # type: ignore[arg-type]
    down = SimpleNamespace(number=2, agent=_AuditedAgent([1.0, 3.0, 2.0], 3.0))
    assert "goes down" in sim._audit_epsilon(down, {"flag": 10.0})[1][0]  # type: ignore[arg-type]
    over = SimpleNamespace(number=3, agent=_AuditedAgent([5.0, 11.0], 11.0))
    assert "passes the lifetime cap 10" in sim._audit_epsilon(over, {"flag": 10.0})[1][0]  # type: ignore[arg-type]
    behind = SimpleNamespace(number=4, agent=_AuditedAgent([1.0, 2.0], 0.0))
    assert "less than its ledger's 2" in sim._audit_epsilon(behind, {"flag": 10.0})[1][0]  # type: ignore[arg-type]
