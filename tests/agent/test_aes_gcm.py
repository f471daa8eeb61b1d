"""The sealed state's AES-256-GCM: the system's libcrypto and the cryptography package agree byte
for byte, both refuse anything not authentic, and the ctypes calls run under
``MemoryDenyWriteExecute`` (agent/aes_gcm.py)."""

from __future__ import annotations

import ctypes
import random
import subprocess
import sys
from pathlib import Path

import pytest

from agent import aes_gcm as gcm
from agent.sealed import Sealer
from protocol.plain import Plain

ROOT = Path(__file__).resolve().parents[2]
LENGTHS = [0, 1, 15, 16, 17, 255, 4096, 70_001]

needs_libcrypto = pytest.mark.skipif(not gcm.libcrypto_loaded(), reason="no system libcrypto 3 or 1.1 to load")


def _both(key: bytes) -> tuple[gcm.Cipher, gcm.Cipher]:
    lib = gcm._libcrypto()
    assert lib is not None
    return gcm._LibcryptoGcm(lib, key), gcm._PackageGcm(key)


@needs_libcrypto
@pytest.mark.parametrize("length", LENGTHS)
def test_libcrypto_and_the_package_give_the_same_bytes(length: int) -> None:
    rnd = random.Random(length)
    key, nonce = rnd.randbytes(32), rnd.randbytes(12)
    data, aad = rnd.randbytes(length), rnd.randbytes(length % 61)
    ours, package = _both(key)
    sealed = ours.encrypt(nonce, data, aad)
    assert sealed == package.encrypt(nonce, data, aad)
    assert len(sealed) == length + gcm.TAG_BYTES
    assert ours.decrypt(nonce, sealed, aad) == data
    assert package.decrypt(nonce, sealed, aad) == data


@needs_libcrypto
@pytest.mark.parametrize("which", ["libcrypto", "package"])
def test_anything_not_authentic_is_refused(which: str) -> None:
    rnd = random.Random(7)
    key, nonce, data, aad = rnd.randbytes(32), rnd.randbytes(12), rnd.randbytes(100), b"purpose"
    cipher = dict(zip(["libcrypto", "package"], _both(key), strict=True))[which]
    sealed = cipher.encrypt(nonce, data, aad)
    for i in (0, 50, len(sealed) - 1):  # a ciphertext byte, another, a tag byte
        flipped = bytearray(sealed)
        flipped[i] ^= 0x01
        with pytest.raises(gcm.InvalidTagError):
            cipher.decrypt(nonce, bytes(flipped), aad)
    with pytest.raises(gcm.InvalidTagError):
        cipher.decrypt(nonce, sealed, b"another purpose")
    with pytest.raises(gcm.InvalidTagError):
        cipher.decrypt(bytes(12), sealed, aad)
    with pytest.raises(gcm.InvalidTagError):
        gcm.aes_gcm(bytes(32)).decrypt(nonce, sealed, aad)
    with pytest.raises(gcm.InvalidTagError):
        cipher.decrypt(nonce, sealed[: gcm.TAG_BYTES - 1], aad)


@needs_libcrypto
def test_one_cipher_serves_message_after_message() -> None:
    """Its contexts are keyed once and take each message's nonce: after a refused tag and across
    nonces of other lengths, every message is still the package's bytes and opens."""
    rnd = random.Random(11)
    ours, package = _both(rnd.randbytes(32))
    for length in (12, 16, 8, 12, 60):
        nonce, data, aad = rnd.randbytes(length), rnd.randbytes(length * 7), rnd.randbytes(length % 5)
        sealed = ours.encrypt(nonce, data, aad)
        assert sealed == package.encrypt(nonce, data, aad)
        with pytest.raises(gcm.InvalidTagError):
            ours.decrypt(nonce, sealed, aad + b"x")
        assert ours.decrypt(nonce, sealed, aad) == data


def test_without_libcrypto_the_package_seals_the_same_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """A device without a loadable libcrypto falls back, and reads what the other path wrote."""
    key = bytes(range(32))
    entries: list[Plain] = [1, 2, 3]
    written = Sealer(key).seal("ledger", 1, {"entries": entries})
    monkeypatch.setattr(gcm, "_libcrypto", lambda: None)
    assert not gcm.libcrypto_loaded()
    fallback = Sealer(key)
    assert isinstance(fallback._aead, gcm._PackageGcm)
    assert fallback.open("ledger", 1, written) == {"entries": [1, 2, 3]}
    assert Sealer(key).open("ledger", 1, fallback.seal("ledger", 1, {"n": 1})) == {"n": 1}


def test_a_wrong_key_length_is_refused() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        gcm.aes_gcm(bytes(16))


_UNDER_MDWE = """
import ctypes, sys
# PR_SET_MDWE (65) with PR_MDWE_REFUSE_EXEC_GAIN (1): what MemoryDenyWriteExecute=yes enforces.
if ctypes.CDLL(None, use_errno=True).prctl(65, 1, 0, 0, 0) != 0:
    print("unsupported")
    sys.exit(0)
from agent.sealed import Sealer
from protocol.plain import Plain
from agent.aes_gcm import libcrypto_loaded
s = Sealer(bytes(32))
assert s.open("agent", 1, s.seal("agent", 1, {"cycles": 3})) == {"cycles": 3}
print("libcrypto" if libcrypto_loaded() else "package")
"""


@needs_libcrypto
def test_sealing_works_where_memory_cannot_be_writable_and_executable() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _UNDER_MDWE], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    if done.stdout.strip() == "unsupported":
        pytest.skip("the kernel has no PR_SET_MDWE (Linux 6.3 or later)")
    assert done.stdout.strip() == "libcrypto"


def test_a_failed_call_leaves_no_error_on_openssls_queue() -> None:
    """A libcrypto call that fails (here a nonce of no bytes, which GCM refuses) queues an error
    on the thread's OpenSSL queue, which Python's ssl and hashlib share; it is cleared, so none
    of theirs ever reports it as its own. A refused tag leaves nothing queued either."""
    lib = gcm._libcrypto()
    if lib is None:
        pytest.skip("no system libcrypto 3 or 1.1 to load: the cryptography package seals")
    lib.ERR_peek_error.restype = ctypes.c_ulong
    lib.ERR_peek_error.argtypes = []
    cipher = gcm.aes_gcm(bytes(32))
    with pytest.raises(RuntimeError, match="SET_IVLEN"):
        cipher.encrypt(b"", b"state", b"aad")
    assert lib.ERR_peek_error() == 0
    sealed = bytearray(cipher.encrypt(bytes(12), b"state", b"aad"))
    sealed[-1] ^= 1
    with pytest.raises(gcm.InvalidTagError):
        cipher.decrypt(bytes(12), bytes(sealed), b"aad")
    assert lib.ERR_peek_error() == 0
