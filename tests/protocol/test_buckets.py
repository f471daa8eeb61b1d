"""Bucketing of counters: exact edges, clamping, vectorised = scalar, plain round trips, clear errors."""

from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.buckets import (
    MAX_EDGE,
    Buckets,
    CustomBuckets,
    ExponentialBuckets,
    LinearBuckets,
    buckets_from_plain,
)
from protocol.errors import InputError, ParameterError
from protocol.server.buckets import buckets_of

DAY = LinearBuckets(low=0, high=86_400, count=32)
TENTHS = LinearBuckets(low=0, high=1, count=10)
THIRDS = LinearBuckets(low=0, high=100, count=3)
OFFSET = LinearBuckets(low=10, high=20, count=5)
DOUBLING = ExponentialBuckets(start=60, factor=2, count=6)
FRACTIONAL = ExponentialBuckets(start=0.5, factor=1.5, count=5)
CUSTOM = CustomBuckets(edges=(0, 60, 600, 3600))
CUSTOM_FLOAT = CustomBuckets(edges=(0.1, 0.2, 0.30000000000000004, 7.5))
ALL: list[Buckets] = [DAY, TENTHS, THIRDS, OFFSET, DOUBLING, FRACTIONAL, CUSTOM, CUSTOM_FLOAT]


def test_linear_edges_are_exact_for_integer_counters() -> None:
    """24 h in 32 buckets: edges are multiples of 2700 s and each edge opens its bucket."""
    assert DAY.edges == tuple(float(2700 * i) for i in range(33))
    for i in range(32):
        assert DAY.bucket_of(2700 * i) == i
        assert DAY.bucket_of(2700 * i + 2699) == i
        if i:
            assert DAY.bucket_of(2700 * i - 1) == i - 1
    assert DAY.bucket_of(86_399) == 31


def test_linear_edges_have_no_float_drift() -> None:
    """Edges are the float nearest the exact rational: 0.3 is in bucket 3, not 2."""
    assert TENTHS.edges == tuple(i / 10 for i in range(11))
    for i in range(10):
        assert TENTHS.bucket_of(i / 10) == i
        if i:
            assert TENTHS.bucket_of(math.nextafter(i / 10, 0.0)) == i - 1
    assert THIRDS.edges[1] == 100 / 3
    assert [THIRDS.bucket_of(x) for x in (0, 33, 34, 66, 67, 99)] == [0, 0, 1, 1, 2, 2]


def test_values_outside_the_range_are_clamped() -> None:
    """Below the first edge is bucket 0; at or above the last finite edge is the last bucket."""
    assert OFFSET.bucket_of(0) == 0
    assert OFFSET.bucket_of(9.999) == 0
    assert OFFSET.bucket_of(12) == 1
    assert OFFSET.bucket_of(20) == 4
    assert DAY.bucket_of(86_400) == 31
    assert DAY.bucket_of(10**30) == 31
    assert CUSTOM.bucket_of(3600) == 2
    assert CUSTOM_FLOAT.bucket_of(0) == 0


def test_exponential_edges() -> None:
    """[0, start), [start, start·factor), ..., [start·factor^(count-2), ∞), exactly."""
    assert DOUBLING.count == 6
    assert DOUBLING.edges == (0.0, 60.0, 120.0, 240.0, 480.0, 960.0, math.inf)
    expected = [(0, 0), (59, 0), (60, 1), (119, 1), (120, 2), (479, 3), (480, 4), (959, 4), (960, 5), (10**15, 5)]
    for value, bucket in expected:
        assert DOUBLING.bucket_of(value) == bucket, value
    assert FRACTIONAL.edges == (0.0, 0.5, 0.75, 1.125, 1.6875, math.inf)
    assert FRACTIONAL.bucket_of(0.75) == 2
    assert FRACTIONAL.bucket_of(math.nextafter(0.75, 0.0)) == 1


def test_custom_edges() -> None:
    """Custom edges are used as given; count is len(edges) - 1."""
    assert CUSTOM.count == 3
    assert CUSTOM.edges == (0, 60, 600, 3600)
    assert [CUSTOM.bucket_of(x) for x in (0, 59, 60, 599, 600, 3599)] == [0, 0, 1, 1, 2, 2]
    assert CUSTOM_FLOAT.bucket_of(0.30000000000000004) == 2
    assert CUSTOM_FLOAT.bucket_of(0.3) == 1


