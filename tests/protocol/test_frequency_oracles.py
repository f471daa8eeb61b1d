"""The five frequency oracles at the local-privacy limit (olh, grr, oue, ss, pgr): what they share.

For each: the exact output distribution's worst likelihood ratio is e**ε (tight), the samplers
follow that distribution, the pure device path and the server half's vectorised privatizer
draw the same record from the same coins, the decoder is strict and total, aggregates merge
and round-trip, and the estimates are unbiased with standard errors that cover at 95 %.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from collections import Counter
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.errors import InputError, MalformedReportError, ParameterError, StateError
from protocol.grr import GeneralizedRandomizedResponse
from protocol.interfaces import EstimateKind, Mechanism
from protocol.olh import OptimalLocalHashing
from protocol.oue import OptimizedUnaryEncoding
from protocol.pgr import ProjectiveGeometryResponse
from protocol.randomness import SCALE, SeededRandom, dexp
from protocol.server.contract import ServerMechanism, frequency_server, server_of
from protocol.ss import SubsetSelection
from tests.protocol.ldp import assert_tight_ldp
from tests.protocol.sketch_coins import EdgeRandom

SEED = b"frequency-oracles-public-seed"
NAMES = ("grr", "oue", "ss", "pgr", "olh")


def _categories(k: int) -> tuple[str, ...]:
    return tuple(f"c{i}" for i in range(k))


def make(name: str, *, epsilon: float, k: int, seed: bytes = SEED, **extra: Any) -> Mechanism:
    """One of the five at ε over ``k`` categories (olh: its family over ``seed``; ``k`` unused)."""
    if name == "olh":
        return OptimalLocalHashing(epsilon=epsilon, seed=seed, **extra)
    cls: dict[str, Callable[..., Mechanism]] = {
        "grr": GeneralizedRandomizedResponse,
        "oue": OptimizedUnaryEncoding,
        "ss": SubsetSelection,
        "pgr": ProjectiveGeometryResponse,
    }
    return cls[name](epsilon=epsilon, categories=_categories(k), **extra)


def _values(mech: Mechanism, k: int) -> list[str]:
    return list(_categories(k))


def _wire(mech: Mechanism, value: str, rng: Any) -> object:
    record, _ = mech.privatize_plain(value, None, rng)
    return record


# ------------------------------------------------------------------ exact privacy

# (name, ε, k, extra parameters): small output spaces, every one enumerated.
EXACT = [
    ("grr", 0.5, 2, {}),
    ("grr", 2.0, 5, {}),
    ("oue", 1.0, 2, {}),
    ("oue", 3.0, 6, {}),
    ("ss", 1.0, 5, {"d": 2}),
    ("ss", 0.7, 6, {"d": 3}),
    ("ss", 2.0, 7, {}),
    ("pgr", 1.0, 3, {"q": 2, "t": 2}),
    ("pgr", 1.5, 7, {"q": 2, "t": 3}),
    ("pgr", 0.8, 11, {"q": 3, "t": 3}),
    ("olh", 1.0, 4, {"g": 3, "seeds": 4}),
    ("olh", 2.5, 5, {"g": 5, "seeds": 8}),
]


@pytest.mark.parametrize(("name", "epsilon", "k", "extra"), EXACT)
def test_exact_ldp_is_tight(name: str, epsilon: float, k: int, extra: dict[str, Any]) -> None:
    """Every output of every input enumerated: the worst ln ratio is the mechanism's ε, which is the declared ε."""
    mech = make(name, epsilon=epsilon, k=k, **extra)
    dists = [mech.output_distribution(v) for v in _values(mech, k)]  # type: ignore[attr-defined]
    assert_tight_ldp(dists, mech.epsilon_report)
    # The coins are rounded toward privacy: the exact ratio is at most e**ε (60-digit decimals).
    worst = max(max(d[o] for d in dists) / min(d[o] for d in dists) for o in dists[0])
    assert Decimal(worst.numerator) / Decimal(worst.denominator) <= dexp(epsilon)
    assert mech.epsilon_report == pytest.approx(epsilon, rel=1e-12)


