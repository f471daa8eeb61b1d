"""The figures of docs/privacy-accounting.md, computed: RAPPOR's memo bounds and where they stop
holding, from the deployed parameters of deploy/usecases.example.toml, and the tables of the
central guarantee, read from the page and recomputed."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest

from collector.amplification import central_epsilon, default_delta
from collector.numbers import format_number
from protocol.one_bit_mean import theorem5_epsilon
from protocol.rappor import Rappor
from protocol.registry import Registry, parse_registry

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "privacy-accounting.md"


def _registry(name: str) -> Registry:
    path = ROOT / "deploy" / name
    return parse_registry(path.read_bytes(), source=str(path))


@pytest.fixture(scope="module")
def example() -> Registry:
    return _registry("usecases.example.toml")


def _homepage(example: Registry) -> Rappor:
    mechanism = example.use_cases["homepage"].mechanism
    assert isinstance(mechanism, Rappor)
    assert (mechanism.k, mechanism.h, mechanism.f, mechanism.p, mechanism.q) == (128, 2, 0.75, 0.5, 0.75)
    return mechanism


class _Bit:
    """One Bloom bit of RAPPOR (004 §2): the permanent response B' from the bit b, then the
    instantaneous responses S of the records, each from B'."""

    def __init__(self, r: Rappor) -> None:
        self.f, self.p, self.q = r.f, r.p, r.q

    def memo(self, b: int) -> float:
        """Pr[B' = 1 | b]."""
        return self.f / 2 + (1 - self.f) * b

    def one_memo(self, ones: int, records: int, b: int) -> float:
        """Pr[a given sequence of ``records`` responses with ``ones`` ones | b], all from one B'."""
        r = self.memo(b)
        return r * self.q**ones * (1 - self.q) ** (records - ones) + (1 - r) * self.p**ones * (1 - self.p) ** (
            records - ones
        )

    def record(self, s: int, b: int) -> float:
        """Pr[S = s | b] of one record from its own memo."""
        return self.one_memo(s, 1, b)


def _worst(per_position: list[list[float]]) -> float:
    """The largest ln-ratio over outputs: positions are independent, so each takes its own worst
    output (one direction of the ratio for all of them)."""
    return sum(max(logs) for logs in per_position)


def _records_of_one_value(bit: _Bit, records: int, h: int) -> float:
    """T records of v against T records of v' (one memo each), their h Bloom bits apart: the
    worst ln-ratio, in the worse direction."""
    rise = max(math.log(bit.one_memo(j, records, 1) / bit.one_memo(j, records, 0)) for j in range(records + 1))
    fall = max(math.log(bit.one_memo(j, records, 0) / bit.one_memo(j, records, 1)) for j in range(records + 1))
    return h * (rise + fall)


def test_records_of_one_memo_stay_within_the_memos_epsilon(example: Registry) -> None:
    """One value reported T times reveals at most ε∞ (004 Thm 1), approached as T grows, while the
    ledger charges T·ε₁; at T = 1 the figure is ε₁ (004 Thm 2)."""
    r = _homepage(example)
    bit = _Bit(r)
    figures = {t: _records_of_one_value(bit, t, r.h) for t in (1, 2, 4, 16, 64)}
    assert r.epsilon_infinity == pytest.approx(4 * math.log(5 / 3), rel=1e-12)
    assert format_number(r.epsilon_infinity) == "2.043"
    assert format_number(r.epsilon_one) == "0.5343"
    assert figures[1] == pytest.approx(r.epsilon_one, rel=1e-9)
    assert [format_number(figures[t]) for t in (1, 2, 4, 16)] == ["0.5343", "0.9904", "1.574", "2.04"]
    assert figures[64] == pytest.approx(r.epsilon_infinity, abs=1e-10)
    assert all(x <= r.epsilon_infinity + 1e-12 for x in figures.values())
    assert format_number(64 * r.epsilon_one) == "34.19"


def _bloom_sets(h: int, positions: int) -> list[frozenset[int]]:
    # A value sets h Bloom bits, or fewer when its hashes collide.
    return [frozenset(c) for size in range(1, h + 1) for c in itertools.combinations(range(positions), size)]


def _one_value_against_two(bit: _Bit, k: int, h: int) -> float:
    """Two records of v from one memo against one record each of v' and v'' from two memos: the
    worst ln-ratio over every placement of the three values' Bloom bits and both directions."""
    positions = 3 * h
    worst = 0.0
    for sign in (1, -1):
        idle = max(
            sign * math.log(bit.one_memo(s1 + s2, 2, 0) / (bit.record(s1, 0) * bit.record(s2, 0)))
            for s1 in (0, 1)
            for s2 in (0, 1)
        )
        for v in _bloom_sets(h, positions):
            for v1 in _bloom_sets(h, positions):
                for v2 in _bloom_sets(h, positions):
                    logs = [
                        [
                            sign
                            * math.log(
                                bit.one_memo(s1 + s2, 2, int(i in v))
                                / (bit.record(s1, int(i in v1)) * bit.record(s2, int(i in v2)))
                            )
                            for s1 in (0, 1)
                            for s2 in (0, 1)
                        ]
                        for i in range(positions)
                    ]
                    # The bits none of the three values sets: the shared memo shows on each.
                    worst = max(worst, _worst(logs) + (k - positions) * idle)
    return worst


