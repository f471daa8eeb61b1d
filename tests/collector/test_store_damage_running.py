"""Damage that lands while the service runs, after its store and its live view have opened and
checked the file: the service goes on committing, the live view reads what was committed, and
every number it serves is exactly the undamaged store's, or the read (or the commit, or the
service's periodic full check) is refused naming the file. 24 seeded single-bit flips in each
table and index (a few hundred), each applied to the file under an open writer and an open reader.

The start and the read-only commands meet the same flips in ``test_store_integrity.py`` and
``test_store_damage_paths.py``; docs/deploy.md ("When the store is damaged") has the figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

from collector.config import parse_config
from collector.errors import StoreDamaged, StoreError
from collector.live import LiveAggregates
from collector.results import to_json
from collector.store import CheckpointStore
from protocol.registry import Registry
from protocol.wire import decode_report, encode_report
from runtime.exit_status import ExitStatus
from tests.collector.corruption import NOW, Flip, plan, prepare
from tests.collector.fake_broker import running_fake_broker
from tests.collector.processes import CollectorProcess, write_config
from tests.collector.support import current_period, privatized_reports
from tests.support.broker import free_port

USE_CASES = ("usage", "hist", "home")
GUARD_S = 120.0  # a hang guard for the service to stop, not a speed requirement


async def _reads(live: LiveAggregates) -> list[bytes]:
    reads = [to_json(await live.status())]
    for name in USE_CASES:
        _, result = await live.estimate(name)
        reads.append(to_json(result))
    return reads


def _commit_more(store: CheckpointStore, registry: Registry) -> None:
    """What the running service commits after the damage: fresh reports to every read use case."""
    for i, name in enumerate(USE_CASES):
        made = privatized_reports(registry, name, 12, period=current_period(registry, name, NOW), seed=9000 + i)
        store.commit([decode_report(encode_report(r), registry) for r in made], {"messages": len(made)})


def _flip(path: Path, flip: Flip) -> None:
    with path.open("r+b") as f:
        f.seek(flip.offset)
        byte = f.read(1)[0]
        f.seek(flip.offset)
        f.write(bytes([byte ^ (1 << flip.bit)]))


def _refused(outcome: str, exc: StoreError, copy: Path) -> str:
    """``outcome``, if the refusal names the file; a refusal that does not is a failure of its own."""
    return outcome if str(copy) in str(exc) else f"UNNAMED {type(exc).__name__}: {exc}"


async def _run_one(
    original: Path, copy: Path, registry: Registry, config_text: dict[str, object], flip: Flip | None
) -> tuple[str, list[bytes] | None, list[bytes]]:
    """One service run: open, read, (damage), commit, read, full check; what happened and what was read."""
    # A fresh directory: a run that stopped on damage may leave its WAL behind.
    shutil.rmtree(copy.parent, ignore_errors=True)
    copy.parent.mkdir()
    shutil.copyfile(original, copy)
    writer = CheckpointStore(copy, registry, instance="flips")  # the service's open, checked as at start
    live = LiveAggregates(parse_config(config_text), registry)
    try:
        before = await _reads(live)  # resident and checked before the damage
        if flip is not None:
            _flip(copy, flip)
        try:
            _commit_more(writer, registry)
        except StoreError as exc:
            return _refused("refused-on-commit", exc, copy), None, before
        try:
            after = await _reads(live)
        except StoreError as exc:
            return _refused("refused-on-read", exc, copy), None, before
        try:
            await live.check()
        except StoreDamaged as exc:
            return _refused("read-then-refused-by-check", exc, copy), after, before
        return "read", after, before
    finally:
        await asyncio.to_thread(live.close)
        writer.close()


def test_damage_under_a_running_service_is_never_read_as_a_number(
    tmp_path: Path, registry: Registry, registry_path: Path
) -> None:
    """Flips under an open writer and reader: each read is the undamaged one or refused, naming the file."""
    original, _ = prepare(tmp_path / "made", registry)
    copy = tmp_path / "work" / original.name
    config_text: dict[str, object] = {"registry": str(registry_path), "store": {"path": str(copy)}}

    outcome, expected, expected_before = asyncio.run(_run_one(original, copy, registry, config_text, None))
    assert outcome == "read"
    assert expected is not None

    flips = plan(original, 24, seed=20261127)
    assert len(flips) >= 300
    outcomes: Counter[str] = Counter()
    for flip in flips:
        try:
            outcome, after, before = asyncio.run(_run_one(original, copy, registry, config_text, flip))
        except Exception as exc:  # a traceback where a refusal naming the file was due
            raise AssertionError(f"{flip}: {type(exc).__name__}: {exc}") from exc
        assert before == expected_before, flip
        if after is not None:
            # A number that was served must be the undamaged one: a read that a later check
            # refuses was already served, so it must be right too.
            assert after == expected, (flip, outcome)
        assert not outcome.startswith("UNNAMED"), (flip, outcome)
        outcomes[outcome] += 1
    print(dict(outcomes))
    assert outcomes["refused-on-read"] + outcomes["refused-on-commit"] > 0


def _refused_flip(original: Path, registry: Registry, directory: Path) -> Flip:
    """A flip in a stored aggregate that the open's checks refuse (found on a copy)."""
    probe = directory / original.name
    for flip in plan(original, 36, seed=5):
        if flip.object != "aggregates":
            continue
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir()
        shutil.copyfile(original, probe)
        _flip(probe, flip)
        try:
            CheckpointStore(probe, registry, instance="probe", readonly=True).close()
        except StoreDamaged:
            return flip
    raise AssertionError("no flip in the aggregates is refused by the open's checks")


