"""A full disk bends the agent, it does not end it (docs/state-integrity.md, "A full disk"): with every
write failing as on a full file system, record is refused with a clear message, status says recording
is paused, a cycle and the publisher's steps do not raise, nothing written before is lost, and the
agent resumes by itself at its next step once writes succeed."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from agent import sealed
from agent.core import Agent
from agent.errors import StateWriteError
from tests.support.clocks import FakeClock

DAY = 86_400.0


class Disk:
    """Makes every write into the state directory fail with ENOSPC while ``full``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.full = False
        self.refused = 0


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Disk:
    """The write layer under agent.sealed's atomic writes, failing as on a full file system (only for
    files of the state directory; every other write of the process goes through)."""
    d = Disk(tmp_path / "state")
    real = os.write

    def write(fd: int, data: bytes | memoryview) -> int:
        if d.full and os.readlink(f"/proc/self/fd/{fd}").startswith(str(d.directory)):
            d.refused += 1
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr("agent.sealed.os.write", write)
    return d


def test_a_full_disk_pauses_recording_and_the_agent_resumes_by_itself(
    disk: Disk, make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    agent = make_agent()
    agent.grant_consent()
    assert agent.record("flag", 1).outcome == "recorded"  # acknowledged before the disk fills
    assert agent.status().recording == "ok"

    disk.full = True
    with pytest.raises(StateWriteError, match="no space left on the device") as refused:
        agent.record("flag", 0)
    assert "Recording is paused and this value was not kept" in str(refused.value)
    assert "resumes by itself" in str(refused.value)
    status = agent.status()
    assert status.recording.startswith("paused since ")
    assert "no space left on the device" in status.recording
    assert [o.outcome for o in agent.record_many([("flag", 1, None), ("hist", 3.0, None)])] == ["paused", "paused"]
    clock.set(clock.time() + DAY)
    summary = agent.collect()  # does not raise: the period stays open
    assert summary.reports == 0
    assert agent.outbox() == []  # nothing is sent while a send could not be recorded
    agent.acknowledge([])
    assert agent.settle([]) == 0
    assert disk.refused > 0

    disk.full = False
    assert agent.status().recording == "ok"  # resumed without a restart
    summary = agent.collect()
    assert summary.reports == 1  # the value acknowledged before the disk filled was kept
    assert summary.records == 1
    assert len(agent.outbox()) == 1
    assert agent.record("flag", 1).outcome == "recorded"
    again = make_agent()
    assert all(r.state == "active" for r in again.use_case_status())
    assert again.outbox_size == 1


def test_an_agent_started_on_a_full_disk_that_must_write_first_waits(
    disk: Disk, make_agent: Callable[..., Agent], clock: FakeClock, tmp_path: Path
) -> None:
    """A start whose manifest must move forward (here: after a grant whose first load did not happen)
    cannot write it: nothing is recorded or sent, and the first step after space returns loads again."""
    agent = make_agent()
    agent.grant_consent()
    agent.record("flag", 1)
    (tmp_path / "state" / "manifest.sealed").unlink()
    for p in (tmp_path / "state").glob("uc-*.sealed"):
        p.unlink()
    (tmp_path / "state" / "ledger.sealed").unlink(missing_ok=True)
    consent = tmp_path / "state" / "consent.sealed"
    doc = dict(sealed.Sealer(bytes(range(32))).open("consent", 1, consent.read_bytes()))
    doc.pop("device")
    sealed.Sealer(bytes(range(32))).write(consent, "consent", 1, doc)  # a grant not yet bound
    disk.full = True
    paused = make_agent()  # does not raise
    assert paused.status().recording.startswith("paused since ")
    with pytest.raises(StateWriteError, match="Recording is paused"):
        paused.record("flag", 1)
    assert paused.outbox() == []
    disk.full = False
    assert paused.record("flag", 1).outcome == "recorded"
    assert paused.status().recording == "ok"
