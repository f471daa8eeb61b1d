"""Hostile input: the report decoder is total and never lets a schema-breaking batch through.

Seeded and bounded: 120,000 random and mutated messages through ``decode_report`` plus
random objects straight into every mechanism's ``decode_records``. Any exception other
than ``MalformedReportError`` fails the test, listing the first inputs that caused one;
every accepted message must satisfy its mechanism's record invariants and fold into an
aggregate.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import msgpack
import pytest

from protocol.errors import MalformedReportError
from protocol.registry import parse_registry
from protocol.wire import REASONS, DecodedReport, decode_report
from tests.protocol.test_wire import (
    CASES,
    DAILY_LIMIT,
    REGISTRY,
    Case,
    pack,
    privatize,
    registry_text,
    valid_message,
)

SEED = 20_171_204
MESSAGES = 120_000
OBJECTS_PER_MECHANISM = 20_000
MAX_SIZE = 4_096  # a small cap so oversize inputs are cheap to produce

_INTS = (
    0,
    1,
    2,
    -1,
    3,
    7,
    8,
    15,
    16,
    31,
    32,
    63,
    64,
    127,
    128,
    255,
    256,
    1023,
    1024,
    2**31,
    2**32,
    2**63 - 1,
    -(2**63),
    2**64 - 1,
)
_FLOATS = (0.0, -0.0, 1.0, 0.5, math.nan, math.inf, -math.inf, 1e308)


# The scalar kinds of random_object (0 to 6), each drawing from the same generator.
_LEAVES: tuple[Callable[[random.Random], Any], ...] = (
    lambda rng: rng.choice(_INTS),
    lambda rng: rng.randrange(-300, 300),
    lambda rng: rng.choice(_FLOATS),
    lambda rng: rng.choice(["", "a", "records", "r", "v", "t-rr", "é", "x" * rng.randrange(40)]),
    lambda rng: rng.randbytes(rng.choice((0, 1, 2, 3, 4, 8, 15, 16, 17, 32, 128, 129, rng.randrange(300)))),
    lambda rng: rng.choice((True, False, None)),
    lambda rng: [],
)


def random_object(rng: random.Random, depth: int = 0) -> Any:
    """A random value of any type msgpack can produce, nested a little."""
    kind = rng.randrange(10 if depth < 4 else 7)
    if kind < len(_LEAVES):
        return _LEAVES[kind](rng)
    if kind in (7, 8):
        return [random_object(rng, depth + 1) for _ in range(rng.randrange(5))]
    return {
        rng.choice(("v", "u", "h", "p", "i", "r", "x", "bits", "j")): random_object(rng, depth + 1)
        for _ in range(rng.randrange(4))
    }


def deep_bytes(rng: random.Random) -> bytes:
    """msgpack bytes of a structure nested 10 to 3,000 levels deep (lists, maps or both).

    Built as bytes: msgpack's packer refuses to nest beyond 511 levels, a hostile sender does not.
    """
    out = [b"\x91" if rng.random() < 0.7 else b"\x81\xa1r" for _ in range(rng.randrange(10, 3_000))]
    return b"".join(out) + pack(rng.choice(_INTS))


_SENTINEL = b"\xfe\xed" * 8


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(obj, list):
        for i, item in enumerate(obj):
            out.extend(_paths(item, (*prefix, i)))
    elif isinstance(obj, dict):
        for key, item in obj.items():
            out.extend(_paths(item, (*prefix, key)))
    return out


def _replace(obj: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    copy: Any = list(obj) if isinstance(obj, list) else dict(obj)
    copy[head] = _replace(obj[head], rest, value)
    return copy


def _get(obj: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        obj = obj[p]
    return obj


# --- mutators: (rng, valid message) -> candidate bytes -------------------------------------------


def m_flip_bytes(rng: random.Random, msg: bytes) -> bytes:
    b = bytearray(msg)
    for _ in range(rng.randrange(1, 5)):
        b[rng.randrange(len(b))] = rng.randrange(256)
    return bytes(b)


def m_flip_bit(rng: random.Random, msg: bytes) -> bytes:
    b = bytearray(msg)
    b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    return bytes(b)


def m_truncate(rng: random.Random, msg: bytes) -> bytes:
    return msg[: rng.randrange(len(msg))]


def m_extend(rng: random.Random, msg: bytes) -> bytes:
    return msg + rng.randbytes(rng.randrange(1, 17))


def m_insert(rng: random.Random, msg: bytes) -> bytes:
    at = rng.randrange(len(msg) + 1)
    return msg[:at] + rng.randbytes(rng.randrange(1, 9)) + msg[at:]


def m_delete(rng: random.Random, msg: bytes) -> bytes:
    at = rng.randrange(len(msg))
    return msg[:at] + msg[at + rng.randrange(1, 9) :]


def m_random_bytes(rng: random.Random, msg: bytes) -> bytes:
    return rng.randbytes(rng.randrange(0, 200))


def m_oversize(rng: random.Random, msg: bytes) -> bytes:
    return msg + rng.randbytes(MAX_SIZE)


def m_retype(rng: random.Random, msg: bytes) -> bytes:
    env = msgpack.unpackb(msg, raw=False)
    path = rng.choice(_paths(env))
    return pack(_replace(env, path, random_object(rng)))


def m_tweak_leaf(rng: random.Random, msg: bytes) -> bytes:
    """Nudge a leaf within its type: ints off by a little or a lot, bytes one too long or short."""
    env = msgpack.unpackb(msg, raw=False)
    path = rng.choice(_paths(env))
    leaf = _get(env, path)
    if isinstance(leaf, bool):
        new: Any = not leaf
    elif isinstance(leaf, int):
        new = leaf + rng.choice((-1, 1, -leaf - 1, 2**32, 1 << 62, rng.randrange(-10, 70_000)))
    elif isinstance(leaf, bytes):
        choice = rng.randrange(3)
        new = leaf + b"\x00" if choice == 0 else leaf[:-1] if choice == 1 else rng.randbytes(len(leaf))
    elif isinstance(leaf, list):
        new = leaf + leaf[:1] if rng.random() < 0.5 else leaf[:-1]
    elif isinstance(leaf, str):
        new = leaf + "x"
    else:
        new = random_object(rng)
    return pack(_replace(env, path, new))


def m_duplicate_records(rng: random.Random, msg: bytes) -> bytes:
    env = msgpack.unpackb(msg, raw=False)
    r = env.get("r")
    if isinstance(r, list) and r:
        env["r"] = rng.choice((r + r, r[:1] * rng.randrange(1, 2 * DAILY_LIMIT), r[::-1], [r[0], *r]))
    return pack(env)


def m_swap_fields(rng: random.Random, msg: bytes) -> bytes:
    env = msgpack.unpackb(msg, raw=False)
    a, b = rng.sample(sorted(env), 2)
    env[a], env[b] = env[b], env[a]
    return pack(env)


def m_keys(rng: random.Random, msg: bytes) -> bytes:
    env = msgpack.unpackb(msg, raw=False)
    op = rng.randrange(3)
    key = rng.choice(sorted(env))
    if op == 0:
        del env[key]
    elif op == 1:
        env[rng.choice(("x", "t", "device", "V", "rr"))] = random_object(rng)
    else:
        env[key.upper()] = env.pop(key)
    return pack(env)


def m_duplicate_key(rng: random.Random, msg: bytes) -> bytes:
    env = msgpack.unpackb(msg, raw=False)
    items = list(env.items())
    extra = rng.choice(items)
    items.insert(rng.randrange(len(items) + 1), (extra[0], rng.choice((extra[1], random_object(rng)))))
    return bytes([0x80 | len(items)]) + b"".join(pack(k) + pack(v) for k, v in items)


def m_deep(rng: random.Random, msg: bytes) -> bytes:
    if rng.random() < 0.3:
        return deep_bytes(rng)
    env = msgpack.unpackb(msg, raw=False)
    path = rng.choice(_paths(env))
    return pack(_replace(env, path, _SENTINEL)).replace(pack(_SENTINEL), deep_bytes(rng))


def m_random_tree(rng: random.Random, msg: bytes) -> bytes:
    return pack(random_object(rng))


def m_splice(rng: random.Random, msg: bytes) -> bytes:
    other = rng.choice(_CORPUS)[1]
    return msg[: rng.randrange(len(msg) + 1)] + other[rng.randrange(len(other) + 1) :]


def m_header(rng: random.Random, msg: bytes) -> bytes:
    """Change a container or string header's count (fixmap, fixarray, bin8 lengths)."""
    b = bytearray(msg)
    spots = [i for i, x in enumerate(b) if 0x80 <= x <= 0x9F or x in (0xC4, 0xDC, 0xDE)]
    if spots:
        i = rng.choice(spots)
        if b[i] in (0xC4, 0xDC, 0xDE) and i + 1 < len(b):
            b[i + 1] = (b[i + 1] + rng.choice((-1, 1, 100))) % 256
        else:
            b[i] = (b[i] & 0xF0) | ((b[i] + rng.choice((-1, 1))) & 0x0F)
    return bytes(b)


