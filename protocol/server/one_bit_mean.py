"""The server half of 1BitMean: decode, fold, estimate, plan, and the vectorised simulation
paths (000 §2.1, §3.1, §4; see :mod:`protocol.one_bit_mean` for the client, the implemented
coins and the privacy figures).

**Estimator** (000 eq. 2, generalised). Let ``a = Q(0) = γ' + (1 - 2γ') P_0`` and
``c = Q(m) - Q(0) = (1 - 2γ')(P_L - P_0)``. Each device's bit has mean ``a + c x_i / m``
(over its own α, memo and flip), so with ``λ̂ = Σb / n``::

    σ̂ = m (λ̂ - a) / c

is exactly unbiased for the mean of the reporting devices' values (with exact coins,
``γ = 0``: ``a = 1/(e**ε + 1)``, ``c = (e**ε - 1)/(e**ε + 1)``, which is eq. 2). Devices are
independent, so ``Var[σ̂] = (m/c)**2 Σ Q_i (1 - Q_i) / n**2`` with ``Q_i = a + c x_i/m``. The
server does not know ``Σ Q_i**2``; by Jensen ``Σ Q_i (1 - Q_i) <= n λ̄ (1 - λ̄)`` (``λ̄`` the
mean ``Q_i``), with equality when all values are equal and a gap of
``(c/m)**2 Σ (x_i - x̄)**2`` otherwise: the plug-in SE below is 3.7% above the exact one
for uniform data at ``ε = 1`` (1.3% with ``γ = 0.2``), and at most ``1/sqrt(1 - c**2)``
above it (12.7% at ``ε = 1``, for data split evenly between 0 and ``m``). The
reported standard error is the plug-in ``(m/c) sqrt(λ̃ (1 - λ̃) / n)`` with ``λ̂`` clipped to
``[Q(0), Q(m)]`` (where every ``Q_i`` lies), so it never collapses to 0 by noise. The
estimate itself is not clipped to ``[0, m]``: clipping would bias it. Within one period,
reports from the same device must be counted once (one bit per device per period).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from protocol.checks import check_int
from protocol.errors import InputError, StateError
from protocol.one_bit_mean import OneBitMean, OneBitMeanRecord, OneBitMeanState
from protocol.randomness import SCALE, RandomSource, bernoulli, uniform_ints
from protocol.server.bit_sum import BitSumAggregate
from protocol.server.contract import PlainServer, PlanFigures
from protocol.server.estimate import Estimate
from protocol.server.records import decode_bits

__all__ = ["OneBitMeanAggregate", "OneBitMeanBatch", "OneBitMeanServer", "OneBitMeanStates"]


@dataclass(frozen=True, eq=False)
class OneBitMeanBatch:
    """Privatized bits in columnar form (``uint8`` zeros and ones)."""

    bits: npt.NDArray[np.uint8]

    def __len__(self) -> int:
        return int(self.bits.size)


@dataclass(frozen=True, eq=False)
class OneBitMeanStates:
    """Many devices' permanent states in columnar form (the simulator's and the tests' path).

    Attributes:
        alphas: ``int64`` array of shape ``(n,)``, each in ``{0, ..., s - 1}``.
        memo: ``bool`` array of shape ``(n, m/s + 1)``; row ``i`` holds device ``i``'s bits.
        m: the mechanism's range.
        s: the mechanism's segment size.
        epsilon: the ε the memo bits were drawn with.
    """

    alphas: npt.NDArray[np.int64]
    memo: npt.NDArray[np.bool_]
    m: int
    s: int
    epsilon: float

    def __len__(self) -> int:
        return int(self.alphas.size)

    def state(self, i: int) -> OneBitMeanState:
        """Device ``i``'s state in the single-device form."""
        packed = np.packbits(self.memo[i], bitorder="little").tobytes()
        return OneBitMeanState(alpha=int(self.alphas[i]), memo=packed, m=self.m, s=self.s, epsilon=self.epsilon)

    @classmethod
    def from_states(cls, mechanism: OneBitMean, states: Sequence[OneBitMeanState]) -> OneBitMeanStates:
        """Stack single-device states (each checked against ``mechanism``) into columns."""
        for st in states:
            mechanism.check_state(st)
        alphas = np.fromiter((st.alpha for st in states), dtype=np.int64, count=len(states))
        width = (mechanism.points + 7) // 8
        raw = np.frombuffer(b"".join(st.memo for st in states), dtype=np.uint8).reshape(len(states), width)
        memo = np.unpackbits(raw, axis=1, count=mechanism.points, bitorder="little").astype(np.bool_)
        return cls(alphas=alphas, memo=memo, m=mechanism.m, s=mechanism.segment, epsilon=mechanism.epsilon)


class OneBitMeanAggregate(BitSumAggregate[OneBitMean]):
    """``Σb`` and ``n`` for one period (exact integers); merges by addition."""

    label = "one-bit-mean aggregate"

    def estimate(self) -> Estimate:
        """The mean counter of the reporting devices (000 eq. 2, inverted for γ), with its SE.

        NaN with ``n = 0``. The SE is the Jensen upper bound of the module docstring.
        """
        if self._n == 0:
            return Estimate(math.nan, math.nan, 0)
        a, c = self.mechanism.affine_coefficients
        m = self.mechanism.m
        lam = Fraction(self.ones, self._n)
        value = m * (lam - a) / c
        clipped = float(min(max(lam, a), a + c))
        se = m / float(c) * math.sqrt(clipped * (1 - clipped) / self._n)
        return Estimate(float(value), se, self._n)


