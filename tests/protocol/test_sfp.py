"""Sequence Fragment Puzzle: ε + ε' exactly, both sketches fed correctly, words reconstructed."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.errors import InputError, MalformedReportError, ParameterError, StateError, TooManyWordsError
from protocol.hashing import derive_seed
from protocol.randomness import SeededRandom
from protocol.server.sfp import SFPAggregate, SFPServer
from protocol.sfp import SequenceFragmentPuzzle
from tests.protocol.ldp import assert_tight_ldp
from tests.protocol.sketch_coins import EdgeRandom, sfp_record

SEED = b"sfp-test-seed-0123456789"


def _mech(**overrides: Any) -> SequenceFragmentPuzzle:
    params: dict[str, Any] = {
        "epsilon": 2.0,
        "epsilon_fragment": 6.0,
        "k": 16,
        "m": 32,
        "k_fragment": 8,
        "m_fragment": 64,
        "seed": SEED,
    }
    params.update(overrides)
    return SequenceFragmentPuzzle(**params)


def _tiny(**overrides: Any) -> SequenceFragmentPuzzle:
    params: dict[str, Any] = {"k": 2, "m": 4, "k_fragment": 2, "m_fragment": 4, "length": 2, "fragment_length": 1}
    params.update(overrides)
    return _mech(**params)


# ------------------------------------------------------------------------- privacy


@pytest.mark.parametrize(("epsilon", "epsilon_fragment"), [(2.0, 6.0), (1.0, 1.0), (0.5, 3.0)])
def test_exact_ldp_is_tight_at_the_composed_epsilon(epsilon: float, epsilon_fragment: float) -> None:
    """Enumerating every output on tiny sketches: the worst ratio is exactly e**(ε + ε') (003 Thm 4.5)."""
    mech = _tiny(epsilon=epsilon, epsilon_fragment=epsilon_fragment)
    words = ["ab", "ba", "aa", "bb", "c", "cd", "dc"]
    assert_tight_ldp([mech.output_distribution(w) for w in words], epsilon + epsilon_fragment)
    assert mech.epsilon_report == pytest.approx(epsilon + epsilon_fragment, abs=1e-12)
    assert mech.epsilon_report <= epsilon + epsilon_fragment + 1e-12


def test_position_and_both_records_are_independent_given_the_word() -> None:
    """Pr[i, fragment record, word record] = Pr[i] Pr[fragment record | i] Pr[word record]: the CMS outputs compose."""
    mech = _tiny()
    word = "ab"
    dist = mech.output_distribution(word)
    piece = mech.puzzle_piece(mech.pad(word))
    word_dist = mech.word_cms.output_distribution(b"ab")
    for position, fragment in enumerate("ab"):
        frag_dist = mech.fragment_cms.output_distribution(mech.fragment_value(piece, fragment))
        for (fj, fbits), pf in frag_dist.items():
            for (wj, wbits), pw in word_dist.items():
                assert dist[(position, fj, fbits, wj, wbits)] == pf * pw / 2
    assert sum(dist.values()) == 1


@pytest.mark.parametrize("path", ["single", "batch"])
def test_sampler_matches_the_exact_distribution(path: str, rng: SeededRandom) -> None:
    """Reports drawn by privatize / privatize_many match output_distribution output by output (5 SE)."""
    mech = _mech(k=1, m=2, k_fragment=1, m_fragment=2, length=2, fragment_length=1)
    server = SFPServer(mech)
    n = 16_000
    if path == "single":
        records = [mech.privatize("xy", None, rng)[0] for _ in range(n)]
        batch = server.batch(records)
    else:
        batch = server.privatize_many(["xy"] * n, rng)
    seen = Counter(
        zip(
            batch.positions.tolist(),
            batch.fragment.indices.tolist(),
            [row.tobytes() for row in batch.fragment.bits],
            batch.word.indices.tolist(),
            [row.tobytes() for row in batch.word.bits],
            strict=True,
        )
    )
    dist = mech.output_distribution("xy")
    assert set(seen) <= set(dist)
    for output, prob in dist.items():
        p = float(prob)
        assert abs(seen[output] - n * p) <= 5 * math.sqrt(n * p * (1 - p)) + 1, output


@pytest.mark.parametrize("overrides", [{}, {"k": 7, "m": 13, "k_fragment": 5, "m_fragment": 1000}, {"length": 6}])
def test_pure_privatize_is_the_numpy_path_record_for_record(overrides: dict[str, Any]) -> None:
    """Seeded and edge coins (every position word rejected, ties past both sketches' spare words,
    rejected hash indices): the pure device path gives the numpy path's records, record for record,
    and leaves the stream where it did. (The server half's privatize_many draws the positions
    and each sketch's coins for many words at once instead.)"""
    mech = _mech(**overrides)
    ties = [
        int.from_bytes(bytes([cms.flip_coin.numerator >> 56]) * 8, "little")
        for cms in (mech.fragment_cms, mech.word_cms)
    ]
    words = ["", "a", "bruh", "hello world", "ünïcödé", "x" * 30]
    for seed in range(20):
        pairs: list[tuple[SeededRandom | EdgeRandom, SeededRandom | EdgeRandom]] = [
            (SeededRandom(seed), SeededRandom(seed)),
            (EdgeRandom(seed, [(1 << 64) - 1], every=2), EdgeRandom(seed, [(1 << 64) - 1], every=2)),
            (EdgeRandom(seed, [*ties, (1 << 64) - 1]), EdgeRandom(seed, [*ties, (1 << 64) - 1])),
        ]
        for pure, numpy_path in pairs:
            for word in words:
                assert mech.privatize(word, None, pure)[0] == sfp_record(mech, word, numpy_path)
            assert pure.draw(1) == numpy_path.draw(1)


# -------------------------------------------------------------------- parameters


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("epsilon", 0.0),
        ("epsilon_fragment", -2.0),
        ("epsilon_fragment", math.inf),
        ("k", 0),
        ("m", 1),
        ("k_fragment", 0),
        ("k_fragment", 1.5),
        ("m_fragment", 1),
        ("seed", b"short"),
        ("length", 0),
        ("length", 1000),
        ("fragment_length", 0),
        ("fragment_length", 3),
        ("fragment_length", 11),
    ],
)
def test_bad_parameters_name_the_field(field: str, bad: object) -> None:
    """A bad parameter is a ParameterError naming that parameter (fragment_length must divide length)."""
    with pytest.raises(ParameterError) as info:
        _mech(**{field: bad})
    assert info.value.name == field


