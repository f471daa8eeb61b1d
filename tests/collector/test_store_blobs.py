"""The store's blob encoding (collector/store/row_format.py): what compresses is compressed, what does
not is stored as it is, and every blob either form ever wrote reads back the same."""

from __future__ import annotations

import zlib

import msgpack
import numpy as np

from collector.store.row_format import pack, unpack


def test_random_bits_are_stored_uncompressed_and_read_back() -> None:
    """A blob of random bytes (a segment of sketch records) is written as plain msgpack and unpacks the same."""
    bits = np.random.default_rng(7).integers(0, 256, size=200_000, dtype=np.uint8).tobytes()
    doc = {"indices": bytes(8_000), "bits": bits}
    blob = pack(doc)
    assert blob[:1] == b"m"
    assert unpack(blob) == doc


def test_a_compressible_blob_is_compressed_and_read_back() -> None:
    """A blob of counts (an aggregate of small numbers) is compressed, and unpacks to the same object."""
    counts = np.arange(50_000, dtype=np.int64) % 7
    doc = {"counts": counts.tobytes(), "n": 12}
    blob = pack(doc)
    assert blob[:1] == b"z"
    assert len(blob) < len(counts.tobytes()) // 4
    assert unpack(blob) == doc


def test_small_blobs_stay_plain() -> None:
    """Up to 4 KiB nothing is compressed, whatever it holds."""
    doc = {"zeros": bytes(3_000)}
    assert pack(doc)[:1] == b"m"
    assert unpack(pack(doc)) == doc


def test_a_compressed_blob_of_random_bits_from_the_previous_release_reads_back() -> None:
    """The previous release compressed every blob past 4 KiB, random bits too: such a blob still unpacks."""
    bits = np.random.default_rng(8).integers(0, 256, size=20_000, dtype=np.uint8).tobytes()
    doc = {"bits": bits}
    old = b"z" + zlib.compress(msgpack.packb(doc, use_bin_type=True), 1)
    assert unpack(old) == doc
