"""One charge per memo drawn anew (docs/privacy-accounting.md, "Registry changes").

A counter use case keeps one memo per counter key (1BitMean's α and memo bits, dBitFlipPM's
buckets and ``f_d``) and RAPPOR one per distinct value: a registry change that starts them anew,
a use case removed and added back, and a re-enrolment each charge the mechanism's longitudinal ε
once per memo, against the same lifetime cap, and a use case whose cap cannot pay them all stops.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.core import Agent
from agent.errors import UseCaseStoppedError
from agent.sealed import Sealer
from protocol.registry import Registry, UseCase
from tests.agent.conftest import KEY, REGISTRY, read_sealed
from tests.agent.test_cli import _cli, _setup
from tests.agent.test_registry_change import _edit, _registry, _spent, _uc_doc, _without
from tests.support.clocks import FakeClock

DAY = 86_400.0

# Three apps, each its own counter key and so its own memo; the histogram's values fall in three
# different buckets of its 32 (width 675): 0, 7 and 29.
SECONDS = {"mail": 600, "browser": 12_000, "editor": 30}
HIST = {"mail": 100.0, "browser": 5_000.0, "editor": 20_000.0}

# New parameters under the drawn memos: 1BitMean's output perturbation, dBitFlipPM's d.
V2 = _edit(_edit(REGISTRY, "seconds", "gamma = 0.2", "gamma = 0.1"), "hist", "d = 4", "d = 2")


def _charge(use_case: UseCase) -> float:
    return float(use_case.mechanism.privacy_figures()["epsilon_longitudinal"])


def _use(agent: Agent, clock: FakeClock) -> None:
    """Record every app's value in both use cases, close the day and deliver its reports."""
    for key, seconds in SECONDS.items():
        agent.record("seconds", seconds, key=key)
        agent.record("hist", HIST[key], key=key)
    clock.set(clock.time() + DAY)
    agent.collect()
    agent.acknowledge(agent.outbox())


def _used(make_agent: Callable[..., Agent], clock: FakeClock, registry: Registry | None = None) -> Agent:
    agent = make_agent(registry_override=registry)
    agent.grant_consent()
    _use(agent, clock)
    return agent


def _memos(state: Path, name: str) -> dict[bytes, object]:
    """The permanent states of ``name``'s file, by keyed hash of the counter key."""
    permanent = _uc_doc(state, name)["permanent"]
    assert isinstance(permanent, dict)
    return permanent


def _notice(agent: Agent, use_case: str) -> str:
    """The latest notice of the ledger about ``use_case``."""
    return [n.text for n in agent.notices() if n.use_case == use_case][-1]


