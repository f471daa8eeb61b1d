"""The report format: round trips for every mechanism, each rejection reason, no identifiers, sizes."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import wire
from protocol.errors import MalformedReportError
from protocol.randomness import SeededRandom, SystemRandom
from protocol.registry import MECHANISM_NAMES, Registry, UseCase, parse_registry
from protocol.wire import (
    DEFAULT_MAX_SIZE,
    FORMAT_VERSION,
    MAX_DEPTH,
    REASONS,
    DecodedReport,
    Report,
    decode_report,
    encode_report,
    make_report,
    max_report_size,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "usecases.example.toml"

# ---------------------------------------------------------------------------------------------
# One small use case per mechanism, the values it privatizes, and its batch invariants.
# Shared with test_wire_fuzz.py.
# ---------------------------------------------------------------------------------------------


def _bits01(a: np.ndarray[Any, Any]) -> None:
    assert a.dtype == np.uint8
    assert set(np.unique(a).tolist()) <= {0, 1}


def _check_bits_only(mech: Any, batch: Any) -> None:
    assert batch.bits.ndim == 1
    _bits01(batch.bits)


def _check_dbitflip(mech: Any, batch: Any) -> None:
    n = len(batch)
    assert batch.buckets.shape == (n, mech.d)
    assert batch.bits.shape == (n, mech.d)
    assert ((batch.buckets >= 0) & (batch.buckets < mech.k)).all()
    for row in batch.buckets.tolist():
        assert len(set(row)) == mech.d
    _bits01(batch.bits)


def _check_rappor(mech: Any, batch: Any) -> None:
    n = len(batch)
    nbytes = (mech.k + 7) // 8
    assert batch.cohorts.shape == (n,)
    assert ((batch.cohorts >= 0) & (batch.cohorts < mech.cohorts)).all()
    assert batch.bits.shape == (n, nbytes)
    assert batch.bits.dtype == np.uint8
    pad = (-mech.k) % 8
    if n and pad:
        assert not (batch.bits[:, -1] & ((1 << pad) - 1)).any()


def _check_cms(mech: Any, batch: Any) -> None:
    n = len(batch)
    nbytes = (mech.m + 7) // 8
    assert batch.indices.shape == (n,)
    assert ((batch.indices >= 0) & (batch.indices < mech.k)).all()
    assert batch.bits.shape == (n, nbytes)
    assert batch.bits.dtype == np.uint8
    pad = (-mech.m) % 8
    if n and pad:
        assert not (batch.bits[:, -1] & ((1 << pad) - 1)).any()


def _check_indices(bound: Callable[[Any], int], field: str) -> Callable[[Any, Any], None]:
    def check(mech: Any, batch: Any) -> None:
        a = getattr(batch, field)
        assert a.dtype == np.int64
        assert ((a >= 0) & (a < bound(mech))).all()

    return check


def _check_oue(mech: Any, batch: Any) -> None:
    assert batch.bits.shape == (len(batch), (mech.k + 7) // 8)
    pad = (-mech.k) % 8
    if len(batch) and pad:
        assert not (batch.bits[:, -1] & ((1 << pad) - 1)).any()


def _check_ss(mech: Any, batch: Any) -> None:
    assert batch.members.shape == (len(batch), mech.d)
    assert (np.diff(batch.members, axis=1) > 0).all()
    assert ((batch.members >= 0) & (batch.members < mech.k)).all()


def _check_olh(mech: Any, batch: Any) -> None:
    assert ((batch.indices >= 0) & (batch.indices < mech.seeds)).all()
    assert ((batch.values >= 0) & (batch.values < mech.g)).all()


def _check_hcms(mech: Any, batch: Any) -> None:
    n = len(batch)
    assert batch.j.shape == batch.ell.shape == batch.bits.shape == (n,)
    assert ((batch.j >= 0) & (batch.j < mech.k)).all()
    assert ((batch.ell >= 0) & (batch.ell < mech.m)).all()
    _bits01(batch.bits)


def _check_sfp(mech: Any, batch: Any) -> None:
    n = len(batch)
    assert batch.positions.shape == (n,)
    assert ((batch.positions >= 0) & (batch.positions < mech.positions)).all()
    assert len(batch.fragment) == len(batch.word) == n
    _check_cms(mech.fragment_cms, batch.fragment)
    _check_cms(mech.word_cms, batch.word)


@dataclass(frozen=True)
class Case:
    """A small use case of one mechanism for the wire tests."""

    mechanism: str
    module: str
    table: str
    values: st.SearchStrategy[Any]
    check: Callable[[Any, Any], None]
    sample: Any  # one value to privatize

    @property
    def use_case(self) -> str:
        return f"t-{self.mechanism}"


CASES: tuple[Case, ...] = (
    Case("rr", "protocol.randomized_response", "epsilon = 1.0", st.integers(0, 1), _check_bits_only, 1),
    Case(
        "one-bit-mean",
        "protocol.one_bit_mean",
        "epsilon = 1.0\nparameters = { m = 3600, gamma = 0.2 }",
        st.integers(0, 3600),
        _check_bits_only,
        1234,
    ),
    Case(
        "dbitflip",
        "protocol.dbitflip",
        'epsilon = 1.0\nparameters = { d = 4, buckets = { kind = "linear", low = 0, high = 3600, count = 32 } }',
        st.integers(0, 3599),
        _check_dbitflip,
        1234,
    ),
    Case(
        "rappor",
        "protocol.rappor",
        "epsilon = 2.0\nparameters = { k = 20, h = 2, cohorts = 8, f = 0.5, p = 0.5, q = 0.75 }",
        st.text(max_size=12),
        _check_rappor,
        "example.com",
    ),
    Case(
        "cms",
        "protocol.cms",
        "epsilon = 4.0\nparameters = { k = 16, m = 64 }",
        st.text(max_size=12),
        _check_cms,
        "😀",
    ),
    Case(
        "hcms",
        "protocol.hcms",
        "epsilon = 4.0\nparameters = { k = 16, m = 64 }",
        st.text(max_size=12),
        _check_hcms,
        "example.com",
    ),
    Case(
        "sfp",
        "protocol.sfp",
        "epsilon = 8.0\nparameters = { epsilon = 2.0, epsilon_fragment = 6.0, k = 16, m = 64,"
        " k_fragment = 16, m_fragment = 64 }",
        st.text(max_size=14),
        _check_sfp,
        "bruh",
    ),
    Case(
        "olh",
        "protocol.olh",
        "epsilon = 4.0\nparameters = { seeds = 64 }",
        st.text(max_size=12),
        _check_olh,
        "example.com",
    ),
    Case(
        "grr",
        "protocol.grr",
        'epsilon = 2.0\nparameters = { categories = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"] }',
        st.sampled_from("abcdefghijkl"),
        _check_indices(lambda m: m.k, "categories"),
        "c",
    ),
    Case(
        "oue",
        "protocol.oue",
        'epsilon = 2.0\nparameters = { categories = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"] }',
        st.sampled_from("abcdefghijkl"),
        _check_oue,
        "c",
    ),
    Case(
        "ss",
        "protocol.ss",
        'epsilon = 1.0\nparameters = { categories = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"] }',
        st.sampled_from("abcdefghijkl"),
        _check_ss,
        "c",
    ),
    Case(
        "pgr",
        "protocol.pgr",
        'epsilon = 2.0\nparameters = { categories = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"] }',
        st.sampled_from("abcdefghijkl"),
        _check_indices(lambda m: m.geometry.points, "points"),
        "c",
    ),
)


DAILY_LIMIT = 8


def registry_text(cases: Sequence[Case] = CASES) -> str:
    """A registry with one small use case per mechanism."""
    parts = ["format = 1", 'salt = "000102030405060708090a0b0c0d0e0f"']
    for c in cases:
        parts.append(
            f'[use_cases.{c.use_case}]\nmechanism = "{c.mechanism}"\nperiod = "6h"\n'
            f"daily_limit = {DAILY_LIMIT}\nlifetime_epsilon = 1000\n{c.table}\n"
            f"[use_cases.{c.use_case}.collector]\nmin_reports = 0\n"
        )
    return "\n".join(parts)


def small_registry() -> Registry:
    """The registry of the wire tests."""
    return parse_registry(registry_text(), source="test-registry")


REGISTRY = small_registry()


def privatize(uc: UseCase, values: Sequence[Any], *, seed: int) -> list[Any]:
    """Records of ``values`` from one device (state set up once), with seeded coins."""
    mech: Any = uc.mechanism
    rng = SeededRandom(seed)
    state = mech.setup(rng)
    records = []
    for v in values:
        record, state = mech.privatize(v, state, rng)
        records.append(record)
    return records


def assert_same_batch(got: Any, want: Any) -> None:
    """Two columnar batches hold the same records (same type, shapes, dtypes and values)."""
    assert type(got) is type(want)
    assert len(got) == len(want)
    for f in dataclasses.fields(want):
        a, b = getattr(got, f.name), getattr(want, f.name)
        if isinstance(b, np.ndarray):
            assert isinstance(a, np.ndarray), f.name
            assert a.dtype == b.dtype, f"{f.name}: {a.dtype} != {b.dtype}"
            assert a.shape == b.shape, f.name
            assert np.array_equal(a, b), f.name
        elif dataclasses.is_dataclass(b):
            assert_same_batch(a, b)  # SFP's batch holds two CMS batches
        else:
            assert a == b, f.name


def roundtrip(uc: UseCase, records: Sequence[Any], *, period: int = 81_234) -> tuple[Report, DecodedReport]:
    """Encode a report of ``records`` and decode it again."""
    report = make_report(uc, REGISTRY, period=period, records=records, rng=SeededRandom(3))
    return report, decode_report(encode_report(report), REGISTRY)


def valid_message(uc: UseCase, *, n: int = 2, seed: int = 1) -> bytes:
    """A valid encoded report of ``n`` records."""
    case = next(c for c in CASES if c.use_case == uc.name)
    records = privatize(uc, [case.sample] * n, seed=seed)
    return encode_report(make_report(uc, REGISTRY, period=81_234, records=records, rng=SeededRandom(seed)))


def envelope(data: bytes) -> dict[str, Any]:
    """The decoded envelope map of an encoded report (for building hostile variants)."""
    env: dict[str, Any] = msgpack.unpackb(data, raw=False)
    return env


def pack(obj: object) -> bytes:
    """msgpack bytes of ``obj``."""
    out: bytes = msgpack.packb(obj, use_bin_type=True)
    return out


# ---------------------------------------------------------------------------------------------
# Round trips
# ---------------------------------------------------------------------------------------------


def test_every_mechanism_is_covered() -> None:
    """The wire tests cover every mechanism the registry knows."""
    assert {c.mechanism for c in CASES} == set(MECHANISM_NAMES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.mechanism)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_roundtrip_gives_back_the_same_report(case: Case, data: st.DataObject) -> None:
    """encode then decode returns the envelope unchanged and the batch of mechanism.batch(records)."""
    uc = REGISTRY[case.use_case]
    values = data.draw(st.lists(case.values, min_size=1, max_size=DAILY_LIMIT), label="values")
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    period = data.draw(st.integers(0, uc.period.max_index), label="period")
    records = privatize(uc, values, seed=seed)
    report, decoded = roundtrip(uc, records, period=period)
    assert decoded.use_case is uc
    assert decoded.version == FORMAT_VERSION
    assert report.definition == uc.definition
    assert decoded.period == period
    assert decoded.report_id == report.report_id
    assert decoded.count == len(records)
    mech: Any = uc.server  # the typed server half: batch() takes this mechanism's own records
    assert_same_batch(decoded.batch, mech.batch(records))
    case.check(uc.mechanism, decoded.batch)
    encoded = encode_report(report)
    assert len(encoded) <= uc.max_report_bytes
    assert wire._encoder_layout(encoded) == (uc.name, len(records))  # honest reports take the fast header path


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.mechanism)
def test_decoded_batch_folds_into_an_aggregate(case: Case) -> None:
    """A decoded batch is exactly what aggregate.add takes."""
    uc = REGISTRY[case.use_case]
    _, decoded = roundtrip(uc, privatize(uc, [case.sample] * 3, seed=9))
    agg = uc.server.new_aggregate()
    uc.server.fold(agg, decoded.batch)
    assert agg.n == 3


def test_encoding_is_deterministic_and_ordered() -> None:
    """The envelope keys are written in the fixed order v, u, h, p, i, r."""
    uc = REGISTRY["t-rr"]
    data = valid_message(uc)
    assert list(envelope(data)) == ["v", "u", "h", "p", "i", "r"]
    assert data == valid_message(uc)


# ---------------------------------------------------------------------------------------------
# Every rejection reason
# ---------------------------------------------------------------------------------------------


def _reject(data: bytes, reason: str, field: str | None = None, **kw: Any) -> MalformedReportError:
    with pytest.raises(MalformedReportError) as info:
        decode_report(data, REGISTRY, **kw)
    assert info.value.reason == reason, info.value
    assert info.value.reason in REASONS
    if field is not None:
        assert info.value.field == field, info.value
    return info.value


def _variant(**changes: Any) -> bytes:
    env = envelope(valid_message(REGISTRY["t-rr"]))
    for key, value in changes.items():
        if value is _DROP:
            del env[key]
        else:
            env[key] = value
    return pack(env)


_DROP = object()


def test_oversize_is_refused_before_decoding() -> None:
    """A message over the cap is refused whatever it holds, and the cap is configurable."""
    good = valid_message(REGISTRY["t-rr"])
    _reject(good, "oversize", "", max_size=len(good) - 1)
    assert decode_report(good, REGISTRY, max_size=len(good)).count == 2
    _reject(b"\xc1" * (DEFAULT_MAX_SIZE + 1), "oversize", "")


def test_truncated_and_trailing_bytes() -> None:
    """A message cut short, empty, or followed by more bytes is refused."""
    good = valid_message(REGISTRY["t-rr"])
    for cut in range(len(good)):
        with pytest.raises(MalformedReportError):
            decode_report(good[:cut], REGISTRY)
    _reject(good[:-1], "truncated", "")
    _reject(b"", "truncated", "")
    _reject(good + b"\x00", "trailing-bytes", "")
    _reject(good + b"\x00" * 3, "trailing-bytes", "")


def test_bad_msgpack_encoding() -> None:
    """Reserved bytes, invalid UTF-8 and extension types are refused."""
    _reject(b"\xc1", "bad-encoding", "")
    _reject(pack({"v": 1}).replace(b"\xa1v", b"\xa1\xff"), "bad-encoding", "")
    marker = b"\xfe" * 16
    template = pack({**envelope(valid_message(REGISTRY["t-rr"])), "r": [0, marker]})
    _reject(template.replace(pack(marker), b"\xd4\x05\x00"), "bad-type")  # ext type 5
    # msgpack turns ext type -1 into a Timestamp without asking ext_hook; it is refused too.
    _reject(template.replace(pack(marker), b"\xd6\xff\x00\x00\x00\x01"), "bad-type", "records[1]")


def test_non_string_map_keys_are_refused() -> None:
    """Map keys are strings; integer keys are a type error."""
    _reject(pack({1: 2}), "bad-type", "")


def test_deep_nesting_is_refused() -> None:
    """Structures nested beyond MAX_DEPTH, or beyond the unpacker's stack, are refused."""
    env = envelope(valid_message(REGISTRY["t-rr"]))
    nested: Any = 1
    for _ in range(MAX_DEPTH):
        nested = [nested]
    env["r"] = nested
    _reject(pack(env), "too-deep")
    _reject(b"\x91" * 60_000 + b"\x00", "too-deep", "")
    _reject(b"\x81\xa1a" * 20_000 + b"\x00", "too-deep", "")
    _reject(b"\x91" * 1_000 + b"\x00", "too-deep", "[0]" * MAX_DEPTH)


