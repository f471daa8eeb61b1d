"""Secrets read from files: broker passwords, state keys, systemd credentials.

One set of rules for the agent and the collector:

* A secret file is opened without following a symbolic link at its last component, must be
  a regular file, owned by this user and readable by nobody else (mode 0600 or 0400): a
  password or key that other local users can read is no secret. The message says the
  ``chmod`` that fixes it.
* A file in ``$CREDENTIALS_DIRECTORY`` (systemd's ``LoadCredential=`` /
  ``SetCredentialEncrypted=``) is systemd's to protect: it lives on a private, read-only
  mount, owned by whoever systemd chose, so only its presence and contents are checked.
* A password is the file's bytes without trailing line ends (``echo`` and editors add
  one); an empty password, or one with a line break inside, is refused rather than
  guessed at.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from runtime.errors import SettingFileError
from runtime.resources import RESOURCE_ERRNOS, ResourceShortageError

__all__ = ["MAX_SECRET_BYTES", "credential_path", "read_password", "read_secret_file"]

MAX_SECRET_BYTES = 64 * 1024
"""A secret file larger than this is refused rather than read (no password or key is that long)."""


def credential_path(name: str, *, setting: str, environ: Mapping[str, str] | None = None) -> Path:
    """The path of the systemd credential ``name`` (``$CREDENTIALS_DIRECTORY/<name>``).

    Raises:
        SettingFileError: ``$CREDENTIALS_DIRECTORY`` is not set (not started by systemd with credentials).
    """
    env = os.environ if environ is None else environ
    directory = env.get("CREDENTIALS_DIRECTORY")
    if not directory:
        raise SettingFileError(
            setting,
            f"{setting} = {name!r} but $CREDENTIALS_DIRECTORY is not set "
            "(run under systemd with LoadCredential= or SetCredentialEncrypted=)",
        )
    return Path(directory) / name


def _in_credentials(path: Path, environ: Mapping[str, str] | None) -> bool:
    env = os.environ if environ is None else environ
    directory = env.get("CREDENTIALS_DIRECTORY")
    return directory is not None and directory != "" and path.parent == Path(directory)


def read_secret_file(
    path: Path, *, setting: str, what: str = "secret file", environ: Mapping[str, str] | None = None
) -> bytes:
    """The bytes of a secret file, after the checks above.

    Args:
        path: the file.
        setting: the setting naming it (for the error).
        what: how a message calls it (``"key file"``, ``"password file"``).
        environ: where ``$CREDENTIALS_DIRECTORY`` is looked up (default: the process's).

    Raises:
        SettingFileError: missing, unreadable, not a regular file, readable by others, owned
            by another user, or larger than :data:`MAX_SECRET_BYTES`.
        ResourceShortageError: it could not be opened for want of a system resource.
    """
    credential = _in_credentials(path, environ)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | (0 if credential else os.O_NOFOLLOW))
    except OSError as e:
        if e.errno in RESOURCE_ERRNOS:
            # Not the file's fault: the process or the system ran out of something; retried.
            raise ResourceShortageError(f"opening {what} {path}", e) from e
        raise SettingFileError(setting, f"cannot open {what} {path}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SettingFileError(setting, f"{what} {path} is not a regular file")
        if not credential:
            if st.st_mode & 0o077:
                raise SettingFileError(
                    setting,
                    f"{what} {path} has mode {stat.S_IMODE(st.st_mode):04o}; it must be readable by its owner "
                    f"only (chmod 600 {path})",
                )
            if st.st_uid != os.geteuid():
                raise SettingFileError(
                    setting, f"{what} {path} is owned by uid {st.st_uid}, not by this user ({os.geteuid()})"
                )
        if st.st_size > MAX_SECRET_BYTES:
            raise SettingFileError(setting, f"{what} {path} holds {st.st_size} bytes; a secret is at most 64 KiB")
        try:
            return os.read(fd, MAX_SECRET_BYTES + 1)
        except OSError as e:
            raise SettingFileError(setting, f"cannot read {path}: {e.strerror or e}") from None
    finally:
        os.close(fd)


def read_password(path: Path, *, setting: str, environ: Mapping[str, str] | None = None) -> bytes:
    """A password from a secret file: its bytes without trailing line ends.

    Raises:
        SettingFileError: as :func:`read_secret_file`; or the password is empty or spans lines.
    """
    password = read_secret_file(path, setting=setting, what="password file", environ=environ).rstrip(b"\r\n")
    if not password:
        raise SettingFileError(setting, f"{path} is empty")
    if b"\n" in password or b"\r" in password:
        raise SettingFileError(setting, f"{path} holds more than one line; a password file holds the password only")
    return password
