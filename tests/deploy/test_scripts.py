"""deploy/make-test-ca.sh and deploy/make-broker-users.sh: what they make, that a second run
changes nothing, and that an existing CA is only ever replaced on request; deploy/install.sh
refuses bad arguments before it touches anything (tests/deploy/test_container.py runs it)."""

from __future__ import annotations

import ipaddress
import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.deploy.conftest import Clients
from tests.deploy.secure_broker import DEPLOY, make_pki, make_users

CA_SCRIPT = DEPLOY / "make-test-ca.sh"
USERS_SCRIPT = DEPLOY / "make-broker-users.sh"
INSTALL_SCRIPT = DEPLOY / "install.sh"


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def _run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=60, check=False)


def _issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


# --- make-test-ca.sh ------------------------------------------------------------------------


def test_ca_broker_and_client_certificates(pki: Path) -> None:
    """The CA signs a serverAuth broker certificate for localhost, 127.0.0.1 and ::1 and clientAuth client ones."""
    ca = _cert(pki / "ca.pem")
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca

    broker = _cert(pki / "broker.pem")
    assert _issued_by(broker, ca)
    names = broker.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    assert set(names.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    }
    usage = broker.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]

    for name in ("devices", "collector"):
        client = _cert(pki / f"{name}.pem")
        assert _issued_by(client, ca)
        assert client.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == name
        usage = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]

    for path in pki.iterdir():
        mode = path.stat().st_mode & 0o777
        assert mode == (0o600 if path.suffix == ".key" else 0o644), f"{path.name} has mode {mode:o}"


def test_second_run_changes_nothing(tmp_path: Path) -> None:
    """Running make-test-ca.sh again keeps every file byte for byte."""
    pki = make_pki(tmp_path / "pki")
    before = _snapshot(pki)
    make_pki(pki)
    assert _snapshot(pki) == before


def test_existing_ca_is_reused_for_missing_certificates(tmp_path: Path) -> None:
    """A deleted broker certificate is reissued under the same CA; the other files stay as they were."""
    pki = make_pki(tmp_path / "pki")
    before = _snapshot(pki)
    (pki / "broker.pem").unlink()
    make_pki(pki)
    after = _snapshot(pki)
    assert {k: v for k, v in after.items() if not k.startswith("broker.")} == {
        k: v for k, v in before.items() if not k.startswith("broker.")
    }
    assert after["broker.pem"] != before["broker.pem"]
    assert _issued_by(_cert(pki / "broker.pem"), _cert(pki / "ca.pem"))


@pytest.mark.parametrize("damage", ["no-ca-cert", "no-ca-key", "foreign-ca-key"])
def test_damaged_ca_is_never_overwritten_without_the_flag(tmp_path: Path, damage: str) -> None:
    """Half a CA, or a CA key that does not match its certificate, stops the script and touches nothing."""
    pki = make_pki(tmp_path / "pki")
    if damage == "no-ca-cert":
        (pki / "ca.pem").unlink()
    elif damage == "no-ca-key":
        (pki / "ca.key").unlink()
    else:
        other = make_pki(tmp_path / "other")
        (pki / "ca.key").write_bytes((other / "ca.key").read_bytes())
    before = _snapshot(pki)
    done = _run(CA_SCRIPT, pki)
    assert done.returncode != 0
    assert "--new-ca" in done.stderr
    assert _snapshot(pki) == before


def test_new_ca_flag_replaces_the_ca_and_reissues(tmp_path: Path) -> None:
    """--new-ca makes a new CA and reissues the broker and client certificates under it."""
    pki = make_pki(tmp_path / "pki")
    before = _snapshot(pki)
    make_pki(pki, "--new-ca")
    after = _snapshot(pki)
    assert all(after[name] != before[name] for name in before)
    ca = _cert(pki / "ca.pem")
    assert all(_issued_by(_cert(pki / f"{n}.pem"), ca) for n in ("broker", "devices", "collector"))


def test_extra_broker_host_reissues_only_the_broker(tmp_path: Path) -> None:
    """--broker-host adds DNS and IP names to the broker certificate; client certificates are kept."""
    pki = make_pki(tmp_path / "pki")
    before = _snapshot(pki)
    make_pki(pki, "--broker-host", "telemetry.example.org", "--broker-host", "192.0.2.7")
    after = _snapshot(pki)
    names = _cert(pki / "broker.pem").extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(names.get_values_for_type(x509.DNSName)) == {"localhost", "telemetry.example.org"}
    assert ipaddress.ip_address("192.0.2.7") in names.get_values_for_type(x509.IPAddress)
    assert after["devices.pem"] == before["devices.pem"]
    assert after["ca.pem"] == before["ca.pem"]