@pytest.mark.parametrize(("name", "epsilon", "k", "extra"), EXACT)
@pytest.mark.parametrize("path", ["device", "server"])
def test_samplers_follow_the_exact_distribution(
    name: str, epsilon: float, k: int, extra: dict[str, Any], path: str
) -> None:
    """20,000 seeded reports of one value: every output's frequency within 5 SE of its exact probability."""
    mech = make(name, epsilon=epsilon, k=k, **extra)
    value = _values(mech, k)[1]
    exact: dict[Any, Fraction] = mech.output_distribution(value)  # type: ignore[attr-defined]
    reps = 20_000
    rng = SeededRandom(11)
    if path == "device":
        seen = Counter(_key(mech.privatize(value, None, rng)[0]) for _ in range(reps))  # type: ignore[attr-defined]
    else:
        server = server_of(mech)
        batch = server.privatize_many([value] * reps, rng)  # type: ignore[attr-defined]
        seen = Counter(_key(r) for r in _typed(mech, server.encode_batch(batch)))  # type: ignore[attr-defined]
    assert set(seen) <= set(exact)
    for output, prob in exact.items():
        p = float(prob)
        assert abs(seen[output] / reps - p) <= 5 * math.sqrt(p * (1 - p) / reps) + 1e-12, (output, p)


def _key(record: object) -> object:
    """An exact-distribution key of a typed record."""
    if hasattr(record, "index") and hasattr(record, "value"):
        return (record.index, record.value)
    return record


def _typed(mech: Mechanism, wire: list[Any]) -> list[object]:
    """Wire records back to the typed records ``output_distribution`` names."""
    if mech.name == "olh":
        return [(j, y) for j, y in wire]
    if mech.name == "ss":
        if mech.wire_form == "indices":  # type: ignore[attr-defined]
            return [tuple(r) for r in wire]
        k = mech.k  # type: ignore[attr-defined]
        return [tuple(i for i in range(k) if (int.from_bytes(r, "big") >> (8 * len(r) - 1 - i)) & 1) for r in wire]
    return list(wire)


# ----------------------------------------------------- the two paths draw the same records

PARITY = [
    ("grr", 4.0, 843, {}),
    ("grr", 1.0, 3, {}),
    ("oue", 4.0, 843, {}),
    ("oue", 0.5, 9, {}),
    ("ss", 1.0, 843, {}),
    ("ss", 4.0, 843, {}),
    ("ss", 8.0, 65_536, {}),
    ("pgr", 4.0, 843, {}),
    ("pgr", 8.0, 843, {}),
    ("pgr", 1.0, 8, {}),
    ("olh", 4.0, 0, {}),
    ("olh", 1.0, 0, {"seeds": 1000, "g": 7}),
]


def _edges(mech: Mechanism) -> list[int]:
    """Words at the coins' edges: a byte-coin tie, and words above every rejection limit."""
    edges = [SCALE - 1, SCALE - 2, 0]
    coin = getattr(mech, "other_coin", None)
    if coin is not None:
        edges.append(int.from_bytes(bytes([coin.numerator >> 56]) * 8, "little"))
    return edges


@pytest.mark.parametrize(("name", "epsilon", "k", "extra"), PARITY)
def test_device_and_server_paths_draw_the_same_record(name: str, epsilon: float, k: int, extra: dict[str, Any]) -> None:
    """One value at a time, seeded and edge coins: the server half's privatizer gives the device's record
    and leaves the stream where the device did."""
    mech = make(name, epsilon=epsilon, k=k, **extra)
    server = server_of(mech)
    values = _values(mech, k) if k else [f"word-{i}" for i in range(50)]
    edges = _edges(mech)
    sources: list[Callable[[int], Any]] = [SeededRandom, lambda s: EdgeRandom(s, edges)]
    for seed in range(25):
        value = values[(seed * 37) % len(values)]
        for source in sources:
            pure, batch_rng = source(seed), source(seed)
            device = _wire(mech, value, pure)
            batch = server.privatize_many([value], batch_rng)  # type: ignore[attr-defined]
            assert [device] == server.encode_batch(batch), (name, seed)  # type: ignore[attr-defined]
            assert pure.draw(1) == batch_rng.draw(1)


@pytest.mark.parametrize("name", NAMES)
def test_a_value_outside_the_domain_is_refused(name: str) -> None:
    """A category not in the list, or a value of the wrong type, is refused before any coin is drawn."""
    mech = make(name, epsilon=2.0, k=5)
    with pytest.raises(InputError):
        mech.check_value(17)
    if name != "olh":
        with pytest.raises(InputError, match="takes one of its 5 categories"):
            mech.check_value("c5")