def _run_service_until_it_stops(
    tmp_path: Path, registry_path: Path, original: Path, flip: Flip, *, interval: float, request: str | None
) -> tuple[int, str, Path]:
    """Start the service on a copy of ``original``, apply ``flip`` under it, optionally ask its
    HTTP API for ``request``; wait for it to stop. Its exit status, its log and the store."""
    store = tmp_path / "service" / original.name
    store.parent.mkdir()
    shutil.copyfile(original, store)
    http_port = free_port()
    with running_fake_broker([b""]) as broker:
        config = write_config(
            tmp_path / "service",
            registry=registry_path,
            host="127.0.0.1",
            port=broker.port,
            store=store,
            store_extra=f"check_interval_s = {interval}",
            http_port=http_port,
        )
        proc = CollectorProcess(config, log=tmp_path / "collector.log")
        try:
            proc.start()
            _flip(store, flip)
            if request is not None:
                with contextlib.suppress(urllib.error.HTTPError):
                    urllib.request.urlopen(f"http://127.0.0.1:{http_port}{request}", timeout=GUARD_S).close()
            assert proc.process is not None
            code = proc.process.wait(timeout=GUARD_S)
            proc.process = None
        finally:
            proc.close()
    return code, (tmp_path / "collector.log").read_text(), store


def test_the_services_periodic_check_stops_it_on_damage_nobody_reads(
    tmp_path: Path, registry: Registry, registry_path: Path
) -> None:
    """A flip in a stored aggregate under the running service, which nobody reads: its periodic
    full check finds it, and the service stops with 10, naming the file. (Not a flip among the
    report ids: the service prunes the old periods' ids at start, and so rewrites their pages.)"""
    original, _ = prepare(tmp_path / "made", registry)
    flip = _refused_flip(original, registry, tmp_path / "probe")
    code, log, store = _run_service_until_it_stops(tmp_path, registry_path, original, flip, interval=1, request=None)
    assert code == ExitStatus.STORE_DAMAGED, log[-2000:]
    assert f"{store} is damaged" in log
    assert "Traceback" not in log


def test_damage_a_request_finds_stops_the_service(tmp_path: Path, registry: Registry, registry_path: Path) -> None:
    """The same flip found by the live view answering a request (the periodic check an hour
    away): the request is refused and the service stops with 10, as at start."""
    original, _ = prepare(tmp_path / "made", registry)
    flip = _refused_flip(original, registry, tmp_path / "probe")
    code, log, store = _run_service_until_it_stops(
        tmp_path, registry_path, original, flip, interval=3600, request="/api/v1/status"
    )
    assert code == ExitStatus.STORE_DAMAGED, log[-2000:]
    assert f"{store} is damaged" in log
    assert "Traceback" not in log