@pytest.mark.parametrize(
    "args",
    [("--client", "../escape"), ("--client", "ca"), ("--days", "0"), ("--unknown",), ()],
    ids=["path-in-name", "reserved-name", "zero-days", "unknown-option", "no-directory"],
)
def test_ca_script_refuses_bad_arguments(tmp_path: Path, args: tuple[str, ...]) -> None:
    """Bad arguments stop make-test-ca.sh with a non-zero status before it writes anything."""
    target = tmp_path / "pki"
    done = _run(CA_SCRIPT, *args, *([target] if args else []))
    assert done.returncode != 0
    assert not target.exists()


def test_broker_certificate_matches_localhost(clients: Clients) -> None:
    """A client dialling "localhost" with host-name checking accepts the broker's certificate."""
    probe = clients.probe(user="devices", password=clients.broker.passwords["devices"], host="localhost")
    assert probe.connect().accepted


# --- make-broker-users.sh -------------------------------------------------------------------


def test_users_script_makes_private_random_passwords(tmp_path: Path) -> None:
    """Each user gets a 0600 secret of 43 base64url characters (no newline) and a PBKDF2 line in the password file."""
    passwords = make_users(tmp_path / "passwd", tmp_path / "secrets", ("devices", "collector"))
    assert len(set(passwords.values())) == 2
    for name, password in passwords.items():
        secret = tmp_path / "secrets" / f"{name}.password"
        assert secret.stat().st_mode & 0o777 == 0o600
        assert len(password) == 43
        assert set(password) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    lines = (tmp_path / "passwd").read_text(encoding="utf-8").splitlines()
    assert [ln.split(":", 1)[0] for ln in lines] == ["devices", "collector"]
    assert all(ln.split(":", 1)[1].startswith("$7$") for ln in lines)  # mosquitto's PBKDF2-SHA512
    text = (tmp_path / "passwd").read_text(encoding="utf-8")
    assert not any(p in text for p in passwords.values())
    assert (tmp_path / "passwd").stat().st_mode & 0o777 == 0o600


def test_users_script_keeps_secrets_and_other_users(tmp_path: Path) -> None:
    """A second run reuses the existing secrets and keeps password-file lines of users it does not manage."""
    first = make_users(tmp_path / "passwd", tmp_path / "secrets", ("devices", "collector"))
    other = "operator:$7$101$c2FsdA==$aGFzaA=="
    with (tmp_path / "passwd").open("a", encoding="utf-8") as f:
        f.write(other + "\n")
    second = make_users(tmp_path / "passwd", tmp_path / "secrets", ("devices", "collector"))
    assert second == first
    lines = (tmp_path / "passwd").read_text(encoding="utf-8").splitlines()
    assert [ln.split(":", 1)[0] for ln in lines] == ["devices", "collector", "operator"]
    assert other in lines


def test_users_script_refuses_a_colon_in_a_secret(tmp_path: Path) -> None:
    """A supplied secret containing ':' (which the password file cannot hold) is refused; nothing is written."""
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "devices.password").write_text("pass:word", encoding="utf-8")
    done = _run(USERS_SCRIPT, "--user", "devices", tmp_path / "passwd", tmp_path / "secrets")
    assert done.returncode != 0
    assert "':'" in done.stderr
    assert not (tmp_path / "passwd").exists()


# --- install.sh -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        ((), 2, "Usage: deploy/install.sh"),
        (("server",), 2, "Usage: deploy/install.sh"),
        (("agent", "collector"), 2, "Usage: deploy/install.sh"),
        (("--pki",), 2, "Usage: deploy/install.sh"),
        (("--bogus", "agent"), 1, "unknown option --bogus"),
        (("--broker-host", "a b;reboot", "agent"), 1, "--broker-host 'a b;reboot' is not a host name"),
    ],
)
def test_install_script_refuses_bad_arguments(args: tuple[str, ...], status: int, message: str) -> None:
    """A wrong role, option or host name stops the script with a message, before any check or change."""
    done = _run(INSTALL_SCRIPT, *args)
    assert done.returncode == status, done.stderr
    assert message in done.stderr
