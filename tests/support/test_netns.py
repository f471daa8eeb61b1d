"""The multi-host helper makes hosts that reach each other over their own addresses only,
leaves the machine's own namespace untouched, and removes everything afterwards."""

from __future__ import annotations

import subprocess
import sys

from tests.support.netns import network

_SERVER = (
    "import socket, sys\n"
    "s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(1)\n"
    "print(s.getsockname()[1], flush=True)\n"
    "c, _ = s.accept(); c.sendall(b'hello from ' + sys.argv[1].encode()); c.close()\n"
)
_CLIENT = (
    "import socket, sys\n"
    "c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)\n"
    "print(c.recv(100).decode())\n"
)


def _links() -> str:
    return subprocess.run(["ip", "-o", "addr"], check=True, capture_output=True, text=True).stdout


def test_two_hosts_talk_over_tcp_and_are_removed() -> None:
    """A TCP server on one host answers a client on another; the root namespace never sees the test network."""
    before = _links()
    with network("server", "client") as net:
        server, client = net.hosts["server"], net.hosts["client"]
        assert server.address != client.address
        with server.popen([sys.executable, "-c", _SERVER, server.address], stdout=subprocess.PIPE, text=True) as proc:
            try:
                assert proc.stdout is not None
                port = proc.stdout.readline().strip()
                done = client.run(
                    [sys.executable, "-c", _CLIENT, server.address, port], capture_output=True, text=True, timeout=30
                )
                assert done.stdout.strip() == f"hello from {server.address}", done.stderr
            finally:
                proc.kill()
        # The server host cannot be reached from the machine's own namespace.
        assert server.address not in _links()
        namespaces = subprocess.run(["ip", "netns", "list"], check=True, capture_output=True, text=True).stdout
        assert server.namespace in namespaces
    namespaces = subprocess.run(["ip", "netns", "list"], check=True, capture_output=True, text=True).stdout
    assert server.namespace not in namespaces
    assert _links() == before
