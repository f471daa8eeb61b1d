"""The device's broker identity: its user name or its certificate's common name, one topic level,
carried in the topic (never in the payload) so the broker's ACL can tie reports to it."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from agent.config import BrokerConfig
from agent.core import Agent
from agent.errors import ConfigError
from agent.identity import device_identity
from protocol.wire import decode_report
from tests.support.clocks import FakeClock

DAY = 86_400.0


def _certificate(path: Path, common_name: str) -> Path:
    """A self-signed client certificate whose subject CN is ``common_name``."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "t"), x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    )
    now = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def test_identity_is_the_user_name_or_the_certificate_common_name(tmp_path: Path) -> None:
    """A password user is its user name; a certificate user is its CN; an anonymous agent has none."""
    assert device_identity(BrokerConfig(host="b", username="dev-0001")) == "dev-0001"
    cert = _certificate(tmp_path / "c.pem", "dev-0002")
    assert device_identity(BrokerConfig(host="b", cert_file=cert, key_file=tmp_path / "k")) == "dev-0002"
    assert device_identity(BrokerConfig(host="b", tls=False)) is None


@pytest.mark.parametrize("name", ["a/b", "+", "#", "", "-lead", "x" * 200, "é"])
def test_an_identity_that_is_not_one_topic_level_is_refused(tmp_path: Path, name: str) -> None:
    """A user name or CN with '/', '+' or '#', empty or too long, is not one topic level: refused, naming the field."""
    if name:
        with pytest.raises(ConfigError, match=r"broker\.username"):
            device_identity(BrokerConfig(host="b", username=name), source="agent.toml")
    if len(name) > 64:
        return  # X.509 caps a common name at 64 characters: no certificate can carry it
    cert = _certificate(tmp_path / "c.pem", name or " ")
    with pytest.raises(ConfigError, match=r"broker\.cert_file"):
        device_identity(BrokerConfig(host="b", cert_file=cert, key_file=tmp_path / "k"), source="agent.toml")


def test_unreadable_certificate_is_a_config_error(tmp_path: Path) -> None:
    """A certificate file that is missing or not PEM stops start-up naming broker.cert_file."""
    (tmp_path / "bad.pem").write_text("not a certificate")
    for path in (tmp_path / "missing.pem", tmp_path / "bad.pem"):
        with pytest.raises(ConfigError, match=r"broker\.cert_file"):
            device_identity(BrokerConfig(host="b", cert_file=path, key_file=tmp_path / "k"))


def test_identity_travels_in_the_topic_never_in_the_report(make_agent: Callable[..., Agent], clock: FakeClock) -> None:
    """Reports go to <prefix>/<identity>/<use_case>; the payload holds no identity (docs/design.md, invariant 4)."""
    agent = make_agent(device_identity="dev-7f3a")
    agent.grant_consent()
    agent.record("flag", 1)
    clock.set(clock.time() + DAY)
    agent.collect()
    (pending,) = agent.outbox()
    assert pending.topic == "ldp/v1/reports/dev-7f3a/flag"
    assert b"dev-7f3a" not in pending.entry.payload
    report = decode_report(pending.entry.payload, agent.registry)
    assert report.use_case.name == "flag"
