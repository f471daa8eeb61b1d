"""Fixtures for the deployment tests: the test PKI, the broker users, and a broker running
the production Mosquitto config with TLS, the password file and the ACL."""

from __future__ import annotations

import itertools
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.deploy.probe import V5, V311, Probe, tls_context
from tests.deploy.secure_broker import SecureBroker, make_pki, make_users, running_secure_broker

BROKER_USERS = ("devices", "collector", "observer", "dev-a", "dev-b", "fleet-sim")
DEVICE_CERTS = ("devices", "collector", "dev-a", "dev-b")
"""Client certificates the test CA issues (a device's common name is its identity)."""
_topics = itertools.count()


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """CA, broker and client certificates made by deploy/make-test-ca.sh."""
    return make_pki(tmp_path_factory.mktemp("pki"), *(a for name in DEVICE_CERTS for a in ("--client", name)))


@dataclass(frozen=True)
class BrokerUsers:
    """The broker's password file and each user's password, made by deploy/make-broker-users.sh."""

    passwd: Path
    passwords: dict[str, str]


@pytest.fixture(scope="session")
def broker_users(tmp_path_factory: pytest.TempPathFactory) -> BrokerUsers:
    """Users devices, dev-a, dev-b (devices), collector, fleet-sim and (tests only) observer."""
    base = tmp_path_factory.mktemp("broker-users")
    passwords = make_users(base / "passwd", base / "secrets", BROKER_USERS)
    return BrokerUsers(passwd=base / "passwd", passwords=passwords)


@pytest.fixture(scope="session")
def secure_broker(
    tmp_path_factory: pytest.TempPathFactory, pki: Path, broker_users: BrokerUsers
) -> Iterator[SecureBroker]:
    """Mosquitto with deploy/mosquitto/ (relocated to a temp dir), shared by the session's tests."""
    directory = tmp_path_factory.mktemp("secure-broker")
    with running_secure_broker(
        directory, pki=pki, passwd=broker_users.passwd, passwords=broker_users.passwords
    ) as broker:
        yield broker


class Clients:
    """Makes probes against the secure broker and closes them all at the end of the test."""

    def __init__(self, broker: SecureBroker) -> None:
        self.broker = broker
        self._open: list[Probe] = []

    def context(self, cert: str | None = None) -> ssl.SSLContext:
        """A TLS context trusting the test CA, presenting ``<cert>.pem`` when named."""
        pair = None if cert is None else (self.broker.pki / f"{cert}.pem", self.broker.pki / f"{cert}.key")
        return tls_context(self.broker.ca_file, pair)

    def probe(
        self,
        *,
        user: str | None = None,
        password: str | None = None,
        protocol: int = V5,
        cert: str | None = None,
        mtls: bool = False,
        context: ssl.SSLContext | None = None,
        host: str = "127.0.0.1",
        client_id: str = "",
    ) -> Probe:
        """An unconnected probe (TLS with the test CA unless ``context`` is given)."""
        port = self.broker.mtls_port if mtls else self.broker.tls_port
        ctx = context if context is not None else self.context(cert)
        p = Probe(
            port, protocol=protocol, context=ctx, username=user, password=password, host=host, client_id=client_id
        )
        self._open.append(p)
        return p

    def connected(
        self, user: str, *, protocol: int = V5, mtls: bool = False, client_id: str = "", session_expiry: int = 0
    ) -> Probe:
        """A connected probe for a broker user: by password, or by its certificate on the mTLS port.

        A non-zero ``session_expiry`` (MQTT 5) resumes the session of ``client_id`` if the
        broker holds one, and keeps it that long after the connection ends.
        """
        if mtls:
            p = self.probe(protocol=protocol, cert=user, mtls=True, client_id=client_id)
        else:
            p = self.probe(user=user, password=self.broker.passwords[user], protocol=protocol, client_id=client_id)
        result = p.connect(clean_start=session_expiry == 0, session_expiry=session_expiry)
        assert result.accepted, f"{user} was refused: {result}\n{self.broker.log()}"
        return p

    def close(self) -> None:
        """Close every probe made by this object."""
        for p in self._open:
            p.close()


@pytest.fixture
def clients(secure_broker: SecureBroker) -> Iterator[Clients]:
    """Probe factory for one test; every probe is closed afterwards."""
    c = Clients(secure_broker)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def report_topic() -> str:
    """A report topic of the device ``devices`` no other test publishes to
    (``ldp/v1/reports/devices/<unique use case>``: a device publishes under its own identity)."""
    return f"ldp/v1/reports/devices/deploy-test-{next(_topics)}"


__all__ = ["BROKER_USERS", "DEVICE_CERTS", "V5", "V311", "BrokerUsers", "Clients"]