@pytest.mark.parametrize(
    ("name", "extra", "field"),
    [
        ("grr", {"categories": ("a",)}, "categories"),
        ("grr", {"categories": ("a", "a")}, "categories"),
        ("ss", {"d": 5}, "d"),
        ("ss", {"d": -1}, "d"),
        ("pgr", {"q": 4, "t": 3}, "q"),
        ("pgr", {"q": 2, "t": 2}, "t"),
        ("pgr", {"q": 65_537, "t": 3}, "q"),
        ("olh", {"g": 1}, "g"),
        ("olh", {"seeds": -3}, "seeds"),
        ("olh", {"seeds": 1 << 22, "g": 64}, "seeds"),
    ],
)
def test_bad_parameters_name_the_field(name: str, extra: dict[str, Any], field: str) -> None:
    """A parameter out of its range is a ParameterError naming it."""
    build: Callable[[], object] = (
        (lambda: GeneralizedRandomizedResponse(epsilon=1.0, **extra))
        if "categories" in extra
        else (lambda: make(name, epsilon=1.0, k=5, **extra))
    )
    with pytest.raises(ParameterError) as err:
        build()
    assert err.value.name == field


def test_defaults_follow_from_epsilon_and_the_domain() -> None:
    """g = round(e^ε + 1); d near k/(e^ε + 1); pgr's q near e^ε + 1 when its table allows; the same
    mechanism whether the defaults are left implicit or written out."""
    olh = OptimalLocalHashing(epsilon=4.0, seed=SEED)
    assert (olh.g, olh.seeds) == (56, 4096)
    assert OptimalLocalHashing(epsilon=8.0, seed=SEED).seeds * OptimalLocalHashing(epsilon=8.0, seed=SEED).g <= 1 << 22
    assert olh == OptimalLocalHashing(epsilon=4.0, seed=SEED, g=56, seeds=4096)
    ss = SubsetSelection(epsilon=4.0, categories=_categories(843))
    assert ss.d in (15, 16)
    assert SubsetSelection(epsilon=8.0, categories=_categories(8)).d == 1
    pgr = ProjectiveGeometryResponse(epsilon=4.0, categories=_categories(843))
    assert 40 <= pgr.q <= 60
    assert pgr.geometry.points >= 843
    assert pgr == ProjectiveGeometryResponse(epsilon=4.0, categories=_categories(843), q=pgr.q, t=pgr.t)


# ------------------------------------------------------------------ wire form


@pytest.mark.parametrize(("name", "epsilon", "k", "extra"), PARITY)
def test_records_round_trip_through_the_decoder(name: str, epsilon: float, k: int, extra: dict[str, Any]) -> None:
    """Privatized records in wire form decode to a batch that encodes back to the same wire form."""
    mech = make(name, epsilon=epsilon, k=k, **extra)
    server = server_of(mech)
    values = (_values(mech, k) if k else [f"w{i}" for i in range(30)])[:30]
    wire = [_wire(mech, v, SeededRandom(i)) for i, v in enumerate(values)]
    assert server.encode_batch(server.decode_records(wire)) == wire  # type: ignore[attr-defined]
    assert len(server.decode_records([])) == 0


MALFORMED: list[tuple[str, object, str, str]] = [
    ("grr", {"a": 1}, "bad-type", "records"),
    ("grr", [1, True], "bad-type", "records[1]"),
    ("grr", [0, 5], "out-of-range", "records[1]"),
    ("grr", [-1], "out-of-range", "records[0]"),
    ("oue", [b"\x00\x00"], "bad-length", "records[0]"),
    ("oue", ["ab"], "bad-type", "records[0]"),
    ("oue", [b"\x01"], "bad-padding", "records[0]"),
    ("ss", [[0, 1, 2]], "bad-length", "records[0]"),
    ("ss", [[1, 0]], "out-of-range", "records[0][1]"),
    ("ss", [[1, 1]], "out-of-range", "records[0][1]"),
    ("ss", [[0, 64]], "out-of-range", "records[0][1]"),
    ("ss", [(0, 1)], "bad-type", "records[0]"),
    ("pgr", [7], "out-of-range", "records[0]"),
    ("pgr", [1.0], "bad-type", "records[0]"),
    ("olh", [[0]], "bad-length", "records[0]"),
    ("olh", [[4096, 0]], "out-of-range", "records[0].index"),
    ("olh", [[0, 56]], "out-of-range", "records[0].value"),
    ("olh", [[0, "1"]], "bad-type", "records[0].value"),
    ("olh", [5], "bad-type", "records[0]"),
]


@pytest.mark.parametrize(("name", "raw", "reason", "field"), MALFORMED)
def test_malformed_records_are_refused_with_a_reason(name: str, raw: object, reason: str, field: str) -> None:
    """Wrong types, lengths, ranges, orders and padding are refused naming the reason and the field."""
    extra: dict[str, Any] = {"d": 2} if name == "ss" else {"q": 2, "t": 3} if name == "pgr" else {}
    mech = make(name, epsilon=4.0, k=64 if name == "ss" else 5, **extra)
    with pytest.raises(MalformedReportError) as err:
        server_of(mech).decode_records(raw)
    assert (err.value.reason, err.value.field) == (reason, field)