def test_deployed_parameters() -> None:
    """The New Words deployment (003 §6.1): 5 positions, 128-byte vectors, ε + ε' = 8, independent sub-seeds."""
    mech = SequenceFragmentPuzzle(
        epsilon=2.0, epsilon_fragment=6.0, k=2048, m=1024, k_fragment=2048, m_fragment=1024, seed=SEED
    )
    assert mech.positions == 5
    assert mech.epsilon_report == pytest.approx(8.0, abs=1e-12)
    assert mech.word_cms.seed == derive_seed(SEED, "sfp/word")
    assert mech.fragment_cms.seed == derive_seed(SEED, "sfp/fragment")
    assert mech.puzzle_family.seed == derive_seed(SEED, "sfp/puzzle")
    record, _ = mech.privatize("despacito", None, SeededRandom(1))
    assert len(record.fragment.bits) == len(record.word.bits) == 128
    assert 0 <= record.position < 5


# ---------------------------------------------------------------- client behaviour


def test_words_are_padded_or_truncated_by_characters() -> None:
    """Words are cut or space-padded to `length` characters (code points, not bytes)."""
    mech = _mech()
    assert mech.pad("bae") == "bae       "
    assert mech.pad("mayweathers") == "mayweather"
    assert mech.pad("ñandú") == "ñandú     "
    assert len(mech.pad("😀" * 12)) == 10
    assert mech.fragment_value(7, "ñ") == b"\x07" + "ñ".encode()


