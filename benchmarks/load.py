"""Load generator: genuinely privatized reports from the batch APIs, published as fast as the broker takes them.

**This does not run agents.** The fleet simulator (``ldp-fleet``) runs a complete agent per
device (sealed state, accounting, outbox, ledger) and reaches about 2,000 reports/s on a
2-core machine: too slow to load several collectors. This generator skips the agent and
calls the mechanisms' vectorised client halves (``privatize_many``) with a seeded source, so
every report is a real privatized report a device could have sent, valid for the collector
(right registry hash, period, record shape and count), but no device state, limit or
ledger exists behind it. Use it for throughput only; use ``ldp-fleet`` for correctness.

Two shapes, those of ``benchmarks.bench_collector``:

* ``single``: one Hadamard CMS record per message (``safari-energy-domains``, k = 1,024,
  m = 32,768; 003 §6's deployed parameters), Zipf-distributed domains;
* ``counters``: 20 1BitMean records per message (``app-usage-seconds``, 000 §6), each
  device's memoized answers for 20 apps' usage seconds.

The messages are built first (timed separately), then published over ``--connections``
pipelined QoS 1 connections at once; the rate printed is acknowledged PUBLISHes per second.

    python -m benchmarks.load --broker 127.0.0.1:1883 --shape single --messages 200000

Prints one JSON document on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import emit, progress, rate
from protocol.hcms import HadamardCountMeanSketch
from protocol.one_bit_mean import OneBitMean
from protocol.randomized_response import RandomizedResponse
from protocol.randomness import SeededRandom
from protocol.registry import Registry, parse_registry
from protocol.server.contract import BatchPrivatizer
from protocol.server.hcms import HCMSServer
from protocol.server.one_bit_mean import OneBitMeanServer
from protocol.server.randomized_response import RRServer
from protocol.wire import Report, encode_report
from tests.support.mqtt_publisher import MqttPublisher

__all__ = ["LABEL", "build_counters", "build_flags", "build_single", "build_strings", "main", "publish"]

ROOT = Path(__file__).resolve().parent.parent
REGISTRY = ROOT / "deploy" / "usecases.example.toml"
LABEL = "load generator: privatized reports from the batch APIs; no agents, no device state, limits or ledger"
_CHUNK = 50_000


def _sources(seed: int) -> tuple[SeededRandom, np.random.Generator]:
    """The devices' coins and, from another stream, the true values and report ids.

    Both were once seeded with ``seed`` alone: ``SeededRandom`` is PCG64 too, so the coins
    repeated the very draws that chose the values, and a randomized-response "keep" fell
    exactly where the true bit was 1 - the reports were biased (a 30 % share estimated as
    64 %). A second seed word gives an independent stream.
    """
    return SeededRandom(seed), np.random.default_rng([seed, 0x10AD])


def _report_ids(gen: np.random.Generator, count: int) -> list[bytes]:
    raw = gen.bytes(16 * count)
    return [raw[16 * i : 16 * i + 16] for i in range(count)]


def build_single(registry: Registry, count: int, *, seed: int, period: int | None = None) -> list[tuple[str, bytes]]:
    """``count`` one-record HCMS reports of ``safari-energy-domains`` (Zipf(1.3) over 2,000 domains)."""
    uc = registry.use_cases["safari-energy-domains"]
    mech = uc.mechanism
    if not isinstance(mech, HadamardCountMeanSketch):
        raise TypeError(f"{uc.name} is not a Hadamard CMS use case")
    rng, gen = _sources(seed)
    domains = [f"site{i}.example" for i in range(2000)]
    slot = uc.period.index_at(time.time()) if period is None else period
    topic = f"ldp/v1/reports/{uc.name}"
    out: list[tuple[str, bytes]] = []
    for start in range(0, count, _CHUNK):
        n = min(_CHUNK, count - start)
        picks = gen.zipf(1.3, size=n) % len(domains)
        batch = HCMSServer(mech).privatize_many([domains[int(i)] for i in picks], rng)
        ids = _report_ids(gen, n)
        for i, (j, ell, bit) in enumerate(zip(batch.j.tolist(), batch.ell.tolist(), batch.bits.tolist(), strict=True)):
            report = Report(
                use_case=uc.name, definition=uc.definition, period=slot, report_id=ids[i], records=[[j, ell, bit]]
            )
            out.append((topic, encode_report(report)))
    return out


def build_strings(
    registry: Registry, count: int, *, seed: int, use_case: str, period: int | None = None
) -> list[tuple[str, bytes]]:
    """``count`` one-record reports of an event-level string use case (``emoji`` under CMS,
    ``emoji-olh`` under OLH, ...), Zipf(1.3) over 2,000 strings, privatized by its server half's
    batch path."""
    uc = registry.use_cases[use_case]
    server: Any = uc.server
    rng, gen = _sources(seed)
    strings = [f"site{i}.example" for i in range(2000)]
    slot = uc.period.index_at(time.time()) if period is None else period
    topic = f"ldp/v1/reports/{uc.name}"
    out: list[tuple[str, bytes]] = []
    for start in range(0, count, _CHUNK):
        n = min(_CHUNK, count - start)
        picks = [strings[int(i)] for i in gen.zipf(1.3, size=n) % len(strings)]
        if isinstance(server, BatchPrivatizer):
            wire = server.privatize_records(picks, rng)
        else:  # CMS: its batch in wire form, [j, bits]
            batch = server.privatize_many(picks, rng)
            wire = [[j, bytes(b)] for j, b in zip(batch.indices.tolist(), batch.bits, strict=True)]
        ids = _report_ids(gen, n)
        for i in range(n):
            report = Report(
                use_case=uc.name, definition=uc.definition, period=slot, report_id=ids[i], records=[wire[i]]
            )
            out.append((topic, encode_report(report)))
    return out


def build_counters(
    registry: Registry,
    count: int,
    *,
    seed: int,
    records: int = 20,
    period: int | None = None,
    use_case: str = "app-usage-seconds",
    mean_s: float = 3_600.0,
) -> list[tuple[str, bytes]]:
    """``count`` reports of ``records`` 1BitMean answers each (default ``app-usage-seconds``).

    Each message is one device's round: its permanent state (α and memo bits, 000 §3.1) is
    drawn once, and each of its ``records`` counters is answered from it with a fresh
    output-perturbation coin (000 §4), as the agent does. The true values are
    Exponential(``mean_s``) clipped at the mechanism's ``m``: their mean is
    ``mean_s * (1 - exp(-m / mean_s))``.
    """
    uc = registry.use_cases[use_case]
    mech = uc.mechanism
    if not isinstance(mech, OneBitMean):
        raise TypeError(f"{uc.name} is not a 1BitMean use case")
    server = OneBitMeanServer(mech)
    if records > uc.daily_limit:
        raise ValueError(f"{records} records per report exceed {uc.name}'s daily limit of {uc.daily_limit}")
    rng, gen = _sources(seed)
    slot = uc.period.index_at(time.time()) if period is None else period
    topic = f"ldp/v1/reports/{uc.name}"
    out: list[tuple[str, bytes]] = []
    per_chunk = max(1, _CHUNK // records)
    for start in range(0, count, per_chunk):
        devices = min(per_chunk, count - start)
        states = server.setup_many(devices, rng)
        # Device i answers its `records` counters with its own state: repeat the state's rows.
        rows = np.repeat(np.arange(devices), records)
        states_rep = type(states)(
            m=states.m, s=states.s, epsilon=states.epsilon, alphas=states.alphas[rows], memo=states.memo[rows]
        )
        values = np.minimum(gen.exponential(mean_s, size=devices * records).astype(np.int64), mech.m)
        bits = server.privatize_many(values, states_rep, rng).bits.reshape(devices, records).tolist()
        ids = _report_ids(gen, devices)
        for i in range(devices):
            report = Report(use_case=uc.name, definition=uc.definition, period=slot, report_id=ids[i], records=bits[i])
            out.append((topic, encode_report(report)))
    return out


def build_flags(
    registry: Registry, count: int, *, seed: int, use_case: str, share: float = 0.3, period: int | None = None
) -> list[tuple[str, bytes]]:
    """``count`` one-record randomized-response reports of ``use_case``; a device's true bit is 1
    with probability ``share`` (the mean the estimate should find)."""
    uc = registry.use_cases[use_case]
    mech = uc.mechanism
    if not isinstance(mech, RandomizedResponse):
        raise TypeError(f"{uc.name} is not a randomized-response use case")
    rng, gen = _sources(seed)
    slot = uc.period.index_at(time.time()) if period is None else period
    topic = f"ldp/v1/reports/{uc.name}"
    out: list[tuple[str, bytes]] = []
    for start in range(0, count, _CHUNK):
        n = min(_CHUNK, count - start)
        truth = (gen.random(n) < share).astype(np.uint8)
        bits = RRServer(mech).privatize_many(truth, rng).bits.tolist()
        ids = _report_ids(gen, n)
        for i in range(n):
            report = Report(
                use_case=uc.name, definition=uc.definition, period=slot, report_id=ids[i], records=[bits[i]]
            )
            out.append((topic, encode_report(report)))
    return out


async def _publish_all(host: str, port: int, parts: Sequence[Sequence[tuple[str, bytes]]], window: int) -> None:
    async with asyncio.TaskGroup() as group:
        for i, part in enumerate(parts):
            publisher = MqttPublisher(host, port, client_id=f"ldp-load-{i}", window=window)
            group.create_task(publisher.publish_all(part), name=f"load-publisher-{i}")


def publish(
    host: str, port: int, messages: Sequence[tuple[str, bytes]], *, connections: int = 1, window: int = 5000
) -> float:
    """Publish ``messages`` at QoS 1 over ``connections`` pipelined connections; seconds until all acknowledged."""
    parts = [messages[i::connections] for i in range(connections)]
    start = time.perf_counter()
    asyncio.run(_publish_all(host, port, parts, window))
    return time.perf_counter() - start


def main(argv: Sequence[str] | None = None) -> int:
    """Build, publish, print JSON."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.load",
        description="Publish privatized reports made by the batch APIs (not full agents) as fast as the broker "
        "acknowledges them, to load collectors. " + LABEL + ".",
    )
    parser.add_argument("--broker", default="127.0.0.1:1883", help="HOST:PORT of a plain-TCP MQTT listener")
    parser.add_argument("--shape", choices=("single", "counters"), default="single", help="message shape")
    parser.add_argument("--messages", type=int, default=200_000, help="messages to publish (default 200,000)")
    parser.add_argument("--connections", type=int, default=1, help="parallel publishing connections (default 1)")
    parser.add_argument("--window", type=int, default=5000, help="PUBLISHes in flight per connection")
    parser.add_argument("--seed", type=int, default=1, help="seed of the simulated devices' randomness (default 1)")
    parser.add_argument("--registry", type=Path, default=REGISTRY, help="use-case registry (default: the example)")
    args = parser.parse_args(argv)
    if args.messages < 1 or args.connections < 1 or args.window < 1:
        parser.error("--messages, --connections and --window must be positive")
    host, _, port = args.broker.rpartition(":")
    if not host or not port.isdigit():
        parser.error(f"--broker must be HOST:PORT; got {args.broker!r}")
    registry = parse_registry(args.registry.read_bytes(), source=str(args.registry))
    progress(f"building {args.messages:,} {args.shape} messages ...")
    start = time.perf_counter()
    build = build_single if args.shape == "single" else build_counters
    messages = build(registry, args.messages, seed=args.seed)
    built = time.perf_counter() - start
    progress(f"publishing over {args.connections} connection(s) ...")
    elapsed = publish(host, int(port), messages, connections=args.connections, window=args.window)
    result: dict[str, Any] = {
        "label": LABEL,
        "shape": args.shape,
        "messages": len(messages),
        "bytes_per_message": round(sum(len(p) for _, p in messages) / len(messages), 1),
        "build_msgs_per_s": rate(len(messages), built),
        "publish_msgs_per_s": rate(len(messages), elapsed),
        "connections": args.connections,
    }
    emit(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
