"""Encrypted, atomically written state files (AES-256-GCM).

A sealed file is ``b"LDPS" | format byte | 12-byte nonce | ciphertext and tag`` over a
msgpack document. The associated data binds the file's *purpose* (``"usecase:<name>"``,
``"outbox"``, ``"ledger"``, ...) and the document's schema *version*, so a file copied over
another one, or read by code expecting another schema, fails authentication instead of being
misread. Every write is atomic: a temporary file in the same directory is written and
fsynced, renamed over the target, and the directory is fsynced, so a crash at any moment
leaves either the old or the new contents, never a torn file.

The key is 32 bytes from a file only its owner can read (mode 0600 or 0400) or from a
systemd credential (``$CREDENTIALS_DIRECTORY/<name>``). Nonces come from the OS CSPRNG
always (never from an injected seeded source): a repeated nonce under one key would break
GCM. They are read from it a few kilobytes at a time (:class:`_NoncePool`) rather than with
one system call per file written, and a forked child never reuses its parent's unread bytes.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgpack

from agent.aes_gcm import InvalidTagError, aes_gcm
from agent.errors import KeyUnavailableError, StateUnreadableError, StateWriteError
from protocol.plain import Plain
from runtime.errors import SettingFileError
from runtime.secret_files import credential_path, read_secret_file

__all__ = ["KEY_BYTES", "Sealer", "atomic_write", "create_key_file", "fsync_directory", "load_key"]

KEY_BYTES = 32
_MAGIC = b"LDPS"
_FORMAT = 1
_NONCE = 12
_HEADER = len(_MAGIC) + 1 + _NONCE
MAX_FILE_BYTES = 256 * 1024 * 1024
"""A sealed file larger than this is refused rather than read into memory."""
_NONCES_PER_READ = 341
"""Nonces read from the OS CSPRNG at once (4,092 bytes)."""


class _NoncePool:
    """Fresh 12-byte nonces, each handed out once, from bytes read from the OS CSPRNG in blocks.

    The bytes are the same ``os.urandom`` output a read per nonce would give, only fetched
    for several nonces at a time: a seal is a few microseconds of AES-GCM, and the system call
    per nonce had cost more than the encryption. Unread bytes are dropped in a forked child
    (``os.register_at_fork``), so parent and child never hand out the same nonce.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._block = b""
        self._at = 0
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._lock = threading.Lock()  # a lock held by another thread at the fork stays held in the child
        self._block = b""
        self._at = 0

    def take(self) -> bytes:
        """The next unused nonce."""
        with self._lock:
            at = self._at
            if at + _NONCE > len(self._block):
                self._block = os.urandom(_NONCE * _NONCES_PER_READ)
                at = 0
            self._at = at + _NONCE
            return self._block[at : at + _NONCE]


_NONCES = _NoncePool()


def _parse_key(raw: bytes, where: str) -> bytes:
    if len(raw) == KEY_BYTES:
        return raw
    text = raw.strip()
    if len(text) == 2 * KEY_BYTES:
        try:
            return bytes.fromhex(text.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            pass
    raise KeyUnavailableError(
        f"{where}: a key is {KEY_BYTES} raw bytes or {2 * KEY_BYTES} hex digits; found {len(raw)} bytes"
    )


def load_key(*, key_file: Path | None, key_credential: str | None, environ: Mapping[str, str] | None = None) -> bytes:
    """Load the 32-byte state key from a private file or a systemd credential.

    The file rules (owner only, no symbolic link, credentials left to systemd) are
    :mod:`runtime.secret_files`'s, the same as for broker passwords.

    Raises:
        KeyUnavailableError: missing, readable by others, not owned by this user, or the wrong size.
    """
    try:
        if key_credential is not None:
            path = credential_path(key_credential, setting="key_credential", environ=environ)
        else:
            assert key_file is not None
            path = key_file
        raw = read_secret_file(path, setting="key_file", what="key file", environ=environ)
    except SettingFileError as e:
        raise KeyUnavailableError(e.problem) from None
    return _parse_key(raw, str(path))


def create_key_file(path: Path) -> bool:
    """Create ``path`` with a fresh key (mode 0600) unless it exists. Returns True if created."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return False
    try:
        os.write(fd, os.urandom(KEY_BYTES))  # the OS CSPRNG, as secrets.token_bytes reads it
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_directory(path.parent)
    return True


def fsync_directory(directory: Path) -> None:
    """fsync a directory, so a rename or unlink inside it is durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_WRITE_HINTS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is exhausted",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.ENOENT: "the directory does not exist",
}
"""What a failed state write's errno means, in the words the error gives."""