def test_two_records_of_one_value_against_two_values_exceed_two_memos(example: Registry) -> None:
    """(v, v) against (v', v''): w <= 2, yet the ln-ratio is 11.85 > 2·ε∞ = 4.09 > 2·ε₁ = 1.07;
    the count of memos bounds nothing across different patterns of changes."""
    r = _homepage(example)
    worst = _one_value_against_two(_Bit(r), r.k, r.h)
    assert format_number(worst) == "11.85"
    assert format_number(2 * r.epsilon_infinity) == "4.087"  # 4.09 on the page
    assert round(2 * r.epsilon_infinity, 2) == 4.09
    assert round(2 * r.epsilon_one, 2) == 1.07
    assert worst > 2 * r.epsilon_infinity


def test_sequences_with_one_pattern_of_changes_stay_within_w_memos(example: Registry) -> None:
    """000 Thm 4 for RAPPOR: (v, v) against (v', v') within ε∞ (width 1); (v, w) against
    (v', w') within 2·ε∞ (width 2), exactly 2·ε₁ since the two records are independent."""
    r = _homepage(example)
    bit = _Bit(r)
    width_one = _records_of_one_value(bit, 2, r.h)
    assert format_number(width_one) == "0.9904"
    assert width_one <= r.epsilon_infinity
    # The two records come from two memos, drawn independently: the ratio of the pair is the
    # product of the records' ratios, and its worst case the sum of theirs, each over every
    # placement of the two values' Bloom bits.
    positions = 2 * r.h
    one_record = 0.0
    for sign in (1, -1):
        for v, v1 in itertools.product(_bloom_sets(r.h, positions), repeat=2):
            logs = [
                [sign * math.log(bit.record(s, int(i in v)) / bit.record(s, int(i in v1))) for s in (0, 1)]
                for i in range(positions)
            ]
            one_record = max(one_record, _worst(logs))
    assert one_record == pytest.approx(r.epsilon_one, rel=1e-9)
    width_two = 2 * one_record
    assert width_two == pytest.approx(2 * r.epsilon_one, rel=1e-9)
    assert format_number(width_two) == "1.069"
    assert width_two <= 2 * r.epsilon_infinity


def test_the_registry_change_figure() -> None:
    """`default-browser` at f = 0.6 (deploy/fleet.usecases.v2.toml): ε∞ = 2 ln(7/3) per B′ redrawn, ε₁ = 0.4286."""
    r = _registry("fleet.usecases.v2.toml").use_cases["default-browser"].mechanism
    assert isinstance(r, Rappor)
    assert r.epsilon_infinity == pytest.approx(2 * math.log(7 / 3), rel=1e-12)
    assert (format_number(r.epsilon_infinity), format_number(r.epsilon_one)) == ("1.695", "0.4286")
    assert format_number(2 * r.epsilon_infinity) == "3.389"  # a device that reported two browsers


def test_no_joint_bound_makes_one_memo_charge_enough() -> None:
    """000 Thm 5's joint ε″ at a memo ε of 1 is 2.718, above the 2 two keys' memos are charged."""
    joint = theorem5_epsilon(1.0)
    assert format_number(joint) == "2.718"
    assert joint > 2 * 1.0


def _row(first_cell: str) -> list[str]:
    """The cells of the page's table row that starts with ``first_cell``."""
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row {first_cell!r} in {PAGE}")


def test_the_figures_of_small_batches(example: Registry) -> None:
    """The page's small-n table: `dark-mode-enabled`'s ε0 = ln 3 at δ = 10^-6."""
    cost = example.use_cases["dark-mode-enabled"].cost
    sizes = [int(n.replace(",", "")) for n in _row("reports n")[1:]]
    assert sizes == [1, 10, 30, 100, 300, 1_000, 10_000]
    assert _row("central ε")[1:] == [format_number(central_epsilon(cost, n, 1e-6)) for n in sizes]
    assert all(default_delta(n) == 1e-6 for n in sizes)


def test_the_deployed_figures(example: Registry) -> None:
    """The page's table of the deployed use cases, recomputed."""
    for name, uc in example.use_cases.items():
        cells = _row(f"`{name}`")
        minimum = uc.collector.min_reports
        memo = " (memoized)" if "epsilon_longitudinal" in uc.mechanism.privacy_figures() else ""
        assert cells[1:] == [
            uc.mechanism.name + memo,
            format_number(uc.cost),
            f"{format_number(central_epsilon(uc.cost, minimum))} ({format_number(minimum)})",
            *(format_number(central_epsilon(uc.cost, n)) for n in (10**5, 10**6, 10**7)),
        ]
