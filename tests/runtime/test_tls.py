"""The TLS client context: each bad file is named with its setting, before ssl sees it."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from runtime.errors import SettingFileError
from runtime.tls import client_context
from tests.collector.test_tls import _make_pki


def test_a_good_context_verifies_and_needs_tls_1_2(tmp_path: Path) -> None:
    """With a CA, a client certificate and its key: a verifying context, TLS 1.2 at least."""
    ca, cert, key = _make_pki(tmp_path)
    ctx = client_context(ca_file=ca, cert_file=cert, key_file=key)
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert ctx.check_hostname
    assert ctx.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert client_context().verify_mode == ssl.CERT_REQUIRED  # the system trust store


@pytest.mark.parametrize(
    ("setting", "content", "words"),
    [
        ("ca_file", b"not a certificate\n", "holds no PEM CA certificate"),
        ("cert_file", b"not a certificate\n", "is not a PEM certificate"),
        ("key_file", b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", "unencrypted PEM private key"),
        ("ca_file", None, "No such file or directory"),
        ("cert_file", None, "No such file or directory"),
        ("key_file", None, "No such file or directory"),
    ],
)
def test_each_bad_file_is_named(tmp_path: Path, setting: str, content: bytes | None, words: str) -> None:
    """A missing or wrong CA, certificate or key: SettingFileError naming the setting and the file."""
    files = dict(zip(("ca_file", "cert_file", "key_file"), _make_pki(tmp_path), strict=True))
    if content is None:
        files[setting].unlink()
    else:
        files[setting].write_bytes(content)
    with pytest.raises(SettingFileError, match=words) as info:
        client_context(**files)
    assert info.value.setting == setting
    assert str(files[setting]) in info.value.problem


def test_a_key_of_another_certificate_and_a_key_without_certificate(tmp_path: Path) -> None:
    """A key that does not match the certificate names key_file; a key alone is refused."""
    ca, cert, _ = _make_pki(tmp_path / "a")
    _, _, other_key = _make_pki(tmp_path / "b")
    with pytest.raises(SettingFileError, match="is not the private key of") as info:
        client_context(ca_file=ca, cert_file=cert, key_file=other_key)
    assert info.value.setting == "key_file"
    with pytest.raises(SettingFileError, match="needs the cert_file"):
        client_context(key_file=other_key)
    with pytest.raises(SettingFileError, match="holds no private key") as info:
        client_context(ca_file=ca, cert_file=cert)
    assert info.value.setting == "cert_file"