MUTATORS: tuple[Callable[[random.Random, bytes], bytes], ...] = (
    m_flip_bytes,
    m_flip_bit,
    m_truncate,
    m_extend,
    m_insert,
    m_delete,
    m_random_bytes,
    m_oversize,
    m_retype,
    m_tweak_leaf,
    m_tweak_leaf,
    m_duplicate_records,
    m_swap_fields,
    m_keys,
    m_duplicate_key,
    m_deep,
    m_random_tree,
    m_splice,
    m_header,
)


def _corpus() -> list[tuple[Case, bytes]]:
    out = []
    for case in CASES:
        uc = REGISTRY[case.use_case]
        for seed in range(4):
            out.append((case, valid_message(uc, n=1 + seed * 2, seed=seed)))
    return out


_CORPUS = _corpus()


def _check_accepted(decoded: DecodedReport) -> None:
    mech: Any = decoded.use_case.mechanism
    # A splice can turn one use case's message into another's: check against the decoded one.
    owner = next(c for c in CASES if c.use_case == decoded.use_case.name)
    assert 1 <= decoded.count <= DAILY_LIMIT
    assert len(decoded.report_id) == 16
    assert 0 <= decoded.period <= decoded.use_case.period.max_index
    owner.check(mech, decoded.batch)
    server = decoded.use_case.server
    agg = server.new_aggregate()
    server.fold(agg, decoded.batch)
    assert agg.n == decoded.count