_plain_or_not = st.recursive(
    st.one_of(
        st.integers(),
        st.floats(allow_nan=False),
        st.text(max_size=3),
        st.binary(max_size=3),
        st.booleans(),
        st.none(),
        st.just(msgpack.Timestamp(1, 0)),
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=2), inner, max_size=3)),
    max_leaves=40,
)


@settings(max_examples=500, deadline=None)
@given(
    st.one_of(st.lists(_plain_or_not, max_size=4), st.dictionaries(st.text(max_size=2), _plain_or_not)),
    st.integers(1, MAX_DEPTH + 1),
)
def test_the_fast_plain_pass_agrees_with_the_walk_that_names_the_fault(value: Any, depth: int) -> None:
    """The records' fast type and depth pass says yes exactly when the walk finds no fault, so
    every fault is still named by the walk."""
    try:
        wire._plain_fault(value, depth, "records")
    except MalformedReportError:
        faultless = False
    else:
        faultless = True
    assert wire._plain_within(value, depth) == faultless


def test_envelope_must_be_a_map() -> None:
    """A message that is not a map is a type error on the whole message."""
    for obj in (1, "x", b"x", [1, 2], None, 1.5, True):
        _reject(pack(obj), "bad-type", "")


def test_duplicate_envelope_key_is_refused() -> None:
    """A key that repeats in the envelope is refused (msgpack would keep the last silently)."""
    good = valid_message(REGISTRY["t-rr"])
    env = envelope(good)
    body = b"".join(pack(k) + pack(v) for k, v in env.items())
    dup = bytes([0x80 | (len(env) + 1)]) + body + pack("p") + pack(5)
    _reject(dup, "duplicate", "period")