@pytest.mark.parametrize("bad", [b"bytes", 3, None, "\ud800"])
def test_bad_word_is_refused(bad: object, rng: SeededRandom) -> None:
    """Only str words (UTF-8 encodable) can be privatized."""
    mech = _mech()
    server = SFPServer(mech)
    with pytest.raises(InputError):
        mech.privatize(bad, None, rng)  # type: ignore[arg-type]
    with pytest.raises(InputError):
        server.privatize_many(["fine", bad], rng)  # type: ignore[list-item]


def test_fragment_report_carries_the_puzzle_piece_and_the_chosen_fragment(rng: SeededRandom) -> None:
    """With near-noiseless coins, each fragment record is the one-hot of h_j'(h(s) || s[ℓ:ℓ+2]) (003 Alg. 9)."""
    mech = _mech(epsilon=60.0, epsilon_fragment=60.0)
    server = SFPServer(mech)
    word = "tryna"
    s = mech.pad(word)
    piece = mech.puzzle_piece(s)
    batch = server.privatize_many([word] * 200, rng)
    assert set(batch.positions.tolist()) == set(range(5))
    for i in range(200):
        position = int(batch.positions[i])
        fragment = s[2 * position : 2 * position + 2]
        fj = int(batch.fragment.indices[i])
        h = mech.fragment_cms.family.evaluate_value(bytes((piece,)) + fragment.encode(), fj)
        bits = np.unpackbits(batch.fragment.bits[i], count=mech.m_fragment)
        assert bits.tolist() == [int(c == h) for c in range(mech.m_fragment)]
        wj = int(batch.word.indices[i])
        wbits = np.unpackbits(batch.word.bits[i], count=mech.m)
        assert int(np.flatnonzero(wbits)[0]) == mech.word_cms.family.evaluate_value(s, wj)


# --------------------------------------------------------------------- aggregate


def test_oracles_estimate_words_and_fragments(rng: SeededRandom) -> None:
    """Word and per-position fragment oracles are within 5 SE of the truth; each position has its own n_ℓ."""
    mech = _mech(epsilon=4.0, epsilon_fragment=6.0, k=64, m=256, k_fragment=64, m_fragment=256)
    server = SFPServer(mech)
    values = ["bruh"] * 6000 + ["wyd"] * 3000 + ["idc"] * 1000
    batch = server.privatize_many(values, rng)
    agg = server.new_aggregate()
    agg.add(batch)
    assert agg.n == 10_000
    n_l = [agg.fragments[p].n for p in range(5)]
    assert n_l == np.bincount(batch.positions, minlength=5).tolist()
    words = agg.estimate_words(["bruh", "wyd", "idc", "nope"])
    for est, se, truth in zip(words.values, words.standard_errors, [6000, 3000, 1000, 0], strict=True):
        assert abs(est - truth) <= 5 * se
    s = mech.pad("bruh")
    piece = mech.puzzle_piece(s)
    for position in range(5):
        frag = agg.estimate_fragments(position, [(piece, s[2 * position : 2 * position + 2]), (piece, "zz")])
        share = float(np.mean(batch.positions[:6000] == position)) * 6000
        assert abs(frag.values[0] - share) <= 5 * frag.standard_errors[0]
        assert abs(frag.values[1]) <= 5 * frag.standard_errors[1]
    with pytest.raises(ParameterError):
        agg.estimate_fragments(5, [(piece, "br")])
    with pytest.raises(InputError):
        agg.estimate_fragments(0, [(256, "br")])


def test_add_refuses_misaligned_batches(rng: SeededRandom) -> None:
    """A batch whose parts do not line up, or whose position is out of range, is refused and changes nothing."""
    mech = _mech()
    server = SFPServer(mech)
    agg = server.new_aggregate()
    batch = server.privatize_many(["a", "b", "c"], rng)
    bad_positions = type(batch)(positions=np.array([0, 1, 5]), fragment=batch.fragment, word=batch.word)
    with pytest.raises(ValueError, match="positions"):
        agg.add(bad_positions)
    short = type(batch)(positions=batch.positions, fragment=batch.fragment.take(np.arange(2)), word=batch.word)
    with pytest.raises(ValueError, match="row-aligned"):
        agg.add(short)
    assert agg.n == 0
    assert all(a.n == 0 for a in agg.fragments)