def _describe(exc: BaseException, data: object, how: str) -> str:
    shown = data.hex() if isinstance(data, bytes) else repr(data)
    return f"{how}: {type(exc).__name__}: {exc} on {shown[:400]}"


def test_hostile_messages_never_escape_or_break_the_schema() -> None:
    """120,000 mutated and random messages: only MalformedReportError, and every accepted batch is valid."""
    rng = random.Random(SEED)
    reasons: dict[str, int] = {}
    accepted = 0
    escapes: list[str] = []
    broken: list[str] = []
    for _ in range(MESSAGES):
        _, msg = rng.choice(_CORPUS)
        mutate = rng.choice(MUTATORS)
        data = mutate(rng, msg)
        try:
            decoded = decode_report(data, REGISTRY, max_size=MAX_SIZE)
        except MalformedReportError as exc:
            reasons[exc.reason] = reasons.get(exc.reason, 0) + 1
            continue
        except Exception as exc:
            if len(escapes) < 10:
                escapes.append(_describe(exc, data, mutate.__name__))
            continue
        accepted += 1
        try:
            _check_accepted(decoded)
        except AssertionError as exc:
            if len(broken) < 10:
                broken.append(_describe(exc, data, mutate.__name__))
    assert not escapes, "decode_report raised a foreign exception:\n" + "\n".join(escapes)
    assert set(reasons) <= REASONS, sorted(set(reasons) - REASONS)
    assert not broken, "an accepted message broke the record schema:\n" + "\n".join(broken)
    # The mutators reach every envelope check (a fuzz that only ever hits one reason proves little).
    expected = {
        "oversize",
        "truncated",
        "trailing-bytes",
        "bad-encoding",
        "too-deep",
        "bad-type",
        "missing-field",
        "unknown-field",
        "duplicate",
        "unknown-version",
        "unknown-use-case",
        "unknown-definition",
        "out-of-range",
        "bad-length",
        "too-many-records",
    }
    assert expected <= set(reasons), sorted(expected - set(reasons))
    assert accepted > 0


def test_reports_of_other_definitions_are_refused() -> None:
    """Every valid message is refused by a collector whose registry defines its use case differently."""
    other = parse_registry(registry_text().replace("lifetime_epsilon = 1000", "lifetime_epsilon = 999"), source="other")
    assert all(uc.definition != REGISTRY[name].definition for name, uc in other.use_cases.items())
    for _, msg in _CORPUS:
        with pytest.raises(MalformedReportError) as info:
            decode_report(msg, other)
        assert info.value.reason == "unknown-definition"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.mechanism)
def test_decode_records_is_total_on_random_objects(case: Case) -> None:
    """Each mechanism's decode_records takes any msgpack-producible object: a batch or MalformedReportError."""
    rng = random.Random(SEED + len(case.mechanism))
    uc = REGISTRY[case.use_case]
    mech: Any = uc.server
    device: Any = uc.mechanism
    valid = device.encode_records(privatize(uc, [case.sample] * 3, seed=1))
    escapes: list[str] = []
    broken: list[str] = []
    for i in range(OBJECTS_PER_MECHANISM):
        if i % 2:
            path = rng.choice(_paths(valid))
            raw = _replace(valid, path, random_object(rng))
        else:
            raw = random_object(rng)
        try:
            batch = mech.decode_records(raw)
        except MalformedReportError as exc:
            if (exc.reason not in REASONS or not exc.field.startswith("records")) and len(broken) < 10:
                broken.append(f"{case.mechanism}: reason {exc.reason!r} field {exc.field!r} on {raw!r:.300}")
            continue
        except Exception as exc:
            if len(escapes) < 10:
                escapes.append(_describe(exc, raw, case.mechanism))
            continue
        try:
            case.check(uc.mechanism, batch)
        except AssertionError as exc:
            if len(broken) < 10:
                broken.append(_describe(exc, raw, case.mechanism))
    assert not escapes, f"{case.module}.decode_records raised a foreign exception:\n" + "\n".join(escapes)
    assert not broken, f"{case.module}.decode_records accepted a schema-breaking batch:\n" + "\n".join(broken)
