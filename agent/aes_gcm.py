"""AES-256-GCM for the sealed state (agent/sealed.py), through the libcrypto the interpreter already has.

The cryptography package's AES-GCM brings a second, statically linked OpenSSL with it: megabytes
of a device's memory for one cipher (docs/benchmarks.md, "Imports a device defers or avoids";
docs/deploy.md, "The device's footprint"), while Python's
own ``ssl`` and ``hashlib`` are linked against the system's libcrypto, which the daemon maps
anyway. :func:`aes_gcm` calls that library's EVP interface through ctypes: plain calls and no
callbacks, so nothing needs memory both writable and executable and the unit's
``MemoryDenyWriteExecute=yes`` holds. Where neither libcrypto 3 nor 1.1 can be loaded it uses
the cryptography package, which stays a dependency of the agent. Both give the same bytes: GCM
is a function of the key, the nonce, the associated data and the plaintext
(tests/agent/test_aes_gcm.py holds the two to each other).
"""

from __future__ import annotations

import ctypes
import functools
import threading
from typing import Any, Protocol

__all__ = ["TAG_BYTES", "Cipher", "InvalidTagError", "aes_gcm", "libcrypto_loaded", "package_aes_gcm"]

TAG_BYTES = 16
_SONAMES = ("libcrypto.so.3", "libcrypto.so.1.1")
_CTRL_SET_IVLEN = 0x9  # EVP_CTRL_GCM_SET_IVLEN (openssl/evp.h)
_CTRL_GET_TAG = 0x10  # EVP_CTRL_GCM_GET_TAG
_CTRL_SET_TAG = 0x11  # EVP_CTRL_GCM_SET_TAG
_MAX_BYTES = 1 << 30  # the EVP lengths are C ints


class InvalidTagError(Exception):
    """Authentication failed: another key, nonce or associated data, or modified bytes."""


class Cipher(Protocol):
    """AES-256-GCM under one key; the ciphertext carries its 16-byte tag at the end."""

    def encrypt(self, nonce: bytes, data: bytes, aad: bytes) -> bytes:
        """``data`` encrypted, followed by the tag over it and ``aad``."""
        ...

    def decrypt(self, nonce: bytes, data: bytes, aad: bytes) -> bytes:
        """The plaintext of ``data`` (ciphertext and tag).

        Raises:
            InvalidTagError: the tag does not authenticate ``data`` and ``aad``.
        """
        ...


def _declare(lib: ctypes.CDLL) -> None:
    """The signatures of the EVP functions used (without them ctypes would pass pointers as C ints)."""
    ptr, num, text = ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p
    count = ctypes.POINTER(ctypes.c_int)
    lib.EVP_CIPHER_CTX_new.restype = ptr
    lib.EVP_CIPHER_CTX_new.argtypes = []
    lib.EVP_CIPHER_CTX_free.restype = None
    lib.EVP_CIPHER_CTX_free.argtypes = [ptr]
    lib.EVP_aes_256_gcm.restype = ptr
    lib.EVP_aes_256_gcm.argtypes = []
    lib.EVP_CIPHER_CTX_ctrl.restype = num
    lib.EVP_CIPHER_CTX_ctrl.argtypes = [ptr, num, num, ptr]
    for direction in ("Encrypt", "Decrypt"):
        init = getattr(lib, f"EVP_{direction}Init_ex")
        init.restype, init.argtypes = num, [ptr, ptr, ptr, text, text]
        update = getattr(lib, f"EVP_{direction}Update")
        update.restype, update.argtypes = num, [ptr, ptr, count, text, num]
        final = getattr(lib, f"EVP_{direction}Final_ex")
        final.restype, final.argtypes = num, [ptr, ptr, count]
    lib.ERR_clear_error.restype = None
    lib.ERR_clear_error.argtypes = []


@functools.cache
def _libcrypto() -> ctypes.CDLL | None:
    """The system's libcrypto with the EVP functions declared, or None where none loads."""
    for name in _SONAMES:
        try:
            lib = ctypes.CDLL(name)
            _declare(lib)
        except (OSError, AttributeError):
            continue
        return lib
    return None


def libcrypto_loaded() -> bool:
    """Whether :func:`aes_gcm` uses the system's libcrypto (False: the cryptography package)."""
    return _libcrypto() is not None


def _ok(result: int, call: str, lib: ctypes.CDLL) -> None:
    if result != 1:
        lib.ERR_clear_error()  # the thread's queue is shared with Python's ssl and hashlib
        raise RuntimeError(f"libcrypto: {call} failed")