class OneBitMeanServer(PlainServer[OneBitMean, OneBitMeanBatch, OneBitMeanAggregate]):
    """1BitMean's server half."""

    batch_type: ClassVar[type[OneBitMeanBatch]] = OneBitMeanBatch
    aggregate_type: ClassVar[type[OneBitMeanAggregate]] = OneBitMeanAggregate

    def batch(self, records: Sequence[OneBitMeanRecord]) -> OneBitMeanBatch:
        """Typed records in columnar form."""
        return OneBitMeanBatch(np.fromiter((r.bit for r in records), dtype=np.uint8, count=len(records)))

    def decode_records(self, raw: object) -> OneBitMeanBatch:
        """Strictly decode the wire form of ``encode_records``.

        Raises:
            MalformedReportError: ``bad-type`` or ``out-of-range``, naming ``records[i]``.
        """
        return OneBitMeanBatch(decode_bits(raw))

    def estimate_mean(self, aggregate: object) -> Estimate:
        """The mean counter (000 eq. 2)."""
        return self.own_aggregate(aggregate).estimate()

    def estimate_count(self, aggregate: object) -> None:
        """A mean has no count."""
        return

    def plan(self, n: float) -> PlanFigures:
        """The worst-case SE ``m / (2 c sqrt n)`` (000 eq. 2 at ``λ = 1/2``), for the implemented coins."""
        mech = self.mechanism
        _, c = mech.affine_coefficients
        return PlanFigures(
            n=n,
            standard_error=mech.m / (2 * float(c) * math.sqrt(n)),
            unit="mean",
            figures=mech.privacy_figures(),
            formulas=(
                "SE <= m/(2c sqrt n), c = (e^eps'-1)/(e^eps'+1); eps' = eps without perturbation (000 eq. 2, §4)",
                "000 Thm 5: counters sharing the bound cost eps'' = eps' + e^eps' - 1",
            ),
        )

    # ------------------------------------------------------------------ simulation paths

    @cached_property
    def _threshold_high(self) -> npt.NDArray[np.int64]:
        return np.array([t >> 64 for t in self.mechanism.memo_thresholds], dtype=np.int64)

    @cached_property
    def _threshold_low(self) -> npt.NDArray[np.uint64]:
        return np.array([t & (SCALE - 1) for t in self.mechanism.memo_thresholds], dtype=np.uint64)

    def setup_many(self, n: int, rng: RandomSource) -> OneBitMeanStates:
        """Draw ``n`` devices' permanent states at once; each is distributed as the device's
        ``setup``, and ``setup_many(1, rng)`` consumes the words ``setup`` does, giving the same state."""
        mech = self.mechanism
        check_int(n, "n", low=0)
        big_l, points = mech.segments, mech.points
        alphas = uniform_ints(rng, mech.segment, n)
        # The exact coins of the device's setup (protocol.one_bit_mean), for n devices at once.
        u = uniform_ints(rng, big_l, n * points).reshape(n, points)
        high = self._threshold_high
        memo = u < high
        tie = u == high
        memo[tie] = rng.words(int(np.count_nonzero(tie))) < np.broadcast_to(self._threshold_low, (n, points))[tie]
        return OneBitMeanStates(alphas=alphas, memo=memo, m=mech.m, s=mech.segment, epsilon=mech.epsilon)

    def privatize_many(self, values: npt.ArrayLike, states: OneBitMeanStates, rng: RandomSource) -> OneBitMeanBatch:
        """Privatize ``values[i]`` with device ``i``'s state; the same coins, in the same order, as
        the device's ``privatize`` of each value in turn.

        Raises:
            InputError: if a value is not an integer in ``[0, m]``.
            StateError: if ``states`` do not fit this mechanism or the number of values.
        """
        mech = self.mechanism
        v = np.asarray(values)
        if v.ndim != 1 or v.dtype.kind not in "iu":
            raise InputError(
                f"one-bit-mean takes a 1-d integer array of counters; got dtype {v.dtype}, shape {v.shape}"
            )
        n = int(v.size)
        if (states.m, states.s, states.epsilon) != (mech.m, mech.segment, mech.epsilon):
            raise StateError("one-bit-mean states were drawn for other parameters")
        if states.alphas.shape != (n,) or states.memo.shape != (n, mech.points):
            raise StateError(f"one-bit-mean states do not match {n} values and {mech.points} points")
        if n and (int(v.min()) < 0 or int(v.max()) > mech.m):
            raise InputError(f"one-bit-mean counters must lie in [0, {mech.m}]")
        x = v.astype(np.int64, copy=False)
        s = mech.segment
        idx = x // s + ((x % s + states.alphas) >= s)
        bits = states.memo[np.arange(n), idx].astype(np.uint8)
        if mech.flip_coin.numerator:
            bits ^= bernoulli(rng, mech.flip_coin, n).astype(np.uint8)
        return OneBitMeanBatch(bits)
