"""The agent takes a new registry without losing its past (docs/privacy-accounting.md, "Registry changes")."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import msgpack
import pytest

from agent.core import Agent
from agent.errors import UseCaseStoppedError
from protocol.registry import Registry, parse_registry
from tests.agent.conftest import REGISTRY, read_sealed
from tests.support.clocks import FakeClock

DAY = 86_400.0


def _edit(text: str, use_case: str, old: str, new: str) -> str:
    """``text`` with ``old`` replaced by ``new`` inside the table of ``use_case`` only."""
    start = text.index(f"[use_cases.{use_case}]")
    nxt = re.search(r"^\[use_cases\.(?!" + re.escape(use_case) + r"[.\]])", text[start + 1 :], re.M)
    end = len(text) if nxt is None else start + 1 + nxt.start()
    table = text[start:end]
    assert old in table, (use_case, old)
    return text[:start] + table.replace(old, new, 1) + text[end:]


def _without(text: str, use_case: str) -> str:
    """``text`` without the tables of ``use_case``."""
    start = text.index(f"[use_cases.{use_case}]")
    nxt = re.search(r"^\[use_cases\.(?!" + re.escape(use_case) + r"[.\]])", text[start + 1 :], re.M)
    end = len(text) if nxt is None else start + 1 + nxt.start()
    return text[:start] + text[end:]


def _registry(text: str, source: str = "v2") -> Registry:
    return parse_registry(text, source=source)


def _files(state: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(state.glob("uc-*.sealed"))}


def _uc_doc(state: Path, name: str) -> dict[str, object]:
    doc = read_sealed(state / f"uc-{name}.sealed", f"usecase:{name}")
    assert isinstance(doc, dict)
    return doc


def _spent(agent: Agent) -> dict[str, float]:
    return {r.use_case: float(r.epsilon_total or 0.0) for r in agent.use_case_status()}


def _definitions(agent: Agent) -> list[tuple[str, bytes]]:
    """(use case, definition hash) of every report in the outbox."""
    out = []
    for p in agent.outbox():
        body = msgpack.unpackb(p.entry.payload, raw=False)
        assert body["v"] == 2
        out.append((str(body["u"]), bytes(body["h"])))
    return out


def test_unchanged_use_cases_keep_their_files_byte_for_byte(
    make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    """Adding one use case and changing another leaves every other use case's file untouched."""
    state = tmp_path / "state"
    agent = make_agent()
    agent.grant_consent()
    for name, value in (("flag", 1), ("seconds", 100), ("hist", 300.0), ("procs", "bash"), ("words", "w")):
        agent.record(name, value)
    clock.set(clock.time() + DAY)
    agent.collect()
    before = _files(state)
    text = _edit(REGISTRY, "words", "epsilon = 4", "epsilon = 3")
    text += '\n[use_cases.added]\nmechanism = "rr"\nepsilon = 1\nperiod = "1d"\ndaily_limit = 1\n'
    text += "lifetime_epsilon = 5\n[use_cases.added.collector]\nmin_reports = 1\n"
    again = make_agent(registry_override=_registry(text))
    after = _files(state)
    for name in ("uc-flag.sealed", "uc-seconds.sealed", "uc-hist.sealed", "uc-procs.sealed"):
        assert after[name] == before[name], name
    assert after["uc-words.sealed"] != before["uc-words.sealed"]
    assert "uc-added.sealed" not in after  # a new use case starts fresh, at its first record
    again.record("added", 1)
    assert _uc_doc(state, "added")["budget"] == {}


def test_a_changed_memoized_use_case_starts_a_new_memo_charged_against_the_same_cap(
    make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path, registry: Registry
) -> None:
    """New parameters under a drawn memo: a new memo, its longitudinal ε charged at once, ε never reset."""
    state = tmp_path / "state"
    agent = make_agent()
    agent.grant_consent()
    agent.record("procs", "bash")
    clock.set(clock.time() + DAY)
    agent.collect()
    old_doc = _uc_doc(state, "procs")
    old_memo = old_doc["permanent"]
    spent_before = _spent(agent)["procs"]
    assert spent_before > 0
    agent.record("procs", "zsh")  # an open period under the old definition
    v2 = _registry(_edit(REGISTRY, "procs", "f = 0.75", "f = 0.8"))
    again = make_agent(registry_override=v2)
    new_doc = _uc_doc(state, "procs")
    charge = v2["procs"].mechanism.privacy_figures()["epsilon_longitudinal"]
    assert new_doc["memo_generation"] == 1
    assert new_doc["permanent"] == {}  # the new memo is drawn at its first use, never the old one reused
    spent = _spent(again)["procs"]
    # The open period's record was staged under the old definition (and charged its old cost), and
    # a new memo's ε charged on top for each of the two values' B′ ("bash", "zsh"): nothing went down.
    assert spent == pytest.approx(spent_before + registry["procs"].cost + 2 * charge)
    assert _definitions(again).count(("procs", registry["procs"].definition)) == 2
    notices = again.notices()
    assert any("new memo" in n.text and n.use_case == "procs" for n in notices)
    again.record("procs", "bash")
    assert _uc_doc(state, "procs")["permanent"] != old_memo
    clock.set(clock.time() + DAY)
    again.collect()
    assert ("procs", v2["procs"].definition) in _definitions(again)
    # A restart under v2 changes nothing more: no further memo, no further charge.
    third = make_agent(registry_override=v2)
    assert _uc_doc(state, "procs")["memo_generation"] == 1
    assert _spent(third)["procs"] == pytest.approx(_spent(again)["procs"])