def _write_error(path: Path, directory: Path, e: OSError) -> StateWriteError:
    """The error of a write to ``path`` in the state ``directory`` that failed with ``e``."""
    hint = _WRITE_HINTS.get(e.errno or 0, e.strerror or type(e).__name__)
    return StateWriteError(
        str(path),
        f"{hint} (state directory {directory}); the previous state is kept and nothing of this change "
        "was recorded: free space or fix the directory, then retry",
    )


def atomic_write(path: Path, data: bytes, *, sync_directory: bool = True) -> None:
    """Replace ``path`` with ``data``: temp file, fsync, rename, fsync of the directory.

    ``sync_directory=False`` leaves the last step to the caller, who writes several files and
    makes their renames durable with one :func:`fsync_directory` (:func:`agent.transaction.commit`):
    until then a crash may keep the previous file, never a partial one.

    Raises:
        StateWriteError: the file cannot be written (no space left, a read-only or missing
            state directory, ...), naming the file, its directory and the cause; the
            previous file is left as it was.
    """
    # os.urandom is what secrets.token_hex reads; importing secrets (random, base64, hmac) cost
    # every command that opens the state a few milliseconds.
    tmp = path.with_name(f".{path.name}.{os.urandom(6).hex()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        if sync_directory:
            fsync_directory(path.parent)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise _write_error(path, path.parent, e) from e
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


class Sealer:
    """Seals and opens state documents with one key.

    Args:
        key: the 32-byte AES-256 key.
    """

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise KeyUnavailableError(f"a state key is {KEY_BYTES} bytes; got {len(key)}")
        self._aead = aes_gcm(key)

    @staticmethod
    def _aad(purpose: str, version: int) -> bytes:
        return b"ldp-agent-state\x00" + purpose.encode("utf-8") + b"\x00v" + str(version).encode("ascii")

    def seal(self, purpose: str, version: int, document: Plain) -> bytes:
        """Encrypt a msgpack-ready document for ``purpose`` at schema ``version``."""
        nonce = _NONCES.take()
        plain = msgpack.packb(document, use_bin_type=True)
        return _MAGIC + bytes([_FORMAT]) + nonce + self._aead.encrypt(nonce, plain, self._aad(purpose, version))

    def open(self, purpose: str, version: int, blob: bytes, *, where: str = "<memory>") -> Any:
        """Decrypt and decode a document sealed by :meth:`seal`.

        Raises:
            StateUnreadableError: wrong magic or format, failed authentication (wrong key, another
                file's purpose or version, any flipped byte) or undecodable contents.
        """
        if len(blob) < _HEADER + 16 or blob[: len(_MAGIC)] != _MAGIC:
            raise StateUnreadableError(where, "not a sealed agent state file (bad header)")
        if blob[len(_MAGIC)] != _FORMAT:
            raise StateUnreadableError(where, f"unknown sealed format {blob[len(_MAGIC)]}")
        nonce = blob[len(_MAGIC) + 1 : _HEADER]
        try:
            plain = self._aead.decrypt(nonce, blob[_HEADER:], self._aad(purpose, version))
        except InvalidTagError:
            raise StateUnreadableError(
                where, f"authentication failed (wrong key, not the {purpose!r} v{version} file, or modified)"
            ) from None
        try:
            return msgpack.unpackb(plain, raw=False, strict_map_key=False)
        except (ValueError, msgpack.UnpackException) as e:
            raise StateUnreadableError(where, f"contents do not decode: {e}") from None

    def read(self, path: Path, purpose: str, version: int) -> Any | None:
        """The document in ``path``, or None when the file does not exist.

        Raises:
            StateUnreadableError: as :meth:`open`, or when the file cannot be read.
        """
        try:
            with path.open("rb") as fh:
                blob = fh.read(MAX_FILE_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StateUnreadableError(str(path), f"cannot read: {e.strerror}") from None
        if len(blob) > MAX_FILE_BYTES:
            raise StateUnreadableError(str(path), f"larger than {MAX_FILE_BYTES} bytes")
        return self.open(purpose, version, blob, where=str(path))

    def sync(self, directory: Path) -> None:
        """Make the renames of the files written into ``directory`` with ``sync_directory=False``
        durable (:func:`fsync_directory`).

        Raises:
            StateWriteError: the directory cannot be synced, said as :func:`atomic_write` says it.
        """
        try:
            fsync_directory(directory)
        except OSError as e:
            raise _write_error(directory, directory, e) from e

    def write(self, path: Path, purpose: str, version: int, document: Plain, *, sync_directory: bool = True) -> None:
        """Seal ``document`` and atomically replace ``path`` with it (``sync_directory``: :func:`atomic_write`)."""
        atomic_write(path, self.seal(purpose, version, document), sync_directory=sync_directory)
