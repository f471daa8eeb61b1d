"""The agent core: consent, privatization timing, limits, encrypted state, outbox and ledger."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from agent.accounting import EPSILON_SLACK, day_of
from agent.core import Agent
from agent.errors import ConsentRequiredError, UseCaseStoppedError, ValueRefusedError
from agent.recording import reservoir_offer
from agent.sealed import Sealer
from agent.state import PendingRecords
from protocol.randomness import SeededRandom
from protocol.registry import Registry
from protocol.wire import decode_report
from tests.agent.conftest import KEY, read_sealed
from tests.support.clocks import FakeClock

DAY = 86_400.0
SIX_HOURS = 21_600.0


def _sealed(state: Path) -> dict[str, Any]:
    """Every sealed file of a state directory, decrypted."""
    out: dict[str, Any] = {}
    for p in sorted(state.glob("*.sealed")):
        purpose = "usecase:" + p.name[3 : -len(".sealed")] if p.name.startswith("uc-") else p.name[: -len(".sealed")]
        out[p.name] = read_sealed(p, purpose)
    return out


def _walk(obj: object) -> list[object]:
    """Every scalar inside a plain structure (keys included)."""
    out: list[object] = []
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            stack.extend(x.keys())
            stack.extend(x.values())
        elif isinstance(x, list | tuple):
            stack.extend(x)
        else:
            out.append(x)
    return out


def test_nothing_is_recorded_or_collected_before_consent(make_agent: Callable[..., Agent], tmp_path: Path) -> None:
    """Before the opt-in, recording and collecting are refused and nothing is written."""
    agent = make_agent()
    with pytest.raises(ConsentRequiredError):
        agent.record("flag", 1)
    with pytest.raises(ConsentRequiredError):
        agent.collect()
    assert agent.outbox() == []
    assert list((tmp_path / "state").glob("*.sealed")) == []


def test_revoke_deletes_state_outbox_and_ledger(
    make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    """Revoking consent deletes every sealed file and the agent forgets everything."""
    agent = make_agent()
    agent.grant_consent()
    agent.record("flag", 1)
    agent.record("seconds", 10)
    clock.set(clock.time() + DAY)
    agent.collect()
    agent.acknowledge(agent.outbox()[:1])
    assert agent.outbox()
    assert agent.ledger()
    removed = agent.revoke_consent()
    assert removed >= 4
    assert list((tmp_path / "state").glob("*.sealed")) == []
    assert not agent.consented
    assert not make_agent().consented
    with pytest.raises(ConsentRequiredError):
        agent.record("flag", 1)


def test_counter_total_is_kept_only_until_its_period_closes(
    make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    """A counter's running total is in the sealed state while its period is open and gone after."""
    agent = make_agent()
    agent.grant_consent()
    agent.record("seconds", 1234, key="editor")
    agent.record("seconds", 4321, key="editor")
    doc = read_sealed(tmp_path / "state" / "uc-seconds.sealed", "usecase:seconds")
    (totals,) = doc["totals"].values()
    assert list(totals.values()) == [5555]
    assert all(isinstance(k, bytes) and len(k) == 32 for k in totals)  # keyed hash, not "editor"
    clock.set(clock.time() + SIX_HOURS)
    summary = agent.collect()
    assert summary.reports == 1
    doc = read_sealed(tmp_path / "state" / "uc-seconds.sealed", "usecase:seconds")
    assert doc["totals"] == {}
    assert 5555 not in _walk(doc)