class _LibcryptoGcm:
    """AES-256-GCM through the EVP interface of the system's libcrypto.

    One context per direction, keyed once, takes each message's nonce: a seal or an open is six
    foreign calls instead of a dozen, and the key schedule is not computed again for every file
    a collection cycle writes. A lock keeps a context to one message at a time.
    """

    def __init__(self, lib: ctypes.CDLL, key: bytes) -> None:
        self._contexts: list[int] = []  # first: __del__ reads it even if this fails
        self._lib = lib
        self._lock = threading.Lock()
        cipher = lib.EVP_aes_256_gcm()  # a static table of the library: never freed
        try:
            self._encrypting = self._keyed(lib.EVP_EncryptInit_ex, "EVP_EncryptInit_ex", cipher, bytes(key))
            self._decrypting = self._keyed(lib.EVP_DecryptInit_ex, "EVP_DecryptInit_ex", cipher, bytes(key))
        except BaseException:
            self._free()
            raise

    def _keyed(self, init: Any, name: str, cipher: int, key: bytes) -> int:
        """A new context of ``init``'s direction holding ``key``; freed with this object."""
        lib = self._lib
        ctx: int | None = lib.EVP_CIPHER_CTX_new()
        if not ctx:
            raise MemoryError("libcrypto: EVP_CIPHER_CTX_new failed")
        self._contexts.append(ctx)
        _ok(init(ctx, cipher, None, None, None), name, lib)
        _ok(init(ctx, None, None, key, None), name, lib)
        return ctx

    def _free(self) -> None:
        while self._contexts:
            self._lib.EVP_CIPHER_CTX_free(self._contexts.pop())  # also wipes the key schedule

    def __del__(self) -> None:
        self._free()

    def _start(self, ctx: int, nonce: bytes, aad: bytes, *, encrypting: bool) -> ctypes.c_int:
        """Give the keyed ``ctx`` the message's nonce and absorb ``aad``; a counter for the next calls."""
        lib = self._lib
        init, update = (
            (lib.EVP_EncryptInit_ex, lib.EVP_EncryptUpdate)
            if encrypting
            else (lib.EVP_DecryptInit_ex, lib.EVP_DecryptUpdate)
        )
        _ok(lib.EVP_CIPHER_CTX_ctrl(ctx, _CTRL_SET_IVLEN, len(nonce), None), "EVP_CTRL_GCM_SET_IVLEN", lib)
        _ok(init(ctx, None, None, None, nonce), "EVP_EncryptInit_ex" if encrypting else "EVP_DecryptInit_ex", lib)
        written = ctypes.c_int(0)
        _ok(update(ctx, None, written, aad, len(aad)), "the associated data", lib)
        return written

    def encrypt(self, nonce: bytes, data: bytes, aad: bytes) -> bytes:
        if max(len(data), len(aad)) > _MAX_BYTES:
            raise ValueError("AES-GCM input longer than 1 GiB")
        lib = self._lib
        # Room for the tag after the ciphertext: it is read straight into place.
        out = ctypes.create_string_buffer(len(data) + TAG_BYTES)
        with self._lock:
            ctx = self._encrypting
            written = self._start(ctx, nonce, aad, encrypting=True)
            _ok(lib.EVP_EncryptUpdate(ctx, out, written, data, len(data)), "EVP_EncryptUpdate", lib)
            size = written.value
            _ok(lib.EVP_EncryptFinal_ex(ctx, ctypes.byref(out, size), written), "EVP_EncryptFinal_ex", lib)
            size += written.value
            tag = ctypes.byref(out, size)
            _ok(lib.EVP_CIPHER_CTX_ctrl(ctx, _CTRL_GET_TAG, TAG_BYTES, tag), "EVP_CTRL_GCM_GET_TAG", lib)
        return out.raw[: size + TAG_BYTES]

    def decrypt(self, nonce: bytes, data: bytes, aad: bytes) -> bytes:
        if len(data) < TAG_BYTES:
            raise InvalidTagError("shorter than a tag")
        if max(len(data), len(aad)) > _MAX_BYTES:
            raise ValueError("AES-GCM input longer than 1 GiB")
        body, tag = data[:-TAG_BYTES], data[-TAG_BYTES:]
        lib = self._lib
        out = ctypes.create_string_buffer(len(body) + TAG_BYTES)
        with self._lock:
            ctx = self._decrypting
            written = self._start(ctx, nonce, aad, encrypting=False)
            _ok(lib.EVP_DecryptUpdate(ctx, out, written, body, len(body)), "EVP_DecryptUpdate", lib)
            size = written.value
            _ok(lib.EVP_CIPHER_CTX_ctrl(ctx, _CTRL_SET_TAG, TAG_BYTES, tag), "EVP_CTRL_GCM_SET_TAG", lib)
            # The tag is checked here: anything but 1 means the bytes are not authentic.
            if lib.EVP_DecryptFinal_ex(ctx, ctypes.byref(out, size), written) != 1:
                # A refused tag queues an OpenSSL error on this thread, where Python's ssl and
                # hashlib would later find it and report it as theirs: cleared here.
                lib.ERR_clear_error()
                raise InvalidTagError("authentication failed")
            size += written.value
        return out.raw[:size]


class _PackageGcm:
    """AES-256-GCM from the cryptography package (its own OpenSSL), where no libcrypto loads."""

    def __init__(self, key: bytes) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: PLC0415

        self._aead = AESGCM(key)

    def encrypt(self, nonce: bytes, data: bytes, aad: bytes) -> bytes:
        return self._aead.encrypt(nonce, data, aad)

    def decrypt(self, nonce: bytes, data: bytes, aad: bytes) -> bytes:
        from cryptography.exceptions import InvalidTag  # noqa: PLC0415

        try:
            return self._aead.decrypt(nonce, data, aad)
        except InvalidTag:
            raise InvalidTagError("authentication failed") from None


def aes_gcm(key: bytes) -> Cipher:
    """AES-256-GCM under the 32-byte ``key``: the system's libcrypto, else the cryptography package."""
    if len(key) != 32:
        raise ValueError(f"an AES-256 key is 32 bytes; got {len(key)}")
    lib = _libcrypto()
    return _PackageGcm(key) if lib is None else _LibcryptoGcm(lib, key)


def package_aes_gcm(key: bytes) -> Cipher:
    """AES-256-GCM from the cryptography package whatever libcrypto is loaded: the same bytes as
    :func:`aes_gcm` (tests/agent/test_aes_gcm.py), at a fraction of the cost per call of ctypes,
    but with the package's own OpenSSL mapped. For a process that seals often and is no device
    (the fleet simulator); a device keeps :func:`aes_gcm`, for its memory."""
    if len(key) != 32:
        raise ValueError(f"an AES-256 key is 32 bytes; got {len(key)}")
    return _PackageGcm(key)
