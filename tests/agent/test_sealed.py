"""Sealed state files: AES-256-GCM, purpose/version binding, tamper detection, atomic writes, key loading."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.errors import KeyUnavailableError, StateUnreadableError
from agent.sealed import Sealer, atomic_write, create_key_file, load_key
from protocol.plain import Plain, PlainDoc

KEY = bytes(range(32))
DOC: PlainDoc = {"alpha": 3, "memo": b"\x01\x02", "totals": {5: {b"k" * 32: 12}}, "name": "x", "eps": 0.5}

plain = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False) | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=60, deadline=None)
@given(doc=plain)
def test_seal_open_round_trip(doc: Plain) -> None:
    """Any msgpack-ready document opens to itself."""
    s = Sealer(KEY)
    assert s.open("ledger", 1, s.seal("ledger", 1, doc)) == doc


def test_every_flipped_byte_is_detected() -> None:
    """Flipping any single byte of a sealed file makes it unreadable (nothing is misread)."""
    s = Sealer(KEY)
    blob = s.seal("usecase:x", 1, DOC)
    for i in range(len(blob)):
        bad = bytearray(blob)
        bad[i] ^= 0x40
        with pytest.raises(StateUnreadableError):
            s.open("usecase:x", 1, bytes(bad))


def test_purpose_version_and_key_are_bound() -> None:
    """A file sealed for one purpose, schema version or key does not open as another."""
    s = Sealer(KEY)
    blob = s.seal("usecase:a", 1, DOC)
    for purpose, version, sealer in (("usecase:b", 1, s), ("usecase:a", 2, s), ("usecase:a", 1, Sealer(b"\xff" * 32))):
        with pytest.raises(StateUnreadableError, match="authentication failed"):
            sealer.open(purpose, version, blob)
    with pytest.raises(StateUnreadableError, match="bad header"):
        s.open("usecase:a", 1, b"garbage")


def test_atomic_write_replaces_and_leaves_no_temporary(tmp_path: Path) -> None:
    """A write replaces the file wholesale, with mode 0600, and leaves no temporary behind."""
    target = tmp_path / "f.sealed"
    atomic_write(target, b"one")
    atomic_write(target, b"two")
    assert target.read_bytes() == b"two"
    assert os.stat(target).st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["f.sealed"]


def test_read_of_missing_file_is_none(tmp_path: Path) -> None:
    """A state file that does not exist yet reads as None (nothing to restore)."""
    assert Sealer(KEY).read(tmp_path / "absent.sealed", "agent", 1) is None


def test_key_file_must_be_private(tmp_path: Path) -> None:
    """A key file readable by group or others is refused with the chmod to run."""
    path = tmp_path / "key"
    path.write_bytes(KEY)
    path.chmod(0o644)
    with pytest.raises(KeyUnavailableError, match="chmod 600"):
        load_key(key_file=path, key_credential=None)
    path.chmod(0o600)
    assert load_key(key_file=path, key_credential=None) == KEY
    path.write_text(KEY.hex() + "\n")
    assert load_key(key_file=path, key_credential=None) == KEY
    path.write_bytes(b"short")
    with pytest.raises(KeyUnavailableError, match="32 raw bytes"):
        load_key(key_file=path, key_credential=None)
    with pytest.raises(KeyUnavailableError, match="cannot open"):
        load_key(key_file=tmp_path / "missing", key_credential=None)


def test_key_from_systemd_credentials(tmp_path: Path) -> None:
    """key_credential reads $CREDENTIALS_DIRECTORY/<name>, and says so when the variable is missing."""
    (tmp_path / "state-key").write_bytes(KEY)
    env = {"CREDENTIALS_DIRECTORY": str(tmp_path)}
    assert load_key(key_file=None, key_credential="state-key", environ=env) == KEY
    with pytest.raises(KeyUnavailableError, match="CREDENTIALS_DIRECTORY"):
        load_key(key_file=None, key_credential="state-key", environ={})


def test_created_key_is_private_and_kept(tmp_path: Path) -> None:
    """create_key_file makes a 0600 key once and never overwrites it."""
    path = tmp_path / "sub" / "key"
    assert create_key_file(path)
    first = path.read_bytes()
    assert len(first) == 32
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert not create_key_file(path)
    assert path.read_bytes() == first
