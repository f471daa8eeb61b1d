"""The nonces of sealed files: read from the OS CSPRNG a block at a time, each handed out once,
never shared with a forked child."""

from __future__ import annotations

import os

from agent import sealed
from agent.sealed import Sealer
from tests.agent.conftest import KEY

_HEADER = 5  # b"LDPS" and the format byte, then the 12-byte nonce


def test_nonces_are_never_repeated_across_blocks() -> None:
    """Several blocks' worth of nonces: all 12 bytes long, all different."""
    nonces = [sealed._NONCES.take() for _ in range(3 * sealed._NONCES_PER_READ + 7)]
    assert {len(n) for n in nonces} == {12}
    assert len(set(nonces)) == len(nonces)


def test_each_seal_has_its_own_nonce() -> None:
    """The same document sealed twice: two nonces, two ciphertexts, both open."""
    sealer = Sealer(KEY)
    a = sealer.seal("usecase:x", 1, {"v": 1})
    b = sealer.seal("usecase:x", 1, {"v": 1})
    assert a[_HEADER : _HEADER + 12] != b[_HEADER : _HEADER + 12]
    assert sealer.open("usecase:x", 1, a) == sealer.open("usecase:x", 1, b) == {"v": 1}


def test_a_forked_child_does_not_reuse_the_parents_block() -> None:
    """After a fork the child reads a block of its own: its next nonce is not the parent's."""
    sealed._NONCES.take()  # a block is loaded, with unread nonces left in it
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: send its next nonce and leave at once
        os.close(read)
        os.write(write, sealed._NONCES.take())
        os._exit(0)
    os.close(write)
    child = b""
    while len(child) < 12:
        chunk = os.read(read, 12 - len(child))
        if not chunk:
            break
        child += chunk
    os.close(read)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert len(child) == 12
    assert sealed._NONCES.take() != child