def test_subset_selection_in_bits_refuses_a_vector_of_another_size() -> None:
    """In the packed form a subset must have exactly d members."""
    mech = SubsetSelection(epsilon=0.5, categories=_categories(16))
    assert mech.wire_form == "bits"
    server = server_of(mech)
    with pytest.raises(MalformedReportError) as err:
        server.decode_records([b"\xff\xff"])
    assert (err.value.reason, err.value.field) == ("bad-length", "records[0]")


_ANY = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 70_000) | st.binary(max_size=3) | st.text(max_size=2),
    lambda inner: st.lists(inner, max_size=4),
    max_leaves=12,
)


@pytest.mark.parametrize("name", NAMES)
@given(raw=_ANY)
def test_decoder_is_total(name: str, raw: object) -> None:
    """Any plain value decodes to a batch or raises MalformedReportError, nothing else."""
    extra: dict[str, Any] = {"d": 2} if name == "ss" else {}
    mech = make(name, epsilon=4.0, k=5, **extra)
    with contextlib.suppress(MalformedReportError):
        server_of(mech).decode_records(raw)


# ------------------------------------------------------------------ aggregates


def _fold(server: ServerMechanism, wire: list[object]) -> Any:
    agg = server.new_aggregate()
    server.fold(agg, server.decode_records(wire))
    return agg


@pytest.mark.parametrize("name", NAMES)
def test_aggregates_merge_and_round_trip(name: str) -> None:
    """Folding parts and merging equals folding all; to_plain/restore gives the same estimates."""
    mech = make(name, epsilon=2.0, k=20)
    server = frequency_server(server_of(mech))
    values = [f"c{i % 7}" for i in range(300)]
    wire = [_wire(mech, v, SeededRandom(i)) for i, v in enumerate(values)]
    whole = _fold(server, wire)
    merged = _fold(server, wire[:100]).merge(_fold(server, wire[100:250])).merge(_fold(server, wire[250:]))
    assert merged.n == whole.n == 300
    names = list(_categories(20))
    a = server.estimate_frequencies(whole, names)
    b = server.estimate_frequencies(server.restore_aggregate(merged.to_plain()), names)
    np.testing.assert_array_equal(a.values, b.values)
    np.testing.assert_array_equal(a.standard_errors, b.standard_errors)


@pytest.mark.parametrize("name", NAMES)
def test_restore_refuses_state_that_does_not_fit(name: str) -> None:
    """A saved aggregate of another size, or with a count past n, is a StateError."""
    mech = make(name, epsilon=2.0, k=20)
    other = make(name, epsilon=2.0, k=21, seeds=2048) if name == "olh" else make(name, epsilon=2.0, k=40)
    server = server_of(mech)
    foreign = server_of(other).new_aggregate().to_plain()
    with pytest.raises(StateError):
        server.restore_aggregate(foreign)
    with pytest.raises(StateError):
        server.restore_aggregate({"n": 1})


@pytest.mark.parametrize("name", NAMES)
def test_an_empty_aggregate_estimates_nan(name: str) -> None:
    """No reports: every count and SE is NaN, never a number."""
    mech = make(name, epsilon=2.0, k=20)
    server = frequency_server(server_of(mech))
    est = server.estimate_frequencies(server.new_aggregate(), list(_categories(20)))
    assert est.n == 0
    assert np.isnan(est.values).all()
    assert np.isnan(est.standard_errors).all()


# ------------------------------------------------------------- unbiased, honest SE


def _zipf(n: int, k: int, s: float = 1.1) -> list[int]:
    weights = 1.0 / np.arange(1, k + 1) ** s
    counts = np.floor(weights / weights.sum() * n).astype(np.int64)
    counts[0] += n - int(counts.sum())
    return [int(c) for c in counts]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "epsilon"), [(n, e) for n in NAMES for e in (1.0, 4.0)])
