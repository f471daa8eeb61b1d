"""1BitMean with α-point rounding, permanent memoization and output perturbation (000 §2.1, §3.1, §4).

The mean of an integer counter ``x ∈ [0, m]`` (for example seconds of app use in a 6-hour
period, ``m = 21,600``) is collected with one bit per device and period.

**Client** (000 §3.1). At setup a device draws ``α`` uniformly from ``{0, ..., s - 1}`` and
one memoized bit for every point ``y = ℓs`` of ``A = {0, s, 2s, ..., m}`` (``L = m/s``
segments, ``L + 1`` points); the bit of ``y`` is 1 with the probability of 000 eq. (1) at
``x = y``. Neither is ever redrawn. To report ``x ∈ [ℓs, (ℓ+1)s)`` the device rounds to
``ℓs`` if ``x + α < (ℓ+1)s`` and to ``(ℓ+1)s`` otherwise (``x = m`` maps to ``m``), and
answers with the memoized bit of the rounded point, flipped with probability ``γ`` by a
fresh coin every report (output perturbation, 000 §4).

**Implemented coins.** Eq. (1) is affine in ``x``: ``p(x) = q + (x/m)(p - q)`` with
``p = e**ε/(e**ε + 1)`` and ``q = 1 - p``. The coin of the top point is ``P_L = N_L / 2**64``,
``p`` rounded down, and the bottom one is its complement ``P_0 = N_0 / 2**64 = 1 - P_L``.
The memo bit of point ``ℓ`` is 1 with probability exactly
``P_ℓ = T_ℓ / (L·2**64) = P_0 + (ℓ/L)(P_L - P_0)``, ``T_ℓ = L·N_0 + ℓ(N_L - N_0)``, drawn by
comparing ``T_ℓ`` with an exactly uniform integer on ``[0, L·2**64)``. Each grid probability
is within ``2**-64`` of eq. (1), and the implemented probabilities are *exactly* affine in
the point (rounding every point's coin separately would leave ``2**-64`` kinks and an
estimator that is not exactly unbiased). The flip coin ``γ'`` is ``γ`` rounded *up* to a
multiple of ``2**-64`` (a larger flip probability can only lower the likelihood ratio).

**Theorem 3 for the implemented coins.** For ``x = ℓs + d`` (``0 <= d < s``) exactly ``d``
of the ``s`` values of ``α`` round up, so a fresh device sends 1 with probability
``((s - d) P_ℓ + d P_{ℓ+1}) / s = P_0 + (x/m)(P_L - P_0)``: the linear interpolation of the
grid coins, which for exactly affine coins is eq. (1) itself (to within ``2**-64``),
whatever ``s``. With perturbation the report is 1 with probability
``Q(x) = γ' + (1 - 2γ') P(x)``, again affine in ``x``.

**Privacy.** One report of a fresh device is ``ε'``-LDP with
``ε' = ln(Q(m) / Q(0))`` (``epsilon_report``, computed from the implemented coins): ``Q`` is
monotone in ``x`` and ``Q(0) = 1 - Q(m)`` (because ``P_0 = 1 - P_L``), so both outputs have
the same worst-case ratio. With ``γ = 0`` this is ``ε`` (up to the ``2**-64`` rounding, which
only lowers it); with ``γ > 0`` it is 000 §4's formula
``ε' = ln(((1 - 2γ) e**ε/(e**ε + 1) + γ) / ((1 - 2γ)/(e**ε + 1) + γ))``
(:func:`epsilon_prime`). Since ``Q(0) + Q(m) = 1``, the perturbed mechanism *is* 1BitMean
with parameter ``ε'`` for one report, which is what 000 Thm 5 needs: several counters with
``Σ x_i <= m`` cost ``ε'' = ε' + e**ε' - 1`` together (:func:`theorem5_epsilon`). Across
rounds, a device whose rounded values take ``w`` distinct points is ``w·ε_memo``-blended
with every device of the same behaviour pattern (000 Thm 4; ``ε_memo = ln(P_L/P_0) <= ε``;
fresh flips are post-processing and do not add to it): :meth:`OneBitMean.epsilon_longitudinal`.

**Known discrepancy in 000 §6.** For ``ε = 1`` and ``γ = 0.2`` the printed §4 formula gives
``ε' = 0.56945`` (≈ 0.57), but §6 states ``ε' = 0.686`` (and then ``ε'' = 1.672`` by Thm 5).
``0.686 = ln((p + γ)/(q + γ))`` is the formula with the ``(1 - 2γ)`` factor dropped, which
is the mechanism that flips with probability ``γ/(1 + 2γ)`` (1/7 for ``γ = 0.2``), not ``γ``.
This module implements §4 as described (flip with probability ``γ``) and the printed
formula; the exact-LDP test confirms ``ε' = 0.56945`` for these coins. ``theorem5_epsilon``
is a function of ``ε'`` and reproduces 1.672 from 0.686.

**Estimator.** ``a = Q(0)`` and ``c = Q(m) - Q(0)`` (:attr:`OneBitMean.affine_coefficients`)
give ``σ̂ = m (λ̂ - a) / c``, exactly unbiased for the mean of the reporting devices' values
(000 eq. 2, generalised; derived with its standard error in the server half,
:mod:`protocol.server.one_bit_mean`).

This module is the device half (pure Python): the parameters and their coins, the privacy
figures, setting up a device's α and memo, the privatizer and the record's wire form.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar, Final, TypeAlias

from protocol.checks import check_epsilon, check_int, count_value, encoded_size, parse_number, require
from protocol.errors import InputError, ParameterError, StateError
from protocol.interfaces import EstimateKind, MechanismEntry, MemoizedState, Privatization, ValueType
from protocol.plain import PlainDoc
from protocol.randomness import SCALE, Coin, RandomSource, binary_keep_coin, coin_at_least, uniform_draws

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "ENTRY",
    "MAX_M",
    "MAX_POINTS",
    "CounterValue",
    "OneBitMean",
    "OneBitMeanRecord",
    "OneBitMeanState",
    "epsilon_prime",
    "theorem5_epsilon",
]

MAX_M = 1 << 53
"""Largest accepted ``m``: values and ``x + α`` stay exact in int64 and in float64."""

MAX_POINTS = 1 << 20
"""Largest accepted number of memoized points ``m/s + 1`` (one bit each, per device)."""

CounterValue: TypeAlias = "int | np.integer[Any]"
"""A counter value: a Python or numpy integer (never a bool)."""

_STATE_KEYS = frozenset({"alpha", "memo", "m", "s", "epsilon"})


def _check_gamma(gamma: float) -> float:
    if isinstance(gamma, bool) or not isinstance(gamma, int | float) or not math.isfinite(gamma):
        raise ParameterError("gamma", "a finite number in [0, 0.5)", gamma)
    if not 0 <= gamma < 0.5:
        raise ParameterError("gamma", "in [0, 0.5)", gamma)
    return float(gamma)


def epsilon_prime(epsilon: float, gamma: float) -> float:
    """ε′ of one report of ε-1BitMean with output perturbation γ, by the formula of 000 §4.

    ``ε′ = ln(((1 - 2γ)·e**ε/(e**ε + 1) + γ) / ((1 - 2γ)·1/(e**ε + 1) + γ))``: the ratio of the
    probabilities of sending 1 at ``x = m`` and at ``x = 0`` when the memoized bit is flipped
    with probability γ. ``epsilon_prime(1, 0.2) ≈ 0.56945`` (000 §6 prints 0.686; see the
    module docstring).

    Args:
        epsilon: ε of 1BitMean, in (0, 64].
        gamma: flip probability, in [0, 0.5).
    """
    eps = check_epsilon(epsilon)
    g = _check_gamma(gamma)
    e = math.exp(eps)
    high = (1 - 2 * g) * e / (e + 1) + g
    low = (1 - 2 * g) / (e + 1) + g
    return math.log(high / low)


def theorem5_epsilon(epsilon_prime: float) -> float:
    """000 Thm 5: ε″ = ε′ + e**ε′ - 1 for several counters collected together with Σ x_i <= m.

    ``theorem5_epsilon(0.686) ≈ 1.672``, the deployment figure of 000 §6.

    Args:
        epsilon_prime: ε′ of one 1BitMean report (with perturbation), > 0.
    """
    eps = check_epsilon(epsilon_prime, "epsilon_prime")
    return eps + math.expm1(eps)


@dataclass(frozen=True, slots=True)
class OneBitMeanRecord:
    """One privatized report: a single bit."""

    bit: int


@dataclass(frozen=True, slots=True)
class OneBitMeanState:
    """A device's permanent randomness (000 §3.1 steps 2-3). Never redrawn.

    Attributes:
        alpha: the rounding offset α ∈ {0, ..., s - 1}.
        memo: the memoized bits of the points 0, s, ..., m, packed little-endian within
            each byte (bit ``ℓ`` is ``memo[ℓ // 8] >> (ℓ % 8) & 1``); padding bits are 0.
        m: the mechanism's range, so a state is never used under other parameters.
        s: the mechanism's segment size.
        epsilon: the ε the memo bits were drawn with.
    """

    alpha: int
    memo: bytes
    m: int
    s: int
    epsilon: float

    def bit(self, index: int) -> int:
        """The memoized bit of point ``index · s``."""
        return (self.memo[index >> 3] >> (index & 7)) & 1

    def to_plain(self) -> PlainDoc:
        """Plain, msgpack-ready data (no raw value: only α and the memo bits)."""
        return {"alpha": self.alpha, "memo": self.memo, "m": self.m, "s": self.s, "epsilon": self.epsilon}

    @classmethod
    def from_plain(cls, mechanism: OneBitMean, data: object) -> OneBitMeanState:
        """Restore a state saved by :meth:`to_plain` for ``mechanism``.

        Raises:
            StateError: on a malformed state, or one saved under other parameters.
        """
        where = "one-bit-mean state"
        alpha = require(data, "alpha", int, where=where)
        memo = require(data, "memo", bytes, where=where)
        m = require(data, "m", int, where=where)
        s = require(data, "s", int, where=where)
        epsilon = require(data, "epsilon", float, where=where)
        extra = set(data) - _STATE_KEYS if isinstance(data, dict) else set()
        if extra:
            raise StateError(f"{where}: unknown fields {sorted(map(str, extra))}")
        if (m, s, epsilon) != (mechanism.m, mechanism.s, mechanism.epsilon):
            raise StateError(
                f"{where}: saved for m={m}, s={s}, epsilon={epsilon}; the mechanism has "
                f"m={mechanism.m}, s={mechanism.s}, epsilon={mechanism.epsilon}"
            )
        if not 0 <= alpha < mechanism.s:
            raise StateError(f"{where}.alpha: need 0 <= alpha < s = {mechanism.s}; got {alpha}")
        points = mechanism.points
        if len(memo) != (points + 7) // 8:
            raise StateError(f"{where}.memo: expected {(points + 7) // 8} bytes for {points} points")
        if points % 8 and memo[-1] >> (points % 8):
            raise StateError(f"{where}.memo: padding bits beyond point {points - 1} must be 0")
        return cls(alpha=alpha, memo=memo, m=m, s=s, epsilon=epsilon)


@dataclass(frozen=True, kw_only=True)
class OneBitMean(MemoizedState):
    """1BitMean with α-point rounding, permanent memoization and output perturbation.

    Args:
        epsilon: ε of the memoized 1BitMean bits (000 eq. 1), in (0, 64].
        m: the counter's range: values are integers in ``[0, m]``; ``1 <= m <= 2**53``.
        s: the segment size of α-point rounding (000 §3.1 step 1); must divide ``m``;
            default ``m`` (two points, 0 and m). At most ``2**20`` points ``m/s + 1``.
        gamma: output perturbation (000 §4): each report flips the memoized bit with
            probability γ, in [0, 0.5).
    """

    state_type: ClassVar[type[OneBitMeanState]] = OneBitMeanState
    record_type: ClassVar[type[OneBitMeanRecord]] = OneBitMeanRecord
    name: ClassVar[str] = "one-bit-mean"
    server: ClassVar[str] = "protocol.server.one_bit_mean:OneBitMeanServer"
    kind: ClassVar[EstimateKind] = EstimateKind.MEAN
    privatization: ClassVar[Privatization] = Privatization.COUNTER
    value_type: ClassVar[ValueType] = ValueType.COUNT
    epsilon: float
    m: int
    s: int | None = None
    gamma: float = 0.0

    def __post_init__(self) -> None:
        # Normalise so that equal mechanisms compare equal (s=None and s=m are the same).
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))
        check_int(self.m, "m", low=1, high=MAX_M)
        s = self.m if self.s is None else self.s
        if isinstance(s, bool) or not isinstance(s, int) or s < 1 or self.m % s:
            raise ParameterError("s", f"a positive integer that divides m = {self.m}", self.s)
        if self.m // s + 1 > MAX_POINTS:
            raise ParameterError("s", f"at least m / {MAX_POINTS - 1} (at most {MAX_POINTS} memo points)", s)
        object.__setattr__(self, "s", s)
        object.__setattr__(self, "gamma", _check_gamma(self.gamma))

    # ----------------------------------------------------------------- derived constants

    @property
    def segment(self) -> int:
        """``s`` as an ``int`` (``s`` is normalised to ``m`` when omitted)."""
        return self.m if self.s is None else self.s

    @property
    def segments(self) -> int:
        """``L = m / s``, the number of rounding segments."""
        return self.m // self.segment

    @property
    def points(self) -> int:
        """``m/s + 1``, the number of memoized points ``0, s, ..., m`` (000 eq. 4)."""
        return self.segments + 1

    @cached_property
    def high_coin(self) -> Coin:
        """The memo coin of the point ``m``: ``e**ε/(e**ε + 1)`` rounded down (000 eq. 1 at x = m)."""
        return binary_keep_coin(self.epsilon)

    @property
    def low_coin(self) -> Coin:
        """The memo coin of the point 0: the complement of :attr:`high_coin` (at least ``1/(e**ε + 1)``)."""
        return self.high_coin.complement

    @cached_property
    def flip_coin(self) -> Coin:
        """The output-perturbation coin: γ rounded up (000 §4)."""
        return coin_at_least(Decimal(self.gamma))

    def memo_probability(self, index: int) -> Fraction:
        """Exact ``Pr[memo bit of point index·s = 1]`` for the implemented coins (``0 <= index <= m/s``)."""
        check_int(index, "index", low=0, high=self.segments)
        low, high = self.low_coin.probability, self.high_coin.probability
        return low + Fraction(index, self.segments) * (high - low)

    def report_probability(self, value: CounterValue) -> Fraction:
        """Exact ``Pr[report = 1]`` of a fresh device holding ``value`` (over α, memo and flip)."""
        x = self._check_value(value)
        ell, d = divmod(x, self.segment)
        # 000 §3.1 step 4: exactly d of the s offsets α round x up to (ℓ+1)s.
        if d:
            p = ((self.segment - d) * self.memo_probability(ell) + d * self.memo_probability(ell + 1)) / self.segment
        else:
            p = self.memo_probability(ell)
        g = self.flip_coin.probability
        return g + (1 - 2 * g) * p

    @cached_property
    def affine_coefficients(self) -> tuple[Fraction, Fraction]:
        """``(a, c)`` with ``Pr[report = 1 | x] = a + c·x/m`` exactly."""
        g = self.flip_coin.probability
        low, high = self.low_coin.probability, self.high_coin.probability
        return g + (1 - 2 * g) * low, (1 - 2 * g) * (high - low)

    @property
    def epsilon_report(self) -> float:
        """Exact ε′ of one report for the implemented coins (``ε`` when γ = 0; 000 §4's ε′ otherwise)."""
        a, c = self.affine_coefficients
        return math.log((a + c) / a)

    @property
    def epsilon_memo(self) -> float:
        """Exact ε of one memoized bit, ``ln(P_L / P_0) <= ε``: the unit of 000 Thm 4."""
        return math.log(self.high_coin.probability / self.low_coin.probability)

    def epsilon_longitudinal(self, width: int) -> float:
        """000 Thm 4: users with the same behaviour pattern of width ``w`` blend within ``e**(w·ε)``.

        Args:
            width: the number of distinct rounded points the device used, in ``[1, m/s + 1]``.
        """
        check_int(width, "width", low=1, high=self.points)
        return width * self.epsilon_memo

    @property
    def epsilon_counters(self) -> float:
        """000 Thm 5's ε″ for several counters with ``Σ x_i <= m`` collected in one round."""
        return self.epsilon_report + math.expm1(self.epsilon_report)

    # --------------------------------------------------------------------------- client

    def setup(self, rng: RandomSource) -> OneBitMeanState:
        """Draw a device's permanent α and memo bits (000 §3.1 steps 2-3).

        The words are consumed in the order of the server half's ``setup_many`` for one
        device (α, then one draw below ``L`` per point, then one word per tie), so a seeded
        device's state is the same on either path.
        """
        alpha = uniform_draws(rng, self.segment, 1)[0]
        # 000 §3.1 step 3, exact coins: the bit of point ℓ is [U < T_ℓ] for U uniform on
        # [0, L·2**64), U = u·2**64 + w with u uniform below L and w a uniform word. Compared
        # lexicographically, u decides unless it ties with T_ℓ's high part (probability 1/L),
        # so a word is drawn only for the ties: Pr[bit = 1] = T_ℓ / (L·2**64) exactly.
        thresholds = self.memo_thresholds
        u = uniform_draws(rng, self.segments, self.points)
        bits = [part < (t >> 64) for part, t in zip(u, thresholds, strict=True)]
        ties = [ell for ell, (part, t) in enumerate(zip(u, thresholds, strict=True)) if part == (t >> 64)]
        for ell, word in zip(ties, rng.draw(len(ties)), strict=True):
            bits[ell] = word < (thresholds[ell] & (SCALE - 1))
        # Point ℓ is bit ℓ of a little-endian integer: byte ℓ // 8, bit ℓ % 8 from the low end.
        packed = int("".join("1" if bit else "0" for bit in reversed(bits)), 2)
        memo = packed.to_bytes((self.points + 7) // 8, "little")
        return OneBitMeanState(alpha=alpha, memo=memo, m=self.m, s=self.segment, epsilon=self.epsilon)

    @cached_property
    def memo_thresholds(self) -> tuple[int, ...]:
        """``T_ℓ = L·N_0 + ℓ·(N_L - N_0)``: point ℓ's memo bit is 1 with probability ``T_ℓ / (L·2**64)``."""
        low, high = self.low_coin.numerator, self.high_coin.numerator
        return tuple(self.segments * low + ell * (high - low) for ell in range(self.points))

    def check_state(self, state: OneBitMeanState) -> None:
        """Refuse a state drawn under other parameters (or hand-built wrongly).

        Raises:
            StateError: if ``state`` does not belong to this mechanism.
        """
        if (state.m, state.s, state.epsilon) != (self.m, self.segment, self.epsilon):
            raise StateError(
                f"one-bit-mean state for m={state.m}, s={state.s}, epsilon={state.epsilon} used with {self}"
            )
        if not 0 <= state.alpha < self.segment or len(state.memo) != (self.points + 7) // 8:
            raise StateError("one-bit-mean state: alpha or memo length does not fit the mechanism")

    def _check_value(self, value: object) -> int:
        # A numpy integer scalar counts as the int it holds; it is recognised by its type's
        # module, so that a device, which has no numpy, never imports it (numpy's bool is no
        # numbers.Integral, so it stays refused like bool).
        if type(value).__module__ == "numpy" and isinstance(value, numbers.Integral):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError(f"one-bit-mean takes an integer counter in [0, {self.m}]; got {value!r}")
        x = value
        if not 0 <= x <= self.m:
            raise InputError(f"one-bit-mean counter must lie in [0, {self.m}]; got {x}")
        return x

    def rounded_index(self, value: CounterValue, alpha: int) -> int:
        """000 §3.1 step 4: the index ``ℓ`` of the point ``ℓs`` that ``value`` rounds to under ``alpha``."""
        x = self._check_value(value)
        ell, d = divmod(x, self.segment)
        # x ∈ [ℓs, (ℓ+1)s): round down iff x + α < (ℓ+1)s, i.e. d + α < s. x = m gives d = 0, ℓ = L.
        return ell + (d + alpha >= self.segment)

    def privatize(
        self, value: CounterValue, state: OneBitMeanState, rng: RandomSource
    ) -> tuple[OneBitMeanRecord, OneBitMeanState]:
        """Report ``value``: the memoized bit of its rounded point, flipped with probability γ.

        The state is returned unchanged (memo bits are never redrawn).

        Raises:
            InputError: if ``value`` is not an integer in ``[0, m]``.
            StateError: if ``state`` belongs to other parameters.
        """
        self.check_state(state)
        bit = state.bit(self.rounded_index(value, state.alpha))
        flip = self.flip_coin.numerator
        # 000 §4: a fresh coin every report; γ = 0 draws nothing.
        if flip and rng.draw(1)[0] < flip:
            bit ^= 1
        return OneBitMeanRecord(bit), state

    def output_distribution(self, value: CounterValue) -> dict[int, Fraction]:
        """Exact ``Pr[output | value]`` of a fresh device, as the coins implement it."""
        p = self.report_probability(value)
        return {1: p, 0: 1 - p}

    # --------------------------------------------------------------------------- wire

    def encode_records(self, records: Sequence[OneBitMeanRecord]) -> list[Any]:
        """The records' compact wire form: a list of 0/1 integers."""
        return [r.bit for r in records]

    @property
    def max_record_bytes(self) -> int:
        """Most bytes one record takes in a report: one bit."""
        return encoded_size(1)

    # --- the contract of protocol.interfaces (plain forms for the shells)

    @property
    def value_range(self) -> tuple[float, float]:
        """``[0, m]``."""
        return (0.0, float(self.m))

    def privacy_figures(self) -> dict[str, float]:
        """ε′ of a report, ε of the memo bits (000 Thm 4's unit) and 000 Thm 5's ε″."""
        return {
            "epsilon_report": self.epsilon_report,
            "epsilon_memo": self.epsilon_memo,
            "epsilon_counters": self.epsilon_counters,
            # A counter that keeps its value rounds to one point with the device's fixed α, whose
            # memoized bit has ε = epsilon_memo however often it is reported (000 §3.1): the cost
            # of starting a new memo when the registry changes the parameters.
            "epsilon_longitudinal": self.epsilon_memo,
        }

    def check_value(self, value: object) -> int:
        """One recorded increment: an integer in ``[0, 2**53]`` (the period's total is clipped to ``m``)."""
        return count_value(value, self.m)

    def parse_value(self, text: str) -> int:
        """An integer typed on a command line."""
        return count_value(parse_number(text, integer=True), self.m)

    def counter_input(self, total: float) -> int:
        """A period's total, clipped to ``m``: 000 §1.1 assumes counters bounded by ``m``."""
        return min(int(total), self.m)


ENTRY: Final = MechanismEntry(name=OneBitMean.name, build=OneBitMean, epsilon_parameter=True)
"""This module's entry in the mechanism table (:mod:`protocol.interfaces`)."""
