"""Many reports of one use case and period at once: ``encode_reports`` is ``encode_report`` of each."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.wire import REPORT_ID_SIZE, Report, decode_report, encode_report, encode_reports
from tests.protocol.test_wire import CASES, DAILY_LIMIT, REGISTRY, Case, privatize


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.mechanism)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_each_report_is_byte_for_byte_encode_report(case: Case, data: st.DataObject) -> None:
    uc = REGISTRY[case.use_case]
    period = data.draw(st.integers(0, uc.period.max_index), label="period")
    n = data.draw(st.integers(0, 5), label="reports")
    ids = [data.draw(st.binary(min_size=REPORT_ID_SIZE, max_size=REPORT_ID_SIZE), label="id") for _ in range(n)]
    records: list[list[Any]] = []
    for i in range(n):
        values = data.draw(st.lists(case.values, min_size=1, max_size=DAILY_LIMIT), label="values")
        records.append(uc.mechanism.encode_plain(privatize(uc, values, seed=i)))
    encoded = encode_reports(uc.name, uc.definition, period, ids, records)
    assert encoded == [
        encode_report(Report(use_case=uc.name, definition=uc.definition, period=period, report_id=i, records=r))
        for i, r in zip(ids, records, strict=True)
    ]
    for data_, report_id in zip(encoded, ids, strict=True):
        decoded = decode_report(data_, REGISTRY)
        assert (decoded.use_case, decoded.period, decoded.report_id) == (uc, period, report_id)


@settings(max_examples=200, deadline=None)
@given(
    name=st.text(min_size=1, max_size=300),
    definition=st.binary(min_size=16, max_size=16),
    period=st.integers(0, 2**64 - 1),
    records=st.lists(st.lists(st.one_of(st.integers(-(2**63), 2**64 - 1), st.binary(), st.text()), max_size=3)),
)
def test_every_header_length_is_packed_as_encode_report_packs_it(
    name: str, definition: bytes, period: int, records: list[list[object]]
) -> None:
    # Names and periods across msgpack's length and integer classes (fixstr to str 16, fixint to uint 64).
    ids = [bytes([i]) * REPORT_ID_SIZE for i in range(len(records))]
    assert encode_reports(name, definition, period, ids, records) == [
        encode_report(Report(use_case=name, definition=definition, period=period, report_id=i, records=r))
        for i, r in zip(ids, records, strict=True)
    ]


def test_refuses_what_report_refuses() -> None:
    uc = REGISTRY[CASES[0].use_case]
    good = bytes(REPORT_ID_SIZE)
    with pytest.raises(ValueError, match="report_id"):
        encode_reports(uc.name, uc.definition, 1, [good, b"short"], [[1], [1]])
    with pytest.raises(ValueError, match="report_id"):
        encode_reports(uc.name, uc.definition, 1, [bytearray(REPORT_ID_SIZE)], [[1]])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="period"):
        encode_reports(uc.name, uc.definition, -1, [good], [[1]])
    with pytest.raises(ValueError, match="definition"):
        encode_reports(uc.name, b"short", 1, [good], [[1]])
    with pytest.raises(ValueError, match="use_case"):
        encode_reports("", uc.definition, 1, [good], [[1]])
    with pytest.raises(ValueError, match="report ids"):
        encode_reports(uc.name, uc.definition, 1, [good], [[1], [1]])
