"""The broker fixture really starts Mosquitto and restarts it on the same port."""

from __future__ import annotations

import socket

from tests.support.broker import Broker


def test_broker_accepts_connections_and_restarts(mosquitto: Broker) -> None:
    """A TCP connection succeeds before and after a restart on the same loopback port."""
    with socket.create_connection((mosquitto.host, mosquitto.port), timeout=2):
        pass
    port = mosquitto.port
    mosquitto.restart()
    assert mosquitto.port == port
    with socket.create_connection((mosquitto.host, mosquitto.port), timeout=2):
        pass
