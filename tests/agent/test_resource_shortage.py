"""An agent out of files or memory waits and retries: never stopped as if misconfigured, logged once."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path

import pytest

import agent.mqtt
from agent.config import BrokerConfig, tls_context
from agent.core import Agent
from agent.errors import ConfigError, TransportError
from agent.mqtt import MqttTransport
from agent.publisher import Publisher
from agent.transport import Connection, MemoryTransport
from protocol.randomness import SeededRandom
from runtime.backoff import Backoff
from runtime.resources import ResourceShortageError, resource_shortage
from tests.collector.test_tls import _make_pki
from tests.support.clocks import FakeClock

DAY = 86_400.0


class _FullTable(MemoryTransport):
    """A broker the device cannot reach while its file table is full (a socket fails with EMFILE)."""

    full: bool = True

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[Connection]:
        if self.full:
            try:
                raise OSError(errno.EMFILE, "Too many open files")
            except OSError as e:
                raise TransportError(f"cannot connect: {e}") from e
        async with super().connect() as conn:
            yield conn


def test_the_publisher_retries_a_full_file_table_and_logs_it_once(
    make_agent: Callable[..., Agent], clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Many failed rounds for want of files: one log line, backoff between them; then every report goes out."""
    agent = make_agent()
    agent.grant_consent()
    agent.record("flag", 1)
    clock.set(clock.time() + DAY)
    agent.collect()
    transport = _FullTable()
    publisher = Publisher(agent, transport, clock=clock, rng=SeededRandom(1), backoff=Backoff(initial=1.0, cap=8.0))

    async def scenario() -> None:
        task = asyncio.create_task(publisher.run())
        publisher.kick()
        await clock.advance(60.0)
        assert publisher.statistics().failures >= 5
        transport.full = False
        await clock.advance(10.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with caplog.at_level(logging.WARNING):
        asyncio.run(scenario())
    assert agent.outbox() == []
    lines = [r.getMessage() for r in caplog.records]
    assert not any(line.startswith("publishing failed") for line in lines), lines
    shortage = [line for line in lines if "a system resource ran out" in line]
    assert len(shortage) == 1, lines
    assert shortage[0].startswith("publish: a system resource ran out (EMFILE: ")
    assert any(line.startswith("publish works again after ") for line in lines), lines


def test_a_tls_file_unreadable_for_want_of_files_is_retried_and_a_missing_one_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EMFILE reading the CA: a TransportError (retried), nothing kept; a CA that is not there: ConfigError."""
    ca, _, _ = _make_pki(tmp_path)
    cfg = BrokerConfig(host="127.0.0.1", port=1, ca_file=ca, source="agent.toml")
    real = tls_context
    calls = 0

    def full_then_real(broker: BrokerConfig) -> object:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ResourceShortageError(f"reading ca_file {ca}", OSError(errno.EMFILE, "Too many open files"))
        return real(broker)

    monkeypatch.setattr(agent.mqtt, "tls_context", full_then_real)
    transport = MqttTransport(cfg, SeededRandom(1))
    with pytest.raises(TransportError) as caught:
        asyncio.run(_connect(transport))
    assert resource_shortage(caught.value) == "EMFILE"
    # The next attempt builds the context (and keeps it); the broker at port 1 is simply not there.
    with pytest.raises(TransportError, match="cannot connect"):
        asyncio.run(_connect(transport))
    with pytest.raises(TransportError, match="cannot connect"):
        asyncio.run(_connect(transport))
    assert calls == 2  # built once it worked, reused by the reconnect
    missing = replace(cfg, ca_file=tmp_path / "gone.pem")
    with pytest.raises(ConfigError, match=r"agent.toml: broker.ca_file: cannot read .*gone.pem"):
        asyncio.run(_connect(MqttTransport(missing, SeededRandom(1))))


async def _connect(transport: MqttTransport) -> None:
    async with transport.connect():
        pass
