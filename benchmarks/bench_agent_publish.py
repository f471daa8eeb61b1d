"""What the agent's check of each PUBACK costs: aiomqtt's publish against the hooked one, through a real Mosquitto.

An agent with receipts publishes through :meth:`agent.aiomqtt_hooks.HookedClient.publish_checked`,
which keeps the PUBACK's reason code and races the publish against the broker's DISCONNECT in
a task group of its own (docs/mqtt-client.md, "The agent's client"). This benchmark publishes
``--publishes`` QoS 1 messages one after another, each with the receipt request an agent's
report carries (Response Topic, Correlation Data), once through aiomqtt's own ``publish`` and
once through ``publish_checked``, on one connection each, alternated ``--repeat`` times, and
prints one JSON document: each run's seconds, the medians, and the median difference per
publish. A device publishes a few reports a cycle; the figure says what the check adds to each.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from agent.aiomqtt_hooks import HookedClient
from benchmarks.harness import emit, progress
from tests.support.broker import Broker, running_broker

__all__ = ["main", "run"]

_TIMEOUT = 60.0


def _properties(correlation: bytes) -> Properties:
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.ResponseTopic = "ldp/v1/receipts/bench"
    props.CorrelationData = correlation
    return props


async def _publishes(broker: Broker, count: int, *, checked: bool) -> tuple[float, float]:
    """Wall-clock and CPU seconds of ``count`` sequential QoS 1 publishes on one fresh connection."""
    client = HookedClient(
        broker.host,
        broker.port,
        identifier=f"bench-{'checked' if checked else 'plain'}",
        protocol=aiomqtt.ProtocolVersion.V5,
        clean_start=True,
        timeout=_TIMEOUT,
    )
    payload = bytes(60)
    async with client:
        wall, cpu = time.perf_counter(), time.process_time()
        for i in range(count):
            props = _properties(i.to_bytes(16, "big"))
            if checked:
                code = await client.publish_checked(
                    "ldp/v1/reports/bench/flag", payload, timeout=_TIMEOUT, properties=props
                )
                if code:
                    raise RuntimeError(f"the broker refused a publish (reason code 0x{code:02x})")
            else:
                await client.publish("ldp/v1/reports/bench/flag", payload, qos=1, properties=props, timeout=_TIMEOUT)
        return time.perf_counter() - wall, time.process_time() - cpu


def run(publishes: int, repeat: int) -> dict[str, Any]:
    """Both ways, alternated ``repeat`` times against one broker; the JSON document's content."""
    runs: dict[str, list[tuple[float, float]]] = {"aiomqtt_publish": [], "publish_checked": []}
    with tempfile.TemporaryDirectory() as tmp, running_broker(Path(tmp) / "broker", persistence=False) as broker:
        for r in range(repeat):
            for name, done in runs.items():
                progress(f"run {r + 1}/{repeat}: {name}")
                done.append(asyncio.run(_publishes(broker, publishes, checked=name == "publish_checked")))
    medians = {name: statistics.median(wall for wall, _ in done) for name, done in runs.items()}
    cpu = {name: statistics.median(c for _, c in done) for name, done in runs.items()}
    return {
        "benchmark": "agent_publish",
        "publishes": publishes,
        "repeat": repeat,
        "runs_seconds": {name: [round(wall, 4) for wall, _ in done] for name, done in runs.items()},
        "median_seconds": {name: round(v, 4) for name, v in medians.items()},
        "median_cpu_seconds": {name: round(v, 4) for name, v in cpu.items()},
        "checked_minus_plain_us_per_publish": round(
            (medians["publish_checked"] - medians["aiomqtt_publish"]) / publishes * 1e6, 1
        ),
        "checked_minus_plain_cpu_us_per_publish": round(
            (cpu["publish_checked"] - cpu["aiomqtt_publish"]) / publishes * 1e6, 1
        ),
    }


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: ``python -m benchmarks.bench_agent_publish [--publishes N] [--repeat R]``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--publishes", type=int, default=2000, help="publishes per run (default 2,000)")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each way, alternated (default 5)")
    args = parser.parse_args(argv)
    emit(run(args.publishes, args.repeat))


if __name__ == "__main__":
    main()
