"""Secret files: the same rules for agent and collector (owner only, credentials, one line, no trailing newline)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runtime.errors import SettingFileError
from runtime.secret_files import credential_path, read_password, read_secret_file


def _secret(path: Path, data: bytes, mode: int = 0o600) -> Path:
    path.write_bytes(data)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("data", [b"s3cret", b"s3cret\n", b"s3cret\r\n", b"s3cret\n\n"])
def test_a_password_is_the_file_without_trailing_line_ends(tmp_path: Path, data: bytes) -> None:
    """echo and editors add a newline; it is not part of the password."""
    assert read_password(_secret(tmp_path / "p", data), setting="password_file") == b"s3cret"


@pytest.mark.parametrize(
    ("data", "mode", "words"),
    [
        (b"\n", 0o600, "is empty"),
        (b"one\ntwo\n", 0o600, "more than one line"),
        (b"s3cret\n", 0o644, "chmod 600"),
        (b"s3cret\n", 0o640, "readable by its owner only"),
    ],
)
def test_bad_password_files_are_refused_naming_the_file(tmp_path: Path, data: bytes, mode: int, words: str) -> None:
    """Empty, several lines, or readable by others: refused with the setting, the file and the fix."""
    path = _secret(tmp_path / "p", data, mode)
    with pytest.raises(SettingFileError, match=words) as info:
        read_password(path, setting="password_file")
    assert info.value.setting == "password_file"
    assert str(path) in info.value.problem


def test_missing_file_symlink_and_directory(tmp_path: Path) -> None:
    """A missing file, a symbolic link and a directory are refused, each saying why."""
    with pytest.raises(SettingFileError, match="No such file or directory"):
        read_secret_file(tmp_path / "none", setting="key_file")
    target = _secret(tmp_path / "target", b"x")
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(SettingFileError, match="cannot open"):
        read_secret_file(tmp_path / "link", setting="key_file")
    with pytest.raises(SettingFileError, match="not a regular file"):
        read_secret_file(tmp_path, setting="key_file")


def test_systemd_credentials(tmp_path: Path) -> None:
    """A credential is $CREDENTIALS_DIRECTORY/<name>; its mode is systemd's business; no directory, a clear error."""
    env = {"CREDENTIALS_DIRECTORY": str(tmp_path)}
    path = credential_path("broker-password", setting="password_credential", environ=env)
    assert path == tmp_path / "broker-password"
    _secret(path, b"s3cret\n", 0o444)  # as systemd may hand it over: not checked for its mode
    assert read_password(path, setting="password_file", environ=env) == b"s3cret"
    with pytest.raises(SettingFileError, match="chmod 600"):
        read_password(path, setting="password_file", environ={})
    with pytest.raises(SettingFileError, match=r"CREDENTIALS_DIRECTORY is not set"):
        credential_path("broker-password", setting="password_credential", environ={})


def test_a_file_of_another_user_is_refused(tmp_path: Path) -> None:
    """A private file owned by someone else (only root can read one) is refused."""
    if os.geteuid() != 0:
        pytest.skip("only root can read a 0600 file owned by another user")
    path = _secret(tmp_path / "p", b"s3cret")
    os.chown(path, 65534, 65534)
    with pytest.raises(SettingFileError, match="owned by uid 65534"):
        read_secret_file(path, setting="password_file")