def test_a_new_memo_the_cap_cannot_pay_for_stops_the_use_case(
    make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    """A reconfiguration can never buy a second memo past the lifetime cap."""
    tight = _edit(REGISTRY, "seconds", "lifetime_epsilon = 100", "lifetime_epsilon = 1.5")
    agent = make_agent(registry_override=_registry(tight, "v1"))
    agent.grant_consent()
    agent.record("seconds", 10)
    clock.set(clock.time() + DAY)
    agent.collect()
    spent = _spent(agent)["seconds"]
    before = _uc_doc(tmp_path / "state", "seconds")
    v2 = _registry(_edit(tight, "seconds", "gamma = 0.2", "gamma = 0.1"))
    again = make_agent(registry_override=v2)
    with pytest.raises(UseCaseStoppedError, match=r"a new memo, charged ε .* would cost more"):
        again.record("seconds", 5)
    assert _uc_doc(tmp_path / "state", "seconds") == before  # nothing redrawn, nothing reset
    assert _spent(again)["seconds"] >= spent


def test_an_event_level_use_case_whose_epsilon_changes_reports_each_record_under_its_own_definition(
    make_agent: Callable[..., Agent], clock: FakeClock, registry: Registry
) -> None:
    """Records made before the change go out under the old definition at the old cost; later ones under the new."""
    agent = make_agent()
    agent.grant_consent()
    agent.record("words", "a")
    v2 = _registry(_edit(REGISTRY, "words", "epsilon = 4", "epsilon = 3"))
    again = make_agent(registry_override=v2)
    assert _definitions(again) == [("words", registry["words"].definition)]
    (p,) = again.outbox()
    assert p.entry.epsilon == pytest.approx(registry["words"].cost)
    again.record("words", "b")
    clock.set(clock.time() + DAY)
    again.collect()
    assert _definitions(again) == [("words", registry["words"].definition), ("words", v2["words"].definition)]
    assert _spent(again)["words"] == pytest.approx(registry["words"].cost + v2["words"].cost)


def test_a_removed_use_case_is_wiped_and_comes_back_with_its_epsilon_spent(
    make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    """Removed: the file is gone, the ledger says so, the manifest keeps ε spent; added back, it goes on from it."""
    state = tmp_path / "state"
    agent = make_agent()
    agent.grant_consent()
    agent.record("procs", "bash")
    clock.set(clock.time() + DAY)
    agent.collect()
    spent = _spent(agent)["procs"]
    without = make_agent(registry_override=_registry(_without(REGISTRY, "procs")))
    assert not (state / "uc-procs.sealed").exists()
    manifest = read_sealed(state / "manifest.sealed", "manifest")
    assert manifest["entries"]["procs"]["removed"] is True
    assert manifest["entries"]["procs"]["epsilon_total"] == pytest.approx(spent)
    assert any(n.use_case == "procs" and n.text.startswith("removed from the registry") for n in without.notices())
    # A restart under the same registry does nothing more.
    make_agent(registry_override=_registry(_without(REGISTRY, "procs")))
    back = make_agent()
    charge = back.registry["procs"].mechanism.privacy_figures()["epsilon_longitudinal"]
    assert _spent(back)["procs"] == pytest.approx(spent + charge)
    back.record("procs", "bash")
    doc = _uc_doc(state, "procs")
    assert doc["memo_generation"] == 1
    assert not read_sealed(state / "manifest.sealed", "manifest")["entries"]["procs"].get("removed")


def test_a_wiped_file_found_again_is_never_read(
    make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    """A removed use case's file put back (or left by a crash before its unlink) is deleted, not adopted."""
    state = tmp_path / "state"
    agent = make_agent()
    agent.grant_consent()
    agent.record("procs", "bash")
    clock.set(clock.time() + DAY)
    agent.collect()
    saved = (state / "uc-procs.sealed").read_bytes()
    spent = _spent(agent)["procs"]
    make_agent(registry_override=_registry(_without(REGISTRY, "procs")))
    (state / "uc-procs.sealed").write_bytes(saved)
    back = make_agent()
    assert _spent(back)["procs"] >= spent
    back.record("procs", "bash")
    assert _uc_doc(state, "procs")["memo_generation"] == 1  # a new, charged memo; the old one not reused


def test_a_changed_period_discards_open_counters_and_keeps_closed_periods_closed(
    make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    """6h -> 1d: the open 6-hour totals (never charged) are dropped; no period already reported reopens."""
    agent = make_agent()
    agent.grant_consent()
    agent.record("hist", 100.0)
    clock.set(clock.time() + 6 * 3_600)
    agent.collect()  # the first 6-hour period is reported
    agent.record("hist", 200.0)  # an open 6-hour period
    v2 = _registry(_edit(REGISTRY, "hist", 'period = "6h"', 'period = "1d"'))
    again = make_agent(registry_override=v2)
    doc = _uc_doc(tmp_path / "state", "hist")
    assert doc["totals"] == {}
    assert doc["period"] == "1d"
    # The 6-hour periods reported so far lie inside today: today is not closed, yesterday is.
    assert doc["last_closed"] == int(clock.time() // DAY) - 1
    assert any("discarded" in n.text for n in (again.notices()))