def test_duplicate_key_inside_records_is_refused() -> None:
    """A repeated key in any nested map is refused too."""
    env = envelope(valid_message(REGISTRY["t-rr"]))
    raw = b"".join(pack(k) + pack(v) for k, v in env.items() if k != "r")
    nested = pack("r") + b"\x91\x82\xa1a\x01\xa1a\x02"
    _reject(bytes([0x86]) + raw + nested, "duplicate", "records")


def test_missing_and_unknown_fields() -> None:
    """Every envelope field is required and no other key is allowed."""
    for key, name in (("u", "use_case"), ("h", "definition"), ("p", "period"), ("i", "report_id"), ("r", "records")):
        _reject(_variant(**{key: _DROP}), "missing-field", name)
    _reject(_variant(v=_DROP), "missing-field", "version")
    _reject(_variant(device="abc"), "unknown-field", "device")
    _reject(_variant(t=1_700_000_000), "unknown-field", "t")


def test_unknown_version() -> None:
    """Formats 1 and 2 are read, no other; a non-integer version is a type error."""
    _reject(_variant(v=3), "unknown-version", "version")
    _reject(_variant(v=0), "unknown-version", "version")
    _reject(_variant(v="1"), "bad-type", "version")
    _reject(_variant(v=True), "bad-type", "version")
    _reject(_variant(v=1.0), "bad-type", "version")