@pytest.mark.slow
def test_reconstruction_recovers_the_frequent_words() -> None:
    """A few dozen words, 10^5 reports, generous ε: the frequent words come back with correct counts, no impostors."""
    corpus = [
        "bruh",
        "hun",
        "bae",
        "tryna",
        "wyd",
        "wbu",
        "idc",
        "despacito",
        "moana",
        "leia",
        "queso",
        "aqui",
        "jai",
        "lov",
        "th",
        "kno",
        "mayweather",
        "mcgregor",
        "dia",
        "yeet",
        "lit",
        "salty",
        "fomo",
        "stan",
        "vibe",
        "sus",
        "bet",
        "cap",
        "slay",
        "lowkey",
    ]
    weights = 1 / np.arange(1, len(corpus) + 1)
    counts = np.floor(100_000 * weights / weights.sum()).astype(int).tolist()
    values = [w for w, c in zip(corpus, counts, strict=True) for _ in range(c)]
    mech = SequenceFragmentPuzzle(
        epsilon=8.0, epsilon_fragment=8.0, k=256, m=512, k_fragment=64, m_fragment=256, seed=SEED
    )
    server = SFPServer(mech)
    agg = server.new_aggregate()
    agg.add(server.privatize_many(values, SeededRandom(5)))
    found = agg.reconstruct(alphabet="abcdefghijklmnopqrstuvwxyz ", top_t=64, threshold=1000)
    truth = dict(zip(corpus, counts, strict=True))
    assert {d.word for d in found} <= set(corpus)
    # Every word whose fragments stand out (count/5 per position well above the noise) is found.
    assert {d.word for d in found} >= set(corpus[:10])
    for d in found:
        assert abs(d.count - truth[d.word]) <= 5 * d.standard_error
    assert [d.count for d in found] == sorted((d.count for d in found), reverse=True)


def test_reconstruction_checks_its_arguments(rng: SeededRandom) -> None:
    """Bad alphabets or T are refused; an empty aggregate discovers nothing."""
    mech = _mech()
    server = SFPServer(mech)
    agg = server.new_aggregate()
    assert agg.reconstruct(alphabet="ab ", top_t=4, threshold=0) == []
    with pytest.raises(ValueError, match="alphabet"):
        agg.reconstruct(alphabet=["ab"], top_t=4, threshold=0)
    with pytest.raises(ValueError, match="alphabet"):
        agg.reconstruct(alphabet="", top_t=4, threshold=0)
    with pytest.raises(ParameterError, match="top_t"):
        agg.reconstruct(alphabet="ab", top_t=0, threshold=0)
    agg.add(server.privatize_many(["ab"] * 50, rng))
    with pytest.raises(TooManyWordsError, match="max_words=10"):
        agg.reconstruct(alphabet="ab ", top_t=2304, threshold=0, max_words=10)


# -------------------------------------------------------------------- wire form


def test_records_round_trip_through_msgpack(rng: SeededRandom) -> None:
    """encode_records -> msgpack -> decode_records gives back the same batch."""
    mech = _mech(m=13, m_fragment=21)
    server = SFPServer(mech)
    records = [mech.privatize(f"w{i}", None, rng)[0] for i in range(40)]
    decoded = server.decode_records(msgpack.unpackb(msgpack.packb(mech.encode_records(records))))
    want = server.batch(records)
    assert np.array_equal(decoded.positions, want.positions)
    for got, exp in ((decoded.fragment, want.fragment), (decoded.word, want.word)):
        assert np.array_equal(got.indices, exp.indices)
        assert np.array_equal(got.bits, exp.bits)


_GOOD = [1, 3, b"\x00\x00\x00", 5, b"\x00\x00"]


def _with(index: int, value: object) -> list[object]:
    out: list[object] = list(_GOOD)
    out[index] = value
    return out


