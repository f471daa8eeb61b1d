"""Agent.record_each: several values recorded as record() would one by one, in one state write."""

from __future__ import annotations

from pathlib import Path

from agent.core import Agent
from agent.errors import UseCaseStoppedError, ValueRefusedError
from agent.recording import RecordOutcome
from agent.sealed import Sealer
from protocol.randomness import SeededRandom
from protocol.registry import Registry
from tests.agent.conftest import KEY
from tests.support.clocks import FakeClock

ITEMS: list[tuple[str, object, str | None]] = [
    ("flag", True, None),
    ("seconds", 1200, None),
    ("seconds", "not a number", None),
    ("hist", 25_000, None),  # beyond the last bucket: the outcome carries the clamp note
    ("nope", 1, None),
    ("procs", "chrome", None),
    ("words", "hello", None),
    ("seconds", 300, "other-app"),
]


def _agent(directory: Path, registry: Registry, clock: FakeClock) -> Agent:
    agent = Agent(registry=registry, state_dir=directory, sealer=Sealer(KEY), clock=clock, rng=SeededRandom(11))
    agent.grant_consent()
    return agent


def _one_by_one(agent: Agent) -> list[object]:
    out: list[object] = []
    for name, value, key in ITEMS:
        try:
            out.append(agent.record(name, value, key=key))
        except (ValueRefusedError, UseCaseStoppedError) as e:
            out.append(e)
    return out


def _same(a: object, b: object) -> bool:
    if isinstance(a, RecordOutcome) or isinstance(b, RecordOutcome):
        return a == b
    return type(a) is type(b) and str(a) == str(b)


def test_record_each_is_record_one_by_one_in_one_write(tmp_path: Path, registry: Registry, clock: FakeClock) -> None:
    """Same outcomes and errors, same random draws (the reports are the same bytes), and the
    manifest written once for the batch instead of once per value."""
    single = _agent(tmp_path / "single", registry, clock)
    batch = _agent(tmp_path / "batch", registry, clock)
    expected = _one_by_one(single)
    manifest_before = (tmp_path / "batch" / "manifest.sealed").read_bytes()
    got = batch.record_each(ITEMS)
    assert len(got) == len(expected)
    assert all(_same(a, b) for a, b in zip(expected, got, strict=True)), (expected, got)
    assert isinstance(got[2], ValueRefusedError)
    assert isinstance(got[4], ValueRefusedError)
    assert isinstance(got[3], RecordOutcome)
    assert got[3].note
    assert (tmp_path / "batch" / "manifest.sealed").read_bytes() != manifest_before
    clock.set(clock.time() + 2 * 86_400)
    single.collect()
    batch.collect()
    assert [p.entry.payload for p in single.outbox()] == [p.entry.payload for p in batch.outbox()]
    assert single.outbox()


def test_record_each_answers_a_stopped_use_case_with_its_error(
    tmp_path: Path, registry: Registry, clock: FakeClock
) -> None:
    """A use case that spent its lifetime ε cap answers UseCaseStoppedError; the others record."""
    agent = _agent(tmp_path / "state", registry, clock)
    for _ in range(10):  # flag: ε 1 per report, cap 10, one report a day
        agent.record("flag", True)
        clock.set(clock.time() + 86_400)
        agent.collect()
        agent.acknowledge(agent.outbox())
    try:
        agent.record("flag", True)
    except UseCaseStoppedError as e:
        stopped = str(e)
    results = agent.record_each([("flag", True, None), ("seconds", 60, None)])
    assert isinstance(results[0], UseCaseStoppedError)
    assert str(results[0]) == stopped
    assert isinstance(results[1], RecordOutcome)
    assert results[1].outcome == "recorded"
