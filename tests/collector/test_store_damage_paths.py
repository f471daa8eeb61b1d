"""Every path that reads the store meets a damaged one the same way: ``ldp-collector status``,
``ldp-collector estimate`` and the live view of the HTTP API either read exactly what the
undamaged store reads or refuse, naming the file; none prints a different number or a
traceback. The store's own open, for writing (the service's start) and for reading, is
flipped the same way in ``test_store_integrity.py``; this runs each command on 24 flips in
each table and index."""

from __future__ import annotations

import asyncio
import io
import shutil
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from collector.cli import main
from collector.config import parse_config
from collector.errors import StoreError
from collector.live import LiveAggregates
from collector.results import to_json
from collector.store import CheckpointStore
from protocol.registry import Registry
from runtime.exit_status import ExitStatus
from tests.collector.corruption import flipped_copy, plan, prepare

USE_CASES = ("usage", "hist")


def _cli(config: Path, *words: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["--config", str(config), *words])
    return code, out.getvalue(), err.getvalue()


def _cli_reads(config: Path) -> list[tuple[int, str, str]]:
    reads = [_cli(config, "status", "--json")]
    reads.extend(_cli(config, "estimate", name, "--json") for name in USE_CASES)
    return reads


async def _live_reads(config_text: dict[str, object], registry: Registry) -> list[bytes]:
    live = LiveAggregates(parse_config(config_text), registry)
    try:
        reads = [to_json(await live.status())]
        for name in USE_CASES:
            _, result = await live.estimate(name)
            reads.append(to_json(result))
        return reads
    finally:
        await asyncio.to_thread(live.close)


def test_status_estimate_and_the_live_view_never_read_a_damaged_store_silently(
    tmp_path: Path, registry: Registry, registry_path: Path
) -> None:
    """24 seeded flips in each table and index; per flip, each path reads as before or refuses naming the file."""
    original, _ = prepare(tmp_path / "made", registry)
    work = tmp_path / "work"
    copy = work / original.name
    config_text: dict[str, object] = {"registry": str(registry_path), "store": {"path": str(copy)}}
    config = tmp_path / "collector.toml"
    config.write_text(f'registry = "{registry_path}"\n[store]\npath = "{copy}"\n', encoding="utf-8")

    work.mkdir()
    shutil.copyfile(original, copy)
    cli_reference = _cli_reads(config)
    assert [code for code, _, _ in cli_reference] == [0, 0, 0]
    live_reference = asyncio.run(_live_reads(config_text, registry))

    refused = {"cli": 0, "live": 0}
    flips = plan(original, 24, seed=20261126)
    assert len(flips) >= 300
    for flip in flips:
        flipped_copy(original, flip, work)
        for (code, out, err), (ref_code, ref_out, _) in zip(_cli_reads(config), cli_reference, strict=True):
            if code == ref_code and out == ref_out:
                continue
            # The status `ldp-collector run` gives a damaged store: restarting cannot help.
            assert code == ExitStatus.STORE_DAMAGED, (flip, code, err[:300])
            assert not out, (flip, out[:200])
            assert str(copy) in err, (flip, err)
            assert "Traceback" not in err, (flip, err)
            refused["cli"] += 1
        flipped_copy(original, flip, work)
        try:
            live: list[bytes] | StoreError = asyncio.run(_live_reads(config_text, registry))
        except StoreError as exc:
            live = exc
        if isinstance(live, StoreError):
            assert str(copy) in str(live), (flip, live)
            refused["live"] += 1
        else:
            assert live == live_reference, flip
    assert refused["cli"] > 0
    assert refused["live"] > 0


@pytest.mark.parametrize("index", ["segments_key", "sqlite_autoindex_use_cases_1"])
def test_an_index_damaged_while_the_service_runs_stops_the_live_view_when_it_opens(
    tmp_path: Path, registry: Registry, registry_path: Path, index: str
) -> None:
    """The service holds the store open, an index is damaged: the live view's first read refuses, naming the file."""
    original, _ = prepare(tmp_path / "made", registry)
    service = CheckpointStore(original, registry, instance="flips")  # opened and checked, as at start
    try:
        flip = next(f for f in plan(original, 8, seed=3) if f.object == index)
        with original.open("r+b") as f:
            f.seek(flip.offset)
            byte = f.read(1)[0]
            f.seek(flip.offset)
            f.write(bytes([byte ^ (1 << flip.bit)]))
        config_text: dict[str, object] = {"registry": str(registry_path), "store": {"path": str(original)}}
        with pytest.raises(StoreError, match="is damaged") as info:
            asyncio.run(_live_reads(config_text, registry))
        assert str(original) in str(info.value)
    finally:
        service.close()
