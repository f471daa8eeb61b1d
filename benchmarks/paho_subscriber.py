"""A paho-mqtt subscriber that acknowledges each message by hand: the reference for the collector's own client.

``benchmarks.bench_collector`` runs it as a third consumer next to ``mosquitto_sub`` and the
collector, to decide whether the collector keeps its own MQTT client (docs/mqtt-client.md).
paho's ``manual_ack=True`` is how a collector built on paho would acknowledge after commit:
the PUBACK leaves only when the application calls ``ack``. Here nothing is committed: the
acknowledgement follows the receipt at once, so the rate is paho's ceiling, not a collector's.

    python -m benchmarks.paho_subscriber --port P --client-id ID --create
    python -m benchmarks.paho_subscriber --port P --client-id ID --count N

The first form creates the persistent session and exits; the second drains ``N`` messages
and prints two numbers on stdout: the seconds from the first message to the last, and the
CPU seconds the process spent meanwhile (the figure a loaded machine does not distort).
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Sequence

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

TOPIC = "ldp/v1/reports/#"


def run(host: str, port: int, client_id: str, count: int, *, receive_maximum: int = 20_000) -> tuple[float, float]:
    """Subscribe with a persistent session; with ``count`` > 0 drain that many.

    Returns:
        The wall-clock seconds from the first message to the last, and the process's CPU
        seconds over the same span.
    """
    subscribed = threading.Event()
    done = threading.Event()
    state = {"got": 0, "first": 0.0, "last": 0.0, "cpu_first": 0.0, "cpu_last": 0.0}
    props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    props.SessionExpiryInterval = 3600
    props.ReceiveMaximum = receive_maximum
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5, manual_ack=True)

    def on_connect(c: mqtt.Client, *_: object) -> None:
        c.subscribe(TOPIC, qos=1)

    def on_message(c: mqtt.Client, _: object, message: mqtt.MQTTMessage) -> None:
        now = time.perf_counter()
        if not state["got"]:
            state["first"] = now
            state["cpu_first"] = time.process_time()
        c.ack(message.mid, message.qos)
        state["got"] += 1
        state["last"] = now
        state["cpu_last"] = time.process_time()
        if state["got"] >= count:
            done.set()

    client.on_connect = on_connect
    client.on_subscribe = lambda *_: subscribed.set()
    client.on_message = on_message
    client.connect(host, port, clean_start=False, properties=props)
    client.loop_start()
    try:
        if not subscribed.wait(30):
            raise TimeoutError("paho: no SUBACK")
        if count > 0 and not done.wait(900):
            raise TimeoutError(f"paho: received {state['got']} of {count}")
    finally:
        client.disconnect()
        client.loop_stop()
    return state["last"] - state["first"], state["cpu_last"] - state["cpu_first"]


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--client-id", required=True)
    parser.add_argument("--count", type=int, default=0, help="messages to drain (0 with --create)")
    parser.add_argument("--create", action="store_true", help="only create the persistent session")
    args = parser.parse_args(argv)
    elapsed, cpu = run(args.host, args.port, args.client_id, 0 if args.create else args.count)
    print(f"{elapsed:.6f} {cpu:.6f}")


if __name__ == "__main__":
    main()
