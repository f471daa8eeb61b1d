"""Publish a prepared stream of reports at QoS 1, as a program of its own (for a publisher on another host).

    python -m tests.support.publish --broker HOST:PORT --connections 2 STREAM

``STREAM`` is a msgpack file holding a list of ``[topic, payload]`` pairs (see :func:`write_stream`).
The program returns once the broker has acknowledged every message and prints one JSON line:
``{"published": N, "resent": R}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

import msgpack

from tests.support.mqtt_publisher import MqttPublisher

__all__ = ["main", "read_stream", "write_stream"]


def write_stream(path: Path, items: Sequence[tuple[str, bytes]]) -> None:
    """Write ``items`` for :func:`main` to read."""
    path.write_bytes(msgpack.packb([[topic, payload] for topic, payload in items], use_bin_type=True))


def read_stream(path: Path) -> list[tuple[str, bytes]]:
    """The items :func:`write_stream` wrote."""
    return [(str(topic), bytes(payload)) for topic, payload in msgpack.unpackb(path.read_bytes(), raw=False)]


async def _publish(host: str, port: int, parts: Sequence[Sequence[tuple[str, bytes]]]) -> int:
    resent = 0
    async with asyncio.TaskGroup() as group:
        tasks = [
            group.create_task(MqttPublisher(host, port, client_id=f"ldp-publisher-{i}", window=2000).publish_all(part))
            for i, part in enumerate(parts)
        ]
    for task in tasks:
        resent += task.result().resent
    return resent


def main(argv: Sequence[str] | None = None) -> int:
    """Publish the stream; print what was published."""
    parser = argparse.ArgumentParser(prog="python -m tests.support.publish", description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", required=True, help="HOST:PORT of a plain-TCP MQTT listener")
    parser.add_argument("--connections", type=int, default=2, help="parallel publishing connections")
    parser.add_argument("stream", type=Path, help="msgpack file of [topic, payload] pairs")
    args = parser.parse_args(argv)
    host, _, port = args.broker.rpartition(":")
    items = read_stream(args.stream)
    parts = [items[i :: args.connections] for i in range(args.connections)]
    resent = asyncio.run(_publish(host, int(port), parts))
    print(json.dumps({"published": len(items), "resent": resent}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
