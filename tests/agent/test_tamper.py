"""Tamper-evident state (docs/design.md, invariant 2): a deleted, rolled-back or foreign use-case file stops
that use case with a message naming the file, permanent randomness is never redrawn, ε spent
never goes down, the other use cases go on, and a kill between the two writes of a step is
recovered exactly once."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent.core import Agent
from agent.errors import UseCaseStoppedError
from agent.sealed import Sealer
from agent.status import UseCaseStatus
from protocol.randomness import SeededRandom
from protocol.registry import Registry
from tests.agent.conftest import KEY, read_sealed
from tests.support.clocks import FakeClock

DAY = 86_400.0
MEMOIZED = ("seconds", "hist", "procs")


def _use(agent: Agent, clock: FakeClock, days: int = 1) -> None:
    """Record into every use case and collect, ``days`` times (ε is charged each time)."""
    for _ in range(days):
        agent.record("seconds", 10, key="a")
        agent.record("hist", 10.5)
        agent.record("procs", "bash")
        agent.record("flag", 1)
        agent.record("words", "hello")
        clock.set(clock.time() + DAY)
        agent.collect()


def _rows(agent: Agent) -> dict[str, UseCaseStatus]:
    return {r.use_case: r for r in agent.use_case_status()}


def _spent(row: UseCaseStatus) -> float:
    """The ε spent a status row shows (every row of a consenting agent shows one here)."""
    assert row.epsilon_total is not None
    return row.epsilon_total


def _permanent(state: Path, name: str) -> Any:
    return read_sealed(state / f"uc-{name}.sealed", f"usecase:{name}")["permanent"]


def _assert_stopped_only(agent: Agent, name: str, path: Path, reason: str) -> None:
    """``name`` is stopped naming ``path``; every other use case still records and reports."""
    rows = _rows(agent)
    assert rows[name].state.startswith("stopped:")
    assert str(path) in rows[name].state
    assert reason in rows[name].state
    value: object = {"seconds": 5, "hist": 3.0, "procs": "sshd", "flag": 0, "words": "x"}[name]
    with pytest.raises(UseCaseStoppedError, match=str(path)):
        agent.record(name, value)
    for other, row in rows.items():
        if other != name:
            assert row.state == "active", (other, row.state)
    assert agent.record("flag", 1).outcome == "recorded"


@pytest.mark.parametrize("name", MEMOIZED)
def test_deleted_file_stops_the_use_case_and_is_never_redrawn(
    name: str, make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    """Deleting one use case's sealed file stops it (naming the file); nothing recreates it, across restarts."""
    agent = make_agent()
    agent.grant_consent()
    _use(agent, clock, days=2)
    spent = _spent(_rows(agent)[name])
    assert spent > 0
    path = tmp_path / "state" / f"uc-{name}.sealed"
    path.unlink()
    again = make_agent(seed=99)
    _assert_stopped_only(again, name, path, "is missing")
    assert _spent(_rows(again)[name]) == pytest.approx(spent)  # ε spent is still shown, not reset
    clock.set(clock.time() + DAY)
    again.collect()
    assert not path.exists()  # no fresh memo was drawn and written
    assert all(p.use_case != name for p in again.outbox())
    third = make_agent(seed=100)
    assert str(path) in _rows(third)[name].state
    assert not path.exists()