def test_state_holds_no_string_or_event_value(
    make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    """Strings and events are privatized at once: no recorded value is anywhere in the decrypted files."""
    agent = make_agent()
    agent.grant_consent()
    secrets_ = ["secret-process-alpha", "secret-process-beta", "sekrit-word"]
    agent.record("procs", secrets_[0])
    agent.record("procs", secrets_[1])
    agent.record("words", secrets_[2])
    agent.record("seconds", 777, key="my-private-app")
    for phase in range(2):
        files = _sealed(tmp_path / "state")
        blob = b"".join(msgpack.packb(doc, use_bin_type=True) for doc in files.values())
        for s in [*secrets_, "my-private-app"]:
            assert s.encode() not in blob, (phase, s)
        if phase == 0:
            clock.set(clock.time() + DAY)
            agent.collect()
            agent.acknowledge(agent.outbox())


def test_outbox_and_ledger_hold_only_privatized_records(
    make_agent: Callable[..., Agent], clock: FakeClock, registry: Registry
) -> None:
    """Decrypted outbox payloads and ledger entries carry records of the mechanisms' output alphabet only."""
    agent = make_agent()
    agent.grant_consent()
    agent.record("seconds", 12_345, key="app")
    agent.record("hist", 12_345)
    agent.record("procs", "raw-string-value")
    agent.record("words", "raw-word")
    clock.set(clock.time() + DAY)
    agent.collect()
    pending = agent.outbox()
    for p in pending:
        body = msgpack.unpackb(p.entry.payload, raw=False)
        assert 12_345 not in _walk(body["r"])
        assert b"raw-string-value" not in p.entry.payload
        assert b"raw-word" not in p.entry.payload
        decode_report(p.entry.payload, registry)  # the collector would accept it
    agent.acknowledge(pending)
    for entry in agent.ledger():
        assert 12_345 not in _walk(entry.records)
        assert "raw-string-value" not in _walk(entry.records)


def test_reports_carry_no_identifier(
    tmp_path: Path, registry: Registry, clock: FakeClock, make_agent: Callable[..., Agent]
) -> None:
    """Two devices reporting the same thing send envelopes with the same fields, differing only in id and records."""
    agents = [
        make_agent(),
        Agent(registry=registry, state_dir=tmp_path / "other", sealer=Sealer(KEY), clock=clock, rng=SeededRandom(99)),
    ]
    for a in agents:
        a.grant_consent()
        a.record("seconds", 60, key="x")
    clock.set(clock.time() + SIX_HOURS)
    bodies = []
    for a in agents:
        a.collect()
        (p,) = a.outbox()
        assert p.topic == "ldp/v1/reports/seconds"  # nothing device-specific in the topic
        bodies.append(msgpack.unpackb(p.entry.payload, raw=False))
    for body in bodies:
        assert set(body) == {"v", "u", "h", "p", "i", "r"}
        assert body["p"] == registry["seconds"].period.index_at(clock.time()) - 1  # the coarse slot only
    same = {k for k in bodies[0] if bodies[0][k] == bodies[1][k]}
    assert {"v", "u", "h", "p"} <= same
    assert bodies[0]["i"] != bodies[1]["i"]


def test_reservoir_keeps_a_uniform_subset() -> None:
    """Algorithm R: each of n offered records ends in the reservoir of size c with probability c/n (within 5 SE)."""
    rng = SeededRandom(11)
    n, cap, trials = 10, 3, 20_000
    counts = np.zeros(n)
    for _ in range(trials):
        pending = PendingRecords()
        for i in range(n):
            reservoir_offer(pending, i, cap, rng)
        counts[np.array(pending.records)] += 1
    p = cap / n
    se = math.sqrt(p * (1 - p) / trials)
    assert np.all(np.abs(counts / trials - p) < 5 * se), counts / trials


def test_daily_limit_holds_per_day(make_agent: Callable[..., Agent], clock: FakeClock) -> None:
    """However many values are recorded, at most daily_limit records are charged and sent per day."""
    agent = make_agent()
    agent.grant_consent()
    for _day in range(4):
        for i in range(10):
            agent.record("flag", i % 2)
            for k in range(3):
                agent.record("seconds", 5, key=f"app{k}")
            clock.set(clock.time() + 3_000)
        clock.set(clock.time() + DAY - 30_000)
        agent.collect()
    per_day: dict[tuple[str, int], int] = {}
    for p in agent.outbox():
        per_day[(p.use_case, p.entry.day)] = per_day.get((p.use_case, p.entry.day), 0) + p.entry.records
    assert per_day
    for (name, _), n in per_day.items():
        assert n <= agent.registry[name].daily_limit


def test_clock_moved_backwards_does_not_reset_the_day(make_agent: Callable[..., Agent], clock: FakeClock) -> None:
    """Records charged on a day stay charged when the clock is set back; the limit holds for that day."""
    agent = make_agent()
    agent.grant_consent()
    t0 = clock.time() - clock.time() % DAY  # midnight of day D
    clock.set(t0 + 60)
    for k in range(10):
        agent.record("seconds", 5, key=f"app{k}")  # period 00-06 of day D
    clock.set(t0 + SIX_HOURS + 60)
    agent.collect()
    charged = sum(p.entry.records for p in agent.outbox())
    assert charged == 8  # the daily limit
    clock.set(t0 - 3_600)  # back to the previous day
    for k in range(10):
        agent.record("seconds", 5, key=f"app{k}")
    agent.collect()
    clock.set(t0 + 2 * SIX_HOURS + 60)  # day D again, the re-opened period has ended
    agent.collect()
    assert sum(p.entry.records for p in agent.outbox()) == 8
    (row,) = [r for r in agent.use_case_status() if r.use_case == "seconds"]
    assert row.records_today == 8
    assert row.unsent_records == 12
    assert {p.entry.period for p in agent.outbox()} == {int(t0 // SIX_HOURS)}


def test_lifetime_cap_is_never_exceeded_and_stops_the_use_case(
    make_agent: Callable[..., Agent], clock: FakeClock
) -> None:
    """The ε cap is charged before publishing; once spent the use case refuses values and says so."""
    agent = make_agent()
    agent.grant_consent()
    cap = agent.registry["flag"].lifetime_epsilon
    for _ in range(4):  # 3 records of ε ≈ 1 a day against a cap of 10
        for i in range(3):
            agent.record("flag", i % 2)
        clock.set(clock.time() + DAY)
        agent.collect()
    with pytest.raises(UseCaseStoppedError, match="lifetime ε cap"):
        agent.record("flag", 1)
    total = sum(p.entry.epsilon for p in agent.outbox())
    assert total <= cap + EPSILON_SLACK
    assert max(p.entry.epsilon_total for p in agent.outbox()) == pytest.approx(total)
    (row,) = [r for r in agent.use_case_status() if r.use_case == "flag"]
    assert row.state == "stopped: lifetime ε cap reached"


def test_permanent_state_survives_restarts_unchanged(
    make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    """Memo tables (1BitMean bits, dBitFlip f_d, RAPPOR B') are drawn once and never redrawn."""
    agent = make_agent(seed=1)
    agent.grant_consent()
    agent.record("seconds", 10, key="a")
    agent.record("hist", 10.5)
    agent.record("procs", "bash")
    path = tmp_path / "state"
    before = {
        n: read_sealed(path / f"uc-{n}.sealed", f"usecase:{n}")["permanent"] for n in ("seconds", "hist", "procs")
    }
    again = make_agent(seed=2)  # a restart with a different random source
    again.record("seconds", 20, key="a")
    again.record("hist", 99.0)
    again.record("procs", "bash")
    again.record("procs", "sshd")
    clock.set(clock.time() + DAY)
    again.collect()
    for n, perm in before.items():
        after = read_sealed(path / f"uc-{n}.sealed", f"usecase:{n}")["permanent"]
        for k, v in perm.items():
            if n == "procs":
                assert v["memo"].items() <= after[k]["memo"].items()
                assert (v["cohort"], v["key"]) == (after[k]["cohort"], after[k]["key"])
            else:
                assert after[k] == v


def test_unreadable_state_stops_that_use_case_and_is_kept(
    make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    """A flipped byte stops only the affected use case, with the reason, and the file is never rewritten."""
    agent = make_agent()
    agent.grant_consent()
    agent.record("seconds", 10)
    agent.record("flag", 1)
    path = tmp_path / "state" / "uc-seconds.sealed"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    again = make_agent()
    with pytest.raises(UseCaseStoppedError, match="unreadable"):
        again.record("seconds", 5)
    again.record("flag", 0)  # the others go on
    clock.set(clock.time() + DAY)
    again.collect()
    assert path.read_bytes() == bytes(data)
    rows = {r.use_case: r for r in again.use_case_status()}
    assert rows["seconds"].state.startswith("stopped: state unreadable: authentication failed")
    assert rows["flag"].state == "active"


def test_values_that_do_not_fit_are_refused_with_a_reason(make_agent: Callable[..., Agent]) -> None:
    """Wrong type, out-of-range and unknown use cases each get their own message."""
    agent = make_agent()
    agent.grant_consent()
    cases = [
        (("flag", 2), "rr"),
        (("seconds", -1), r"-1 is out of range \[0, 2\*\*53\]"),
        (("seconds", 2**60), r"out of range \[0, 2\*\*53\]"),
        (("seconds", 1.5), "integers"),
        (("hist", float("nan")), r"nan is out of range \[0, 2\*\*53\]"),
        (("procs", 3), "string"),
        (("words", 5), "hcms"),
        (("nope", 1), "unknown use case 'nope'"),
    ]
    for (name, value), message in cases:
        with pytest.raises(ValueRefusedError, match=message):
            agent.record(name, value)
    with pytest.raises(ValueRefusedError, match="counter key"):
        agent.record("flag", 1, key="k")
    # Beyond the mechanism's range (but within [0, 2**53]) a counter value is taken and its period's
    # total clamped, the same rule for 1BitMean and dBitFlip; the outcome says so.
    assert "clamped to 21600" in agent.record("seconds", 21_601).note
    assert "beyond the last bucket" in agent.record("hist", 99_999_999).note


def test_strings_are_reported_once_per_period(make_agent: Callable[..., Agent], clock: FakeClock) -> None:
    """The same string recorded twice in a period is one record (RAPPOR answers from its memo)."""
    agent = make_agent()
    agent.grant_consent()
    assert agent.record("procs", "bash").outcome == "recorded"
    assert agent.record("procs", "bash").outcome == "duplicate"
    assert agent.record("procs", "sshd").outcome == "recorded"
    clock.set(clock.time() + DAY)
    agent.collect()
    (p,) = agent.outbox()
    assert p.entry.records == 2


def test_ledger_shows_what_left_with_epsilon(make_agent: Callable[..., Agent], clock: FakeClock) -> None:
    """Acknowledged reports move from the outbox to the ledger with their records and ε, once per id."""
    agent = make_agent()
    agent.grant_consent()
    agent.record("flag", 1)
    agent.record("procs", "bash")
    clock.set(clock.time() + DAY)
    agent.collect()
    pending = agent.outbox()
    agent.acknowledge(pending)
    agent.acknowledge(pending)  # a duplicate acknowledgement changes nothing
    ledger = agent.ledger()
    assert agent.outbox() == []
    assert sorted(e.report_id for e in ledger) == sorted(p.entry.report_id for p in pending)
    for e, p in zip(sorted(ledger, key=lambda e: e.use_case), sorted(pending, key=lambda p: p.use_case), strict=True):
        assert e.records == msgpack.unpackb(p.entry.payload, raw=False)["r"]
        assert e.epsilon == pytest.approx(agent.registry[e.use_case].cost * len(e.records))
        assert e.epsilon_total >= e.epsilon


def test_ledger_is_pruned_after_its_retention(make_agent: Callable[..., Agent], clock: FakeClock) -> None:
    """Ledger entries older than the retention disappear at the next write."""
    agent = make_agent(ledger_retention_days=2)
    agent.grant_consent()
    agent.record("flag", 1)
    clock.set(clock.time() + DAY)
    agent.collect()
    agent.acknowledge(agent.outbox())
    assert len(agent.ledger()) == 1
    clock.set(clock.time() + 3 * DAY)
    agent.record("flag", 0)
    clock.set(clock.time() + DAY)
    agent.collect()
    agent.acknowledge(agent.outbox())
    assert len(agent.ledger()) == 1


def test_outbox_is_bounded(make_agent: Callable[..., Agent], clock: FakeClock) -> None:
    """Beyond outbox_max_reports the oldest unsent reports are dropped and counted."""
    agent = make_agent(outbox_max_reports=2)
    agent.grant_consent()
    for _ in range(3):
        agent.record("flag", 1)
        clock.set(clock.time() + DAY)
        agent.collect()
    assert len(agent.outbox()) == 2
    (row,) = [r for r in agent.use_case_status() if r.use_case == "flag"]
    assert row.dropped_reports == 1
    assert day_of(clock.time()) > 0
