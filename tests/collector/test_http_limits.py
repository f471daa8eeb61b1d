"""The HTTP API refuses what it cannot serve with the right status: an absurd period is 400
(not 500 with an OverflowError), an over-size request head is 431 (not a silent close).
(/healthz's 503 while the store cannot commit is in test_store_failures.py.)"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from collector.config import parse_config
from collector.http import HttpApi
from collector.store import CheckpointStore
from protocol.registry import Period, Registry
from tests.collector.support import run_async


async def _request(port: int, raw: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()


@run_async
async def test_bad_period_is_400_and_an_oversize_head_is_431(
    tmp_path: Path, registry: Registry, registry_path: Path
) -> None:
    """?period=99999999999999999999999 and negative periods give 400 naming the range; a 20 KiB head gives 431."""
    CheckpointStore(tmp_path / "h.sqlite3", registry, instance="h").close()
    config = parse_config(
        {
            "registry": str(registry_path),
            "store": {"path": str(tmp_path / "h.sqlite3")},
            "http": {"host": "127.0.0.1", "port": 0},
            "estimation": {"workers": 0},
        }
    )
    api = HttpApi(config)
    port = await api.start()
    serving = asyncio.create_task(api.serve())
    try:
        top = max(p.max_index for p in Period)
        for period in ("99999999999999999999999", "-1", str(top + 1)):
            answer = await _request(
                port, f"GET /api/v1/use-cases/usage/estimate?period={period} HTTP/1.1\r\n\r\n".encode()
            )
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 400"), answer[:200]
            assert f"[0, {top}]" in json.loads(body)["error"]
        big = b"GET / HTTP/1.1\r\nX-Filler: " + b"a" * (20 * 1024) + b"\r\n\r\n"
        answer = await _request(port, big)
        assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large"), answer[:200]
        ok = await _request(port, b"GET /healthz HTTP/1.1\r\n\r\n")
        assert ok.startswith(b"HTTP/1.1 200")
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