def _probe_values(b: Buckets) -> list[float]:
    """Every finite edge, its neighbours one ulp and one unit away, and far values."""
    out: list[float] = [0, 0.0, 1, 10**18, 2**60 + 1, 1e300]
    for e in b.edges:
        if math.isfinite(e):
            out += [e, math.nextafter(e, math.inf)]
            if e > 0:
                out += [math.nextafter(e, 0.0)]
            if float(e).is_integer():
                out += [int(e), int(e) + 1] + ([int(e) - 1] if e >= 1 else [])
    return out


@pytest.mark.parametrize("b", ALL, ids=repr)
def test_vectorised_equals_scalar_at_the_edges(b: Buckets) -> None:
    """buckets_of on int and float arrays of every width agrees with bucket_of at and around every edge."""
    values = _probe_values(b)
    ints = [v for v in values if isinstance(v, int)]
    floats = [float(v) for v in values if isinstance(v, float)]
    for dtype in (np.int64, np.uint64, np.int32, np.uint16, np.int8):
        info = np.iinfo(dtype)
        sel = [v for v in ints if info.min <= v <= info.max]
        got = buckets_of(b, np.array(sel, dtype=dtype))
        assert got.dtype == np.int64
        assert got.tolist() == [b.bucket_of(v) for v in sel], dtype
    assert buckets_of(b, np.array(floats)).tolist() == [b.bucket_of(v) for v in floats]
    f32 = np.array([v for v in floats if v < 1e38], dtype=np.float32)
    assert buckets_of(b, f32).tolist() == [b.bucket_of(v) for v in f32]


@given(
    st.sampled_from(ALL),
    st.lists(st.integers(0, 2**63 - 1), max_size=30),
    st.lists(st.floats(min_value=0.0, max_value=1e20, allow_nan=False), max_size=30),
)
def test_vectorised_equals_scalar_property(b: Buckets, ints: list[int], floats: list[float]) -> None:
    """For arbitrary non-negative ints and floats, the vectorised and scalar paths agree."""
    assert buckets_of(b, np.array(ints, dtype=np.int64)).tolist() == [b.bucket_of(v) for v in ints]
    assert buckets_of(b, np.array(floats, dtype=np.float64)).tolist() == [b.bucket_of(v) for v in floats]


@pytest.mark.parametrize("bad", [-1, -0.5, math.nan, math.inf, -math.inf, True, "3", None, np.bool_(True)])
def test_bad_scalar_values_are_refused(bad: object) -> None:
    """Negative, NaN, infinite and non-numeric values are not counters."""
    with pytest.raises(InputError):
        DAY.bucket_of(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad",
    [np.array([1, -1]), np.array([1.0, math.nan]), np.array([math.inf]), np.array([-0.5]), np.array(["a"])],
)
def test_bad_arrays_are_refused(bad: np.ndarray[Any, Any]) -> None:
    """A negative, NaN or infinite entry, or a non-numeric array, is refused as a whole."""
    with pytest.raises(InputError):
        buckets_of(DAY, bad)