def test_unknown_use_case_and_unknown_definition() -> None:
    """Reports of another use case, or of a definition the collector was not given, are refused."""
    _reject(_variant(u="nope"), "unknown-use-case", "use_case")
    _reject(_variant(u=b"t-rr"), "bad-type", "use_case")
    _reject(_variant(h=bytes(16)), "unknown-definition", "definition")
    # Another use case's definition hash under this use case's name.
    _reject(_variant(h=REGISTRY["t-cms"].definition), "unknown-definition", "definition")
    # Format 1 carried the whole registry's hash: it is checked against the registries given.
    _reject(_variant(v=1, h=REGISTRY["t-rr"].definition), "registry-mismatch", "definition")
    _reject(_variant(h=REGISTRY["t-rr"].definition[:15]), "bad-length", "definition")
    _reject(_variant(h=REGISTRY["t-rr"].definition.hex()), "bad-type", "definition")


def test_format_1_reports_are_read_under_their_registry() -> None:
    """A format-1 report (whole-registry hash) is decoded under that registry's definition."""
    uc = REGISTRY["t-rr"]
    decoded = decode_report(_variant(v=1, h=REGISTRY.hash), REGISTRY)
    assert decoded.use_case is uc
    assert decoded.version == 1


def test_period_must_be_a_plausible_slot() -> None:
    """Negative, absurd, non-integer or unaccepted period indices are refused."""
    uc = REGISTRY["t-rr"]
    _reject(_variant(p=-1), "out-of-range", "period")
    _reject(_variant(p=uc.period.max_index + 1), "out-of-range", "period")
    _reject(_variant(p=2**64 - 1), "out-of-range", "period")
    _reject(_variant(p=81_234.0), "bad-type", "period")
    _reject(_variant(p=None), "bad-type", "period")
    _reject(_variant(p=81_234), "out-of-range", "period", periods=range(90_000, 90_004))
    assert decode_report(_variant(p=81_234), REGISTRY, periods=range(81_230, 81_240)).period == 81_234