@pytest.mark.parametrize(
    ("raw", "reason", "field"),
    [
        ("records", "bad-type", "records"),
        ([(1, 2)], "bad-type", "records[0]"),
        ([_GOOD[:4]], "bad-length", "records[0]"),
        ([_GOOD, _with(0, True)], "bad-type", "records[1].position"),
        ([_with(0, 5)], "out-of-range", "records[0].position"),
        ([_with(0, -1)], "out-of-range", "records[0].position"),
        ([_with(1, 8)], "out-of-range", "records[0].fragment.index"),
        ([_with(1, "3")], "bad-type", "records[0].fragment.index"),
        ([_with(2, b"\x00\x00")], "bad-length", "records[0].fragment.bits"),
        ([_with(2, b"\x00\x00\x01")], "bad-padding", "records[0].fragment.bits"),
        ([_with(3, 16)], "out-of-range", "records[0].word.index"),
        ([_with(4, None)], "bad-type", "records[0].word.bits"),
        ([_with(4, b"\x00\x04")], "bad-padding", "records[0].word.bits"),
    ],
)
def test_malformed_records_are_refused_with_a_reason(raw: object, reason: str, field: str) -> None:
    """Each kind of malformed wire record raises MalformedReportError with its reason and field."""
    mech = _mech(m=13, m_fragment=21)
    server = SFPServer(mech)
    with pytest.raises(MalformedReportError) as info:
        server.decode_records(raw)
    assert (info.value.reason, info.value.field) == (reason, field)


_PLAIN = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=3) | st.binary(max_size=4),
    lambda children: st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=2), children, max_size=2),
    max_leaves=16,
)


@given(st.lists(_PLAIN, max_size=3) | _PLAIN)
def test_decoder_is_total(raw: object) -> None:
    """Any msgpack-shaped object either decodes into aligned columns or raises MalformedReportError."""
    mech = _mech(m=13, m_fragment=21)
    server = SFPServer(mech)
    try:
        batch = server.decode_records(raw)
    except MalformedReportError:
        return
    assert len(batch.fragment) == len(batch.word) == len(batch)


# ------------------------------------------------------------ merge and restore


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.sampled_from(["bae", "hun", "wyd", "x"]), max_size=30), min_size=3, max_size=3))
def test_merge_is_associative_and_commutative(parts: list[list[str]]) -> None:
    """Aggregates are sums: any merge order gives the same aggregate, and it survives a plain round trip."""
    mech = _mech()
    server = SFPServer(mech)
    aggs = []
    for i, words in enumerate(parts):
        agg = server.new_aggregate()
        agg.add(server.privatize_many(words, SeededRandom(i)))
        aggs.append(agg)
    a, b, c = aggs
    left = a.merge(b).merge(c).to_plain()
    assert left == a.merge(b.merge(c)).to_plain() == c.merge(a).merge(b).to_plain()
    restored = SFPAggregate.from_plain(mech, msgpack.unpackb(msgpack.packb(left)))
    assert restored.to_plain() == left
    assert restored.n == sum(len(p) for p in parts)


def test_from_plain_refuses_malformed_state(rng: SeededRandom) -> None:
    """Missing parts, a wrong number of positions or fragment counts that disagree with n raise StateError."""
    mech = _mech()
    server = SFPServer(mech)
    agg = server.new_aggregate()
    agg.add(server.privatize_many(["bae", "hun", "wyd"], rng))
    plain: Any = agg.to_plain()
    with pytest.raises(StateError):
        SFPAggregate.from_plain(mech, {"word": plain["word"]})
    with pytest.raises(StateError):
        SFPAggregate.from_plain(mech, {"word": plain["word"], "fragments": plain["fragments"][:4]})
    empty = server.new_aggregate().to_plain()
    with pytest.raises(StateError):
        SFPAggregate.from_plain(mech, {"word": plain["word"], "fragments": empty["fragments"]})
    with pytest.raises(StateError):
        SFPAggregate.from_plain(mech, "not a mapping")
    with pytest.raises(ValueError, match="different"):
        agg.merge(SFPServer(_mech(epsilon=3.0)).new_aggregate())