@pytest.mark.parametrize("name", MEMOIZED)
def test_older_copy_stops_the_use_case(
    name: str, make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    """A validly sealed older copy of one file is refused as a rollback; ε spent never goes down."""
    agent = make_agent()
    agent.grant_consent()
    _use(agent, clock)
    path = tmp_path / "state" / f"uc-{name}.sealed"
    old = path.read_bytes()
    old_spent = _spent(_rows(agent)[name])
    _use(agent, clock, days=2)
    spent = _spent(_rows(agent)[name])
    assert spent > old_spent
    path.write_bytes(old)
    again = make_agent(seed=99)
    _assert_stopped_only(again, name, path, "older copy")
    assert _spent(_rows(again)[name]) == pytest.approx(spent)
    clock.set(clock.time() + DAY)
    again.collect()
    assert path.read_bytes() == old  # kept as found, for inspection; never rewritten
    path.write_bytes(Sealer(KEY).seal(f"usecase:{name}", 1, read_sealed_bytes(old, name)))
    assert str(path) in _rows(make_agent())[name].state  # re-sealed with a fresh nonce, it is still old


def read_sealed_bytes(blob: bytes, name: str) -> dict[str, Any]:
    """Open a sealed use-case blob with the tests' key."""
    doc: dict[str, Any] = Sealer(KEY).open(f"usecase:{name}", 1, blob)
    return doc


def _other_device(root: Path, registry: Registry, clock: FakeClock, key: bytes) -> Path:
    """Run a second device (own state directory) through the same use and return its state directory."""
    state = root / "other-device"
    other = Agent(registry=registry, state_dir=state, sealer=Sealer(key), clock=clock, rng=SeededRandom(1234))
    other.grant_consent()
    _use(other, clock, days=3)
    return state


@pytest.mark.parametrize("same_key", [True, False], ids=["same-key-other-identity", "other-key"])
@pytest.mark.parametrize("name", MEMOIZED)
def test_another_devices_copy_stops_the_use_case(
    name: str,
    same_key: bool,
    *,
    make_agent: Callable[..., Agent],
    registry: Registry,
    clock: FakeClock,
    tmp_path: Path,
) -> None:
    """Another device's file (sealed under another key, or under this key with another identity) is refused."""
    agent = make_agent()
    agent.grant_consent()
    _use(agent, clock)
    spent = _spent(_rows(agent)[name])
    other = _other_device(tmp_path, registry, clock, KEY if same_key else bytes(range(1, 33)))
    path = tmp_path / "state" / f"uc-{name}.sealed"
    shutil.copyfile(other / path.name, path)
    again = make_agent(seed=99)
    _assert_stopped_only(again, name, path, "another device" if same_key else "authentication failed")
    assert _spent(_rows(again)[name]) == pytest.approx(spent)


def test_deleted_manifest_stops_every_use_case(
    make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    """Without the manifest no file can be shown fresh: every use case stops, naming the manifest."""
    agent = make_agent()
    agent.grant_consent()
    _use(agent, clock)
    manifest = tmp_path / "state" / "manifest.sealed"
    manifest.unlink()
    again = make_agent()
    for row in _rows(again).values():
        assert row.state.startswith("stopped:")
        assert str(manifest) in row.state
    assert not manifest.exists()  # not silently recreated
    again.revoke_consent()
    again.grant_consent()  # the documented way to start over
    assert all(r.state == "active" for r in _rows(again).values())


def test_files_from_before_manifests_are_adopted(
    make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    """A state directory written before manifests existed is adopted once and then protected like any other."""
    agent = make_agent()
    agent.grant_consent()
    _use(agent, clock)
    state = tmp_path / "state"
    sealer = Sealer(KEY)
    for path in state.glob("uc-*.sealed"):
        name = path.name[3 : -len(".sealed")]
        doc = dict(read_sealed(path, f"usecase:{name}"))
        del doc["device"], doc["generation"]
        sealer.write(path, f"usecase:{name}", 1, doc)
    for purpose in ("consent", "ledger", "agent"):  # before manifests, these named no device either
        path = state / f"{purpose}.sealed"
        if path.exists():
            doc = dict(read_sealed(path, purpose))
            doc.pop("device", None)
            sealer.write(path, purpose, 1, doc)
    legacy = (state / "uc-procs.sealed").read_bytes()
    (state / "manifest.sealed").unlink()
    again = make_agent()
    assert all(r.state == "active" for r in _rows(again).values())
    _use(again, clock)
    (state / "uc-procs.sealed").write_bytes(legacy)
    assert "older copy" in _rows(make_agent())["procs"].state


def test_consistent_rollback_of_the_whole_directory_is_not_detected(
    make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    """The documented limit: restoring the whole directory (manifest included) is consistent and accepted."""
    agent = make_agent()
    agent.grant_consent()
    _use(agent, clock)
    state = tmp_path / "state"
    snapshot = tmp_path / "snapshot"
    shutil.copytree(state, snapshot)
    _use(agent, clock)
    shutil.rmtree(state)
    shutil.copytree(snapshot, state)
    assert all(r.state == "active" for r in _rows(make_agent()).values())


# ---------------------------------------------------------------------------- kills between the writes

_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    import agent.sealed
    from tests.support.clocks import FakeClock
    from agent.core import Agent
    from agent.sealed import Sealer
    from protocol.randomness import SeededRandom
    from protocol.registry import parse_registry
    from tests.agent.conftest import KEY, REGISTRY

    state, kill_at, now = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    real_replace = os.replace
    calls = 0

    def replace(src, dst):
        # Count the renames of this step; SIGKILL ourselves just before rename number kill_at,
        # so the step dies with some of its files renamed and the others not.
        global calls
        calls += 1
        if calls == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        real_replace(src, dst)

    agent.sealed.os.replace = replace
    a = Agent(registry=parse_registry(REGISTRY, source="t"), state_dir=state, sealer=Sealer(KEY),
              clock=FakeClock(now), rng=SeededRandom(kill_at))
    a.record("procs", "new-" + str(kill_at))
    a.record("seconds", 7, key="k" + str(kill_at))
    a.collect()
    print("done", calls)
    """
)


def test_kill_between_the_file_and_manifest_renames_is_recovered_once(
    make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    """SIGKILL before every rename of a recording step: each restart loads, memo tables only grow, ε never drops."""
    agent = make_agent()
    agent.grant_consent()
    _use(agent, clock)
    state = tmp_path / "state"
    root = Path(__file__).resolve().parents[2]
    killed = 0
    kill_at = 1
    while True:
        before = {n: _permanent(state, n) for n in MEMOIZED}
        spent = {n: _spent(r) for n, r in _rows(make_agent()).items()}
        generation = read_sealed(state / "manifest.sealed", "manifest")["entries"]
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, str(state), str(kill_at), str(clock.time() + kill_at * DAY)],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if proc.returncode == 0:
            assert proc.stdout.startswith("done")
            break
        assert proc.returncode == -9, proc.stderr
        killed += 1
        restarted = make_agent(seed=500 + kill_at)
        rows = _rows(restarted)
        assert all(r.state == "active" for r in rows.values()), rows
        for n in MEMOIZED:
            after = _permanent(state, n)
            for k, v in before[n].items():
                if n == "procs":
                    assert v["memo"].items() <= after[k]["memo"].items()
                else:
                    assert after[k] == v
            assert _spent(rows[n]) >= spent[n]
        entries = read_sealed(state / "manifest.sealed", "manifest")["entries"]
        for n, e in generation.items():
            assert entries[n]["generation"] >= e["generation"]
        kill_at += 1
    assert killed >= 4  # record(procs), record(seconds) and collect each rename a file and the manifest


def test_the_crash_window_is_accepted_only_once(
    make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    """After a file one generation ahead is accepted, the copy it replaced is an older copy."""
    agent = make_agent()
    agent.grant_consent()
    _use(agent, clock)
    state = tmp_path / "state"
    path = state / "uc-procs.sealed"
    manifest_before = (state / "manifest.sealed").read_bytes()
    previous = path.read_bytes()
    agent.record("procs", "zsh")
    # The crash: the file's rename landed, the manifest's did not.
    (state / "manifest.sealed").write_bytes(manifest_before)
    assert _rows(make_agent())["procs"].state == "active"
    path.write_bytes(previous)
    assert "older copy" in _rows(make_agent())["procs"].state