def test_report_id_must_be_16_bytes() -> None:
    """The report id is exactly 16 bytes of msgpack bin."""
    _reject(_variant(i=b"x" * 15), "bad-length", "report_id")
    _reject(_variant(i=b"x" * 17), "bad-length", "report_id")
    _reject(_variant(i="x" * 16), "bad-type", "report_id")


def test_record_count_limits() -> None:
    """A report carries 1 to daily_limit records."""
    _reject(_variant(r=[]), "bad-length", "records")
    _reject(_variant(r=[1] * (DAILY_LIMIT + 1)), "too-many-records", "records")
    assert decode_report(_variant(r=[1] * DAILY_LIMIT), REGISTRY).count == DAILY_LIMIT


def test_record_errors_come_from_the_mechanism() -> None:
    """Malformed records raise the mechanism's error, with a field under records."""
    err = _reject(_variant(r=[0, 2]), "out-of-range", "records[1]")
    assert "records" in str(err)
    _reject(_variant(r=[0, True]), "bad-type", "records[1]")
    _reject(_variant(r={"0": 1}), "bad-type", "records")


def test_make_report_refuses_caller_mistakes() -> None:
    """make_report is for valid reports only: foreign use case, bad counts or periods are ValueErrors."""
    uc = REGISTRY["t-rr"]
    records = privatize(uc, [1], seed=1)
    with pytest.raises(ValueError, match="records"):
        make_report(uc, REGISTRY, period=1, records=[], rng=SeededRandom(1))
    with pytest.raises(ValueError, match="records"):
        make_report(uc, REGISTRY, period=1, records=records * (DAILY_LIMIT + 1), rng=SeededRandom(1))
    with pytest.raises(ValueError, match="period"):
        make_report(uc, REGISTRY, period=-1, records=records, rng=SeededRandom(1))
    other = parse_registry(registry_text(CASES[:1]).replace("1000", "999"), source="other")
    with pytest.raises(ValueError, match="not the registry"):
        make_report(other["t-rr"], REGISTRY, period=1, records=records, rng=SeededRandom(1))


