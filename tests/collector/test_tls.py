"""The subscriber over TLS with a user name and password file, against a real Mosquitto."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import shutil
import ssl
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from collector.config import MqttConfig, TlsConfig
from collector.errors import ConfigError, TransportError
from collector.mqtt import MqttTransport
from collector.mqtt.tls import broker_tls_context
from tests.collector.support import run_async
from tests.support.broker import free_port, running_broker

PASSWD = shutil.which("mosquitto_passwd")


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )


def _make_pki(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a broker certificate for 127.0.0.1 (test-only keys, made fresh)."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("ldp test CA"))
        .issuer_name(_name("ldp test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("broker"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (directory / "broker.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, directory / "broker.key")
    return directory / "ca.pem", directory / "broker.pem", directory / "broker.key"


@pytest.mark.skipif(PASSWD is None, reason="mosquitto_passwd is not installed")
@run_async
async def test_tls_with_password_subscribes_and_a_wrong_password_is_fatal(tmp_path: Path) -> None:
    """Over TLS (CA-verified, 127.0.0.1 in the certificate) the right password subscribes; a wrong one stops us."""
    assert PASSWD is not None
    ca, cert, key = _make_pki(tmp_path / "pki")
    passwords = tmp_path / "passwd"
    subprocess.run([PASSWD, "-c", "-b", str(passwords), "collector", "s3cret"], check=True, capture_output=True)
    tls_port = free_port()
    extra = f"password_file {passwords}\nlistener {tls_port} 127.0.0.1\ncafile {ca}\ncertfile {cert}\nkeyfile {key}\n"
    good = tmp_path / "good.password"
    good.write_text("s3cret\n", encoding="utf-8")
    bad = tmp_path / "bad.password"
    bad.write_text("wrong", encoding="utf-8")
    for secret in (good, bad):
        secret.chmod(0o600)  # a password file is readable by its owner only
    with running_broker(tmp_path / "broker", extra_config=extra) as broker:
        base = MqttConfig(
            host=broker.host, port=tls_port, client_id="tls-collector", username="collector", tls=TlsConfig(ca_file=ca)
        )
        transport = MqttTransport(replace(base, password_file=good))
        runner = asyncio.create_task(transport.run())
        try:
            await asyncio.wait_for(transport.wait_subscribed(), 60)
            assert transport.statistics().connected
        finally:
            await transport.close()
            await asyncio.wait_for(runner, 60)
        refused = MqttTransport(replace(base, password_file=bad, client_id="tls-2"))
        with pytest.raises(TransportError, match=r"not authorized|bad user name or password"):
            await asyncio.wait_for(refused.run(), 60)
        # A client that does not trust the broker's CA never gets as far as MQTT.
        untrusting = replace(base, tls=TlsConfig())
        with pytest.raises(ssl.SSLCertVerificationError):
            await asyncio.open_connection(broker.host, tls_port, ssl=broker_tls_context(untrusting))


@run_async
async def test_a_reconnect_reuses_the_tls_context_built_at_start_and_reads_no_file(tmp_path: Path) -> None:
    """The CA file deleted while connected: the next reconnect still succeeds, with the context built at start."""
    ca, cert, key = _make_pki(tmp_path / "pki")
    tls_port = free_port()
    extra = f"allow_anonymous true\nlistener {tls_port} 127.0.0.1\ncafile {ca}\ncertfile {cert}\nkeyfile {key}\n"
    with running_broker(tmp_path / "broker", extra_config=extra) as broker:
        config = MqttConfig(
            host=broker.host,
            port=tls_port,
            client_id="tls-gone",
            tls=TlsConfig(ca_file=ca, source="collector.toml"),
            reconnect_min_s=0.01,
        )
        transport = MqttTransport(config)
        runner = asyncio.create_task(transport.run())
        try:
            await asyncio.wait_for(transport.wait_subscribed(), 60)
            ca.unlink()  # a reconnect that read it again would fail (and once ended the service)
            writer = transport._writer
            assert writer is not None
            writer.transport.abort()  # the connection drops; the transport reconnects
            deadline = asyncio.get_running_loop().time() + 60
            while transport.statistics().connects < 2 or not transport.statistics().connected:
                assert not runner.done(), runner.exception()
                assert asyncio.get_running_loop().time() < deadline, "no reconnect within 60 s"
                await asyncio.sleep(0.01)
        finally:
            await transport.close()
            await asyncio.wait_for(runner, 60)


def test_a_ca_file_that_cannot_be_read_at_start_is_a_config_error_naming_it(tmp_path: Path) -> None:
    """Missing at start-up: the session is never made, and the error names the field and the file."""
    missing = tmp_path / "gone.pem"
    tls = TlsConfig(ca_file=missing, source="collector.toml")
    config = MqttConfig(host="127.0.0.1", port=1, client_id="x", tls=tls)
    with pytest.raises(ConfigError) as caught:
        MqttTransport(config)
    message = str(caught.value)
    assert message.startswith("collector.toml: mqtt.tls.ca_file: cannot read ")
    assert str(missing) in message
    assert "No such file or directory" in message