def test_estimates_cover_at_95_percent(name: str, epsilon: float) -> None:
    """Zipf(1.1) over 30 categories, 4,000 reports, 150 seeded runs (olh: a new public seed per run, as its
    variance is over the family): estimate ± 1.96 SE covers the truth in 95 % of the 4,500 (run,
    category) pairs within 4 binomial SEs, and the mean error of each category is within 5 SE of 0."""
    k, n, reps = 30, 4_000, 150
    counts = _zipf(n, k)
    values = [f"c{i}" for i, c in enumerate(counts) for _ in range(c)]
    truth = np.array(counts, dtype=np.float64)
    rng = SeededRandom(7)
    z = np.empty((reps, k))
    for rep in range(reps):
        seed = hashlib.blake2b(f"{name}-{epsilon}-{rep}".encode(), digest_size=16).digest()
        mech = make(name, epsilon=epsilon, k=k, seed=seed)
        server = frequency_server(server_of(mech))
        agg = server.new_aggregate()
        server.fold(agg, server.privatize_many(values, rng))  # type: ignore[attr-defined]
        est = server.estimate_frequencies(agg, list(_categories(k)))
        z[rep] = (est.values - truth) / est.standard_errors
    covered = float(np.mean(np.abs(z) <= 1.959964))
    pairs = reps * k
    assert abs(covered - 0.95) <= 4 * math.sqrt(0.95 * 0.05 / pairs), covered
    assert np.all(np.abs(z.mean(axis=0)) <= 5 / math.sqrt(reps))


@pytest.mark.parametrize("name", NAMES)
def test_every_oracle_is_a_frequency_mechanism(name: str) -> None:
    """Each is asked as the collector asks: kind, fixed categories (or a dictionary), a server half."""
    mech = make(name, epsilon=3.0, k=12)
    assert mech.kind is (EstimateKind.DICTIONARY if name == "olh" else EstimateKind.CATEGORIES)
    frequency_server(server_of(mech))
    assert mech.privacy_figures() == {"epsilon_report": mech.epsilon_report}
    assert mech.max_record_bytes >= 1


def test_unary_encoding_in_bulk_is_the_device_report_for_report() -> None:
    """20,000 reports at k = 843 in one batch: the reports whose ties outrun their spare words (about one
    in 1,700) take the device's extra words, and every record is the device's, one after the other."""
    mech = OptimizedUnaryEncoding(epsilon=4.0, categories=_categories(843))
    values = [f"c{(i * 37) % 843}" for i in range(20_000)]
    device, bulk = SeededRandom(1), SeededRandom(1)
    expected = [mech.privatize(v, None, device)[0] for v in values]
    got = server_of(mech).privatize_records(values, bulk)  # type: ignore[attr-defined]
    assert got == expected
    assert device.draw(1) == bulk.draw(1)


@pytest.mark.parametrize("name", ["grr", "ss", "pgr", "olh"])
def test_a_tiny_epsilon_is_refused_naming_it(name: str) -> None:
    """Below 1e-9 the coins' rounding would dominate the gap between outputs: a ParameterError on epsilon."""
    with pytest.raises(ParameterError) as err:
        make(name, epsilon=1e-12, k=5)
    assert err.value.name == "epsilon"
    assert make(name, epsilon=1e-9, k=5).epsilon_report <= 1e-9


@pytest.mark.parametrize("epsilon", [8.5, 12.0, 20.0, 64.0])
def test_olh_builds_at_any_epsilon(epsilon: float) -> None:
    """The default g stops at 4,096 (with 1,024 hash functions): a large ε builds, and stays ε-LDP."""
    mech = OptimalLocalHashing(epsilon=epsilon, seed=SEED)
    assert (mech.g, mech.seeds) == (4096, 1024)
    assert mech.epsilon_report <= epsilon


@pytest.mark.parametrize("sentinel", [0.0, False])
def test_a_default_is_asked_for_by_the_integer_0_only(sentinel: object) -> None:
    """d = 0.0 or False is a wrong parameter, not a request for the default."""
    with pytest.raises(ParameterError) as err:
        SubsetSelection(epsilon=2.0, categories=_categories(10), d=sentinel)  # type: ignore[arg-type]
    assert err.value.name == "d"


@pytest.mark.parametrize("name", ["grr", "ss", "pgr"])
def test_a_saved_aggregate_whose_counts_do_not_add_up_is_refused(name: str) -> None:
    """Counts that are not the records of n reports (one per report, d for subset selection) are a StateError."""
    mech = make(name, epsilon=2.0, k=20)
    server = server_of(mech)
    agg = server.new_aggregate()
    server.fold(agg, server.decode_records([_wire(mech, "c3", SeededRandom(i)) for i in range(5)]))
    plain: dict[str, object] = dict(agg.to_plain())  # type: ignore[call-overload]
    assert server.restore_aggregate(plain).n == 5
    with pytest.raises(StateError, match="add up"):
        server.restore_aggregate({**plain, "n": 6})