def test_decode_takes_bytes_only() -> None:
    """Passing something other than bytes is a caller bug (TypeError), not a malformed report."""
    with pytest.raises(TypeError):
        decode_report("not bytes", REGISTRY)  # type: ignore[arg-type]
    good = valid_message(REGISTRY["t-rr"])
    assert decode_report(bytearray(good), REGISTRY).count == 2
    assert decode_report(memoryview(good), REGISTRY).count == 2


# ---------------------------------------------------------------------------------------------
# No identifiers
# ---------------------------------------------------------------------------------------------


def test_report_carries_only_the_envelope_fields() -> None:
    """The report has no field that could identify a device or a finer time."""
    assert [f.name for f in dataclasses.fields(Report)] == [
        "use_case",
        "definition",
        "period",
        "report_id",
        "records",
        "version",
    ]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.mechanism)
def test_two_devices_differ_only_in_the_report_id(case: Case) -> None:
    """Same value, same payload coins: the two encodings differ exactly in the 16 id bytes."""
    uc = REGISTRY[case.use_case]
    device = SystemRandom()
    encodings = []
    ids = []
    for _ in range(2):
        records = privatize(uc, [case.sample], seed=42)  # the payload's randomness, fixed
        report = make_report(uc, REGISTRY, period=81_234, records=records, rng=device)
        encodings.append(encode_report(report))
        ids.append(report.report_id)
    a, b = encodings
    assert len(a) == len(b)
    assert ids[0] != ids[1]
    start = a.index(pack("i") + b"\xc4\x10") + 4
    assert a[start : start + 16] == ids[0]
    assert b[start : start + 16] == ids[1]
    differing = [i for i in range(len(a)) if a[i] != b[i]]
    assert differing
    assert all(start <= i < start + 16 for i in differing)
    assert a[:start] + a[start + 16 :] == b[:start] + b[start + 16 :]


def test_report_ids_are_fresh_per_message() -> None:
    """Each report draws a new id from its random source: ids never repeat across messages."""
    uc = REGISTRY["t-rr"]
    records = privatize(uc, [1], seed=1)
    device = SystemRandom()
    ids = {make_report(uc, REGISTRY, period=1, records=records, rng=device).report_id for _ in range(1000)}
    assert len(ids) == 1000


# ---------------------------------------------------------------------------------------------
# The example registry and the size table
# ---------------------------------------------------------------------------------------------


def example_registry() -> Registry:
    """The shipped example registry."""
    return parse_registry(EXAMPLE.read_bytes(), source=str(EXAMPLE))


EXAMPLE_VALUES: dict[str, Any] = {
    "rr": 1,
    "one-bit-mean": 7_200,
    "dbitflip": 7_200,
    "rappor": "example.com",
    "cms": "😀",
    "hcms": "example.com",
    "sfp": "bruh",
    "olh": "😀",
}