def test_a_change_charges_each_redrawn_memo_of_a_multi_key_one_bit_mean_and_dbitflippm(
    make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    """Three keys' memos started anew cost three longitudinal ε, once, and the ledger says so."""
    state = tmp_path / "state"
    before = _spent(_used(make_agent, clock))
    memos_before = {n: _memos(state, n) for n in ("seconds", "hist")}
    assert {n: len(m) for n, m in memos_before.items()} == {"seconds": 3, "hist": 3}
    v2 = _registry(V2)
    again = make_agent(registry_override=v2)
    after = _spent(again)
    for name, what in (("seconds", "1BitMean's memo ε"), ("hist", "dBitFlipPM's ε")):
        charge = _charge(v2[name])
        assert charge > 0, what
        assert after[name] == pytest.approx(before[name] + 3 * charge, rel=1e-12, abs=0), name
        doc = _uc_doc(state, name)
        assert doc["memo_generation"] == 1
        assert doc["permanent"] == {}  # drawn anew at each key's next use, never the old ones reused
        text = _notice(again, name)
        assert "under 3 drawn memos (one per counter key)" in text, text
        assert f"3 new memos, each charged ε {charge:.4g} (ε {3 * charge:.4g} in all)" in text, text
    # docs/privacy-accounting.md's figures: a memo ε of 1.0 per key (ε = 1), so three keys cost 3,
    # not 1; dBitFlipPM at d = 2 costs its report's ε, 1.0, per key too.
    assert _charge(v2["seconds"]) == pytest.approx(1.0, abs=1e-12)
    assert _charge(v2["hist"]) == pytest.approx(1.0, abs=1e-12)

    # Each key draws its new memo at its next use; only the records are charged from then on.
    _use(again, clock)
    for name in ("seconds", "hist"):
        memos = _memos(state, name)
        assert memos.keys() == memos_before[name].keys()  # the same three keys, each with a new memo
        assert all(memos[k] != memos_before[name][k] for k in memos)
    spent = _spent(again)
    assert spent["seconds"] == pytest.approx(after["seconds"] + 3 * v2["seconds"].cost)
    assert spent["hist"] == pytest.approx(after["hist"] + 3 * v2["hist"].cost)
    # A restart under the same registry charges nothing more.
    assert _spent(make_agent(registry_override=v2)) == pytest.approx(spent)


def test_open_totals_of_a_changed_counter_are_reported_from_a_memo_drawn_at_the_close(
    make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    """A key whose total is open at the change and recorded no more is answered from a new memo, not lost."""
    agent = _used(make_agent, clock)
    agent.record("seconds", 900, key="mail")  # open under the old definition
    v2 = _registry(V2)
    again = make_agent(registry_override=v2)
    spent = _spent(again)["seconds"]
    clock.set(clock.time() + DAY)
    again.collect()
    assert _spent(again)["seconds"] == pytest.approx(spent + v2["seconds"].cost)  # the memo was paid at the change
    assert len(_memos(tmp_path / "state", "seconds")) == 1


def test_a_change_whose_memo_charges_would_pass_the_cap_stops_the_use_case(
    make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    """A cap that pays for one new memo but not three stops the use case: nothing redrawn, nothing overspent."""
    state = tmp_path / "state"
    v1 = _registry(REGISTRY, "v1")
    spent = _spent(_used(make_agent, clock, v1))
    # Caps that leave between one and two memos' ε after the day's reports.
    caps = {name: spent[name] + 1.5 * _charge(_registry(V2)[name]) for name in ("seconds", "hist")}
    tight_v1 = REGISTRY
    for name, cap in caps.items():
        tight_v1 = _edit(tight_v1, name, "lifetime_epsilon = 100", f"lifetime_epsilon = {cap!r}")
    make_agent(registry_override=_registry(tight_v1, "v1 tightened"))  # the same mechanisms: no memo redrawn
    files = {name: (state / f"uc-{name}.sealed").read_bytes() for name in caps}
    tight_v2 = _edit(_edit(tight_v1, "seconds", "gamma = 0.2", "gamma = 0.1"), "hist", "d = 4", "d = 2")
    again = make_agent(registry_override=_registry(tight_v2, "v2 tightened"))
    after = _spent(again)
    for name, cap in caps.items():
        with pytest.raises(UseCaseStoppedError, match=r"under 3 memos: 3 new memos, each charged ε .* would cost more"):
            again.record(name, 1, key="mail")
        assert (state / f"uc-{name}.sealed").read_bytes() == files[name]  # the old memos untouched
        assert spent[name] <= after[name] <= cap
    assert read_sealed(state / "uc-seconds.sealed", "usecase:seconds").get("memo_generation", 0) == 0


def test_a_use_case_removed_and_added_back_pays_for_each_memo_it_had_drawn(
    make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    """The manifest keeps the wiped state's count of memos; added back, each is charged once."""
    state = tmp_path / "state"
    agent = _used(make_agent, clock)
    spent = _spent(agent)["seconds"]
    make_agent(registry_override=_registry(_without(REGISTRY, "seconds")))
    entry = read_sealed(state / "manifest.sealed", "manifest")["entries"]["seconds"]
    assert (entry["removed"], entry["memo"], entry["memos"]) == (True, True, 3)
    back = make_agent()
    charge = _charge(back.registry["seconds"])
    assert _spent(back)["seconds"] == pytest.approx(spent + 3 * charge)
    text = _notice(back, "seconds")
    assert "its old state had drawn 3 memos (one per counter key)" in text, text
    assert f"3 new memos, each charged ε {charge:.4g}" in text, text


def test_a_removed_use_case_whose_manifest_kept_no_count_is_charged_one_memo(
    make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    """A tombstone written before the count was kept (only ``memo``) still reads, and costs one memo."""
    state = tmp_path / "state"
    agent = _used(make_agent, clock)
    spent = _spent(agent)["seconds"]
    make_agent(registry_override=_registry(_without(REGISTRY, "seconds")))
    manifest = read_sealed(state / "manifest.sealed", "manifest")
    del manifest["entries"]["seconds"]["memos"]
    Sealer(KEY).write(state / "manifest.sealed", "manifest", 1, manifest)
    back = make_agent()
    # All such a manifest shows is that a memo was drawn (docs/privacy-accounting.md says so).
    assert _spent(back)["seconds"] == pytest.approx(spent + _charge(back.registry["seconds"]))


def test_re_enrolment_charges_a_new_memo_for_each_memo_the_files_show(
    make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    """With the file deleted, the ledger's report of three records shows three memos: three are charged."""
    state = tmp_path / "state"
    spent = _spent(_used(make_agent, clock))
    (state / "uc-seconds.sealed").unlink()
    agent = make_agent()
    (carried,) = agent.re_enrol()
    assert carried.epsilon_total == pytest.approx(spent["seconds"])
    assert _spent(agent)["seconds"] == pytest.approx(spent["seconds"] + 3 * _charge(agent.registry["seconds"]))
    texts = [n.text for n in agent.notices() if n.use_case == "seconds"]
    assert "for each memo the files show it had drawn (3, at least one)" in texts[-2]
    assert "3 new memos, each charged ε" in texts[-1]


def test_ldp_agent_ledger_says_what_each_change_charged_and_why(
    make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    """`ldp-agent ledger` lists the change with the number of memos, the charge of each and the sum."""
    _used(make_agent, clock)
    cfg = _setup(tmp_path, registry=V2)
    done: subprocess.CompletedProcess[str] = _cli(cfg, "ledger", "--use-case", "seconds")
    assert done.returncode == 0, done.stderr
    (line,) = [ln for ln in done.stdout.splitlines() if "registry change:" in ln]
    charge = _charge(_registry(V2)["seconds"])
    assert "seconds  registry change: the registry changed this use case from seconds@" in line
    assert "parameters changed under 3 drawn memos (one per counter key)" in line
    assert f"3 new memos, each charged ε {charge:.4g} (ε {3 * charge:.4g} in all) at once" in line