def test_numpy_scalars_are_accepted() -> None:
    """numpy integer and float scalars bucket like the Python numbers they hold."""
    assert DAY.bucket_of(np.int64(2700)) == 1
    assert DAY.bucket_of(np.float32(2700.0)) == 1


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: LinearBuckets(low=-1, high=10, count=2), "low"),
        (lambda: LinearBuckets(low=math.nan, high=10, count=2), "low"),
        (lambda: LinearBuckets(low=5, high=5, count=2), "high"),
        (lambda: LinearBuckets(low=0, high=2**54, count=2), "high"),
        (lambda: LinearBuckets(low=0, high=10, count=1), "count"),
        (lambda: LinearBuckets(low=0, high=10, count=65_537), "count"),
        (lambda: LinearBuckets(low=0, high=10, count=True), "count"),
        (lambda: LinearBuckets(low=0, high=10, count=2.0), "count"),  # type: ignore[arg-type]
        (lambda: LinearBuckets(low=0, high=5e-324, count=4), "count"),
        (lambda: ExponentialBuckets(start=0, factor=2, count=4), "start"),
        (lambda: ExponentialBuckets(start=1, factor=1, count=4), "factor"),
        (lambda: ExponentialBuckets(start=1, factor="2", count=4), "factor"),  # type: ignore[arg-type]
        (lambda: ExponentialBuckets(start=1, factor=2, count=60), "count"),
        (lambda: CustomBuckets(edges=(0, 1)), "edges"),
        (lambda: CustomBuckets(edges="0,1,2"), "edges"),  # type: ignore[arg-type]
        (lambda: CustomBuckets(edges=(0, 2, 1)), "edges[2]"),
        (lambda: CustomBuckets(edges=(0, 1, 1)), "edges[2]"),
        (lambda: CustomBuckets(edges=(-1, 1, 2)), "edges[0]"),
        (lambda: CustomBuckets(edges=(0, 1, math.inf)), "edges[2]"),
        (lambda: CustomBuckets(edges=(0, None, 2)), "edges[1]"),  # type: ignore[arg-type]
    ],
)
def test_bad_parameters_name_the_field(make: Any, field: str) -> None:
    """Each invalid parameter raises ParameterError naming that parameter and the allowed range."""
    with pytest.raises(ParameterError) as info:
        make()
    assert info.value.name == field
    assert field in str(info.value)
    assert info.value.allowed


@pytest.mark.parametrize("b", ALL, ids=repr)
def test_plain_round_trip(b: Buckets) -> None:
    """to_plain -> msgpack -> buckets_from_plain gives an equal bucketing with the same edges."""
    plain = b.to_plain()
    back = buckets_from_plain(msgpack.unpackb(msgpack.packb(plain)))
    assert back == b
    assert back.edges == b.edges
    assert back.to_plain() == plain


@given(st.lists(st.integers(0, 10**6), min_size=3, max_size=20, unique=True))
def test_custom_plain_round_trip_property(edges: list[int]) -> None:
    """Any valid custom edge list survives the plain round trip."""
    b = CustomBuckets(edges=tuple(sorted(edges)))
    assert buckets_from_plain(b.to_plain()) == b


def test_bad_dicts_give_distinct_clear_messages() -> None:
    """Each kind of bad dict raises ParameterError naming the field, and the messages differ."""
    cases: list[tuple[object, str]] = [
        ([1, 2], "buckets"),
        ({}, "kind"),
        ({"kind": "log"}, "kind"),
        ({"kind": 3}, "kind"),
        ({"kind": "linear", "low": 0, "high": 10}, "count"),
        ({"kind": "linear", "low": "0", "high": 10, "count": 4}, "low"),
        ({"kind": "linear", "low": 0, "high": 10, "count": 4, "width": 2}, "width"),
        ({"kind": "exponential", "start": 1, "count": 4}, "factor"),
        ({"kind": "exponential", "start": 1, "factor": [2], "count": 4}, "factor"),
        ({"kind": "custom"}, "edges"),
        ({"kind": "custom", "edges": "0,1,2"}, "edges"),
        ({"kind": "custom", "edges": [0, 1, "2"]}, "edges[2]"),
    ]
    messages = []
    for data, field in cases:
        with pytest.raises(ParameterError) as info:
            buckets_from_plain(data)
        assert info.value.name == field, data
        assert repr(field) in str(info.value)
        messages.append(str(info.value))
    assert len(set(messages)) == len(messages)
    assert "<missing>" in messages[1]
    assert "<missing>" in messages[4]


def test_limits() -> None:
    """The largest bucketings are accepted and edges stay within 2**53."""
    b = LinearBuckets(low=0, high=MAX_EDGE, count=65_536)
    assert b.count == 65_536
    assert b.bucket_of(MAX_EDGE - 1) == 65_535
    e = ExponentialBuckets(start=1, factor=2, count=55)
    assert e.edges[-2] == MAX_EDGE
    assert e.bucket_of(2**60) == 54