def example_value(uc: UseCase) -> Any:
    """A value ``uc`` records: its first category when it has a fixed list, else its mechanism's example."""
    categories = getattr(uc.mechanism, "fixed_categories", None)
    return categories[0] if categories else EXAMPLE_VALUES[uc.mechanism.name]


SIZE_TABLE_TIME = 1_700_000_000  # 2023-11-14: a 6-hour slot index needs 5 msgpack bytes, a day 3


def size_rows(registry: Registry) -> list[dict[str, Any]]:
    """Encoded size of a one-record report for each use case of ``registry``."""
    rows = []
    for name, uc in registry.use_cases.items():
        mech: Any = uc.mechanism
        records = privatize(uc, [example_value(uc)], seed=5)
        period = uc.period.index_at(SIZE_TABLE_TIME)
        report = make_report(uc, registry, period=period, records=records, rng=SeededRandom(5))
        total = len(encode_report(report))
        payload = len(pack(report.records))
        rows.append({"use_case": name, "mechanism": mech.name, "payload": payload, "total": total})
    return rows


def test_example_registry_reports_roundtrip() -> None:
    """Every use case of the shipped example registry produces reports that decode."""
    registry = example_registry()
    for uc in registry.use_cases.values():
        records = privatize(uc, [example_value(uc)], seed=5)
        report = make_report(uc, registry, period=81_234, records=records, rng=SeededRandom(5))
        decoded = decode_report(encode_report(report), registry)
        mech: Any = uc.server  # the typed server half: batch() takes this mechanism's own records
        assert_same_batch(decoded.batch, mech.batch(records))


def test_size_table_matches_the_documentation() -> None:
    """docs/wire-format.md states the sizes the code produces; HCMS is tiny, CMS m=1024 ~128 B of bits."""
    rows = {r["mechanism"]: r for r in size_rows(example_registry())}
    assert rows["hcms"]["payload"] <= 12
    assert 128 <= rows["cms"]["payload"] <= 140
    doc = (ROOT / "docs" / "wire-format.md").read_text(encoding="utf-8")
    for r in rows.values():
        line = re.search(rf"^\| `{re.escape(r['use_case'])}` \| `{re.escape(r['mechanism'])}` \|.*$", doc, re.M)
        assert line, f"docs/wire-format.md has no size row for {r['use_case']}"
        cells = [c.strip() for c in line.group(0).strip("|").split("|")]
        assert int(cells[-2]) == r["payload"], r
        assert int(cells[-1]) == r["total"], r


def test_report_refuses_malformed_envelopes_at_construction() -> None:
    """A Report with a short hash or id, a negative period or an empty name cannot be built."""
    good: dict[str, Any] = {
        "use_case": "t-rr",
        "definition": bytes(16),
        "period": 1,
        "report_id": bytes(16),
        "records": [1],
    }
    Report(**good)
    bad_values: list[tuple[str, object]] = [
        ("definition", bytes(15)),
        ("report_id", "x" * 16),
        ("period", -1),
        ("period", 1.0),
        ("use_case", ""),
    ]
    for key, bad in bad_values:
        with pytest.raises(ValueError, match=key):
            Report(**{**good, key: bad})


# ---------------------------------------------------------------------------------------------
# Bounded cost: a report bigger than its use case allows is refused from the headers
# ---------------------------------------------------------------------------------------------


def _largest_wire_records(mech: Any, n: int) -> list[Any]:
    """``n`` records at the mechanism's largest wire form (the decoder need not accept them)."""
    one = msgpack.unpackb(msgpack.packb(_LARGEST[mech.name](mech), use_bin_type=True), raw=False)
    return [one] * n


