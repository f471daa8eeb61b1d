"""Several network hosts on one machine: Linux network namespaces joined by veth pairs to a bridge.

A test that must not depend on shared loopback (a broker, a database and collectors on
separate hosts) makes a :class:`Network` of named hosts. Each host is a network namespace
with its own loopback and one interface ``eth0`` whose address lies in a private /24 that
exists **only inside these namespaces**: the bridge joining them lives in a namespace of its
own (the "switch"), so the machine's own namespace gets no address, route or interface of
the test network, and nothing a test sends can leave the machine. Everything is removed on
exit, also after a failure.

Commands run inside a host with ``ip netns exec`` (:meth:`Host.popen`, :meth:`Host.run`),
which keeps the caller's filesystem: only the network differs. Making namespaces needs root
(``CAP_SYS_ADMIN`` and ``CAP_NET_ADMIN``); :func:`require_namespaces` raises with the reason
when the machine cannot, so a test fails with that reason instead of skipping silently.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Host", "NamespaceUnavailableError", "Network", "network", "require_namespaces"]

_SUBNET_PREFIX = "10.251"
"""First two octets of the test network; the third is chosen per network so parallel runs do not meet."""


class NamespaceUnavailableError(RuntimeError):
    """This machine cannot make network namespaces (not root, no ``ip``, or the kernel refused)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=30)


def require_namespaces() -> None:
    """Raise :class:`NamespaceUnavailableError` with the reason when namespaces cannot be made here."""
    if shutil.which("ip") is None:
        raise NamespaceUnavailableError("the 'ip' command (iproute2) is not installed")
    if os.geteuid() != 0:
        raise NamespaceUnavailableError("making network namespaces needs root (CI runs as root)")
    probe = f"ldp-probe-{secrets.token_hex(3)}"
    done = _ip("netns", "add", probe, check=False)
    if done.returncode != 0:
        raise NamespaceUnavailableError(f"'ip netns add' failed: {done.stderr.strip()}")
    _ip("netns", "del", probe, check=False)


@dataclass(frozen=True)
class Host:
    """One simulated host: a network namespace with address :attr:`address` on ``eth0``."""

    name: str
    namespace: str
    address: str

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped to run inside this host's namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside this host (``subprocess.Popen`` keyword arguments pass through)."""
        return subprocess.Popen(self.command(argv), **kwargs)

    def run(self, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        """Run ``argv`` inside this host to completion (``subprocess.run`` keyword arguments pass through)."""
        kwargs.setdefault("check", False)
        return subprocess.run(self.command(argv), **kwargs)  # noqa: PLW1510 - check passes through


@dataclass
class Network:
    """Named hosts on one private /24, joined by a bridge in a namespace of its own."""

    tag: str
    subnet: int
    hosts: dict[str, Host] = field(default_factory=dict)
    _namespaces: list[str] = field(default_factory=list)

    @property
    def switch(self) -> str:
        """The namespace holding the bridge."""
        return f"ldp-{self.tag}-sw"

    def _add_namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self._namespaces.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def start(self) -> None:
        """Make the switch namespace and its bridge."""
        self._add_namespace(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")

    def add_host(self, name: str) -> Host:
        """A new host on the network, reachable from every other host at its address."""
        if name in self.hosts:
            raise ValueError(f"host {name!r} already exists")
        index = len(self.hosts) + 2
        namespace = f"ldp-{self.tag}-{len(self.hosts)}"
        self._add_namespace(namespace)
        # The pair is made in the switch namespace, then one end moves to the host; interface
        # names are per namespace, so "eth0" repeats safely across hosts.
        outside = f"v{len(self.hosts)}"
        _ip("-n", self.switch, "link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", namespace)
        _ip("-n", self.switch, "link", "set", outside, "master", "br0")
        _ip("-n", self.switch, "link", "set", outside, "up")
        address = f"{_SUBNET_PREFIX}.{self.subnet}.{index}"
        _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", namespace, "link", "set", "eth0", "up")
        host = Host(name=name, namespace=namespace, address=address)
        self.hosts[name] = host
        return host

    def close(self) -> None:
        """Delete every namespace (their veth ends and the bridge go with them)."""
        for name in reversed(self._namespaces):
            _ip("netns", "del", name, check=False)
        self._namespaces.clear()
        self.hosts.clear()


@contextlib.contextmanager
def network(*names: str) -> Iterator[Network]:
    """A network with one host per name, removed afterwards.

    Raises:
        NamespaceUnavailableError: the machine cannot make namespaces; the message says why.
    """
    require_namespaces()
    tag = secrets.token_hex(3)
    net = Network(tag=tag, subnet=int(tag[:2], 16) % 250 + 1)
    try:
        net.start()
        for name in names:
            net.add_host(name)
        yield net
    finally:
        net.close()