_LARGEST: dict[str, Callable[[Any], Any]] = {
    "rr": lambda m: 1,
    "one-bit-mean": lambda m: 1,
    "dbitflip": lambda m: [list(range(m.k - m.d, m.k)), bytes(m.bits_bytes)],
    "rappor": lambda m: [m.cohorts - 1, bytes((m.k + 7) // 8)],
    "cms": lambda m: [m.k - 1, bytes(m.record_bytes)],
    "hcms": lambda m: [m.k - 1, m.m - 1, 1],
    "sfp": lambda m: [
        m.positions - 1,
        m.k_fragment - 1,
        bytes((m.m_fragment + 7) // 8),
        m.k - 1,
        bytes((m.m + 7) // 8),
    ],
    "olh": lambda m: [m.seeds - 1, m.g - 1],
    "grr": lambda m: m.k - 1,
    "oue": lambda m: bytes(m.record_bytes),
    "ss": lambda m: list(range(m.k - m.d, m.k)) if m.wire_form == "indices" else bytes((m.k + 7) // 8),
    "pgr": lambda m: m.geometry.points - 1,
}


@pytest.mark.parametrize("name", sorted(REGISTRY.use_cases))
def test_max_report_size_is_the_largest_report(name: str) -> None:
    """max_report_bytes is exactly the size of a daily_limit report of largest records in the last period."""
    uc = REGISTRY[name]
    records = _largest_wire_records(uc.mechanism, uc.daily_limit)
    env = {"v": 2, "u": uc.name, "h": uc.definition, "p": uc.period.max_index, "i": bytes(16), "r": records}
    assert len(pack(env)) == uc.max_report_bytes == max_report_size(uc)


def _flood(uc: UseCase, records: list[Any], *, records_first: bool = False) -> bytes:
    env: dict[str, Any] = {"v": 2, "u": uc.name, "h": uc.definition, "p": 81_234, "i": bytes(16), "r": records}
    if records_first:
        env = {"r": records} | {k: v for k, v in env.items() if k != "r"}
    return pack(env)


def _forbid_record_decoding(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make any unpacking of the records, or any mechanism's decode_records, fail loudly."""
    calls: list[str] = []

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        calls.append("decoded")
        raise AssertionError("records were decoded before the headers were checked")

    monkeypatch.setattr(wire, "_unpack", forbidden)
    for uc in REGISTRY.use_cases.values():
        monkeypatch.setattr(type(uc.server), "decode_records", forbidden, raising=False)
    return calls


def test_a_flood_of_declared_records_is_refused_before_any_record_is_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 64 KB HCMS report declaring 16,000 records is refused from its headers: no record is unpacked or checked."""
    reg = parse_registry(
        """
format = 1
salt = "0547eed0fe23ed365173a6e9b965e343b4927d0967009d668d6df9ead8a2030c"
[use_cases.safari-energy-domains]
mechanism = "hcms"
epsilon = 4
period = "1d"
daily_limit = 2
lifetime_epsilon = 3000
parameters = { k = 1024, m = 32768 }
[use_cases.safari-energy-domains.collector]
min_reports = 0
""",
        source="flood",
    )
    uc = reg["safari-energy-domains"]
    env = {"v": 2, "u": uc.name, "h": uc.definition, "p": 20_000, "i": bytes(16), "r": [[100, 100, 1]] * 16_000}
    data = pack(env)
    assert 63_000 < len(data) <= DEFAULT_MAX_SIZE
    calls = _forbid_record_decoding(monkeypatch)
    with pytest.raises(MalformedReportError) as info:
        decode_report(data, reg)
    assert info.value.reason == "oversize"
    assert "safari-energy-domains" in str(info.value)
    # Records before the use case (not the encoder's order): refused on the declared count.
    reordered = pack({"r": env["r"]} | {k: v for k, v in env.items() if k != "r"})
    with pytest.raises(MalformedReportError) as info:
        decode_report(reordered, reg)
    assert (info.value.reason, info.value.field) == ("too-many-records", "records")
    assert calls == []


@pytest.mark.parametrize("name", sorted(REGISTRY.use_cases))
def test_declared_count_and_size_are_checked_from_the_headers(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every mechanism: one record over the limit, or a report well over the largest, is refused undecoded."""
    uc = REGISTRY[name]
    largest = _largest_wire_records(uc.mechanism, uc.daily_limit)
    calls = _forbid_record_decoding(monkeypatch)
    for records_first in (False, True):
        with pytest.raises(MalformedReportError) as info:
            decode_report(_flood(uc, largest + largest[:1], records_first=records_first), REGISTRY)
        assert info.value.reason in {"too-many-records", "oversize"}
    one = _flood(uc, largest[:1])
    padded = one + bytes(uc.max_report_bytes + 65 - len(one))  # trailing junk, found before any record
    with pytest.raises(MalformedReportError) as info:
        decode_report(padded, REGISTRY)
    assert info.value.reason == "oversize"
    assert calls == []
