"""Projective geometry response (``pgr``), the device half (Feldman, Nelson, Nguyen, Talwar, ICML 2022).

**The geometry.** For a prime ``q`` and a dimension ``t >= 2``, the points of the projective space
PG(t-1, q) are the lines through the origin of ``F_q**t``, each written by its canonical vector
(first non-zero coordinate 1); there are ``K = (q**t - 1) / (q - 1)`` of them. Category ``c`` of
``k <= K`` is point ``c`` in the order of :func:`point_of` (the remaining ``K - k`` points are held by
nobody). A point ``u`` lies on the hyperplane of ``v`` when ``<u, v> = 0``: every hyperplane holds
``h = (q**(t-1) - 1) / (q - 1)`` points and two hyperplanes share ``h2 = (q**(t-2) - 1) / (q - 1)``.

**The randomizer.** A device holding ``v`` reports a point ``u`` with probability ``e**ε / Z`` if
``<u, v> = 0`` and ``1 / Z`` otherwise (``Z = h e**ε + K - h``). A report is one point: ⌈log2 K⌉
bits. Its sets ``{v : <u, v> = 0}`` are nearly pairwise independent, so with ``q ≈ e**ε + 1`` the
error matches subset selection's, the minimax one, at a fraction of the report size and with a
fast reconstruction (Feldman et al. 2022 §3-4). Sampling: a coin with ``α = h e**ε / Z``
(rounded down) chooses the hyperplane of ``v`` or its complement; within it, a point uniformly.
With ``v``'s leading 1 at position ``i``, the vectors ``e_j - v_j e_i`` (``j != i``) are a basis of
the hyperplane, so a uniform point of PG(t-2, q) (``h`` of them) maps to a uniform point of the
hyperplane, and a uniform ``c ∈ F_q**(t-1)`` to ``e_i + Σ c_j (e_j - v_j e_i)``, which runs once
over the canonical-up-to-scale representatives ``<u, v> = 1`` of the ``K - h = q**(t-1)`` points
off it. A report draws two uniform words: the coin's, and one taken modulo ``h`` or ``q**(t-1)``
(:func:`protocol.randomness.uniform_word`).

**Privacy.** Every output has probability ``α / h`` or ``(1 - α) / (K - h)``; the largest ratio is
``α (K - h) / ((1 - α) h) <= e**ε`` for the implemented coin, reached for any two values (a
hyperplane of one that misses the other always exists).

**Estimator.** A report ``u`` supports every ``v`` on its hyperplane: ``Pr = α`` when ``v`` was
held and ``β = α h2 / h + (1 - α)(h - h2) / (K - h)`` when another value was, so the support
estimator of :mod:`protocol.server.support` applies (``p* = α``, ``q* = β``). The server half
(:mod:`protocol.server.pgr`) computes every category's support count from the histogram of
reported points in ``O(q**t t log q)`` time.

**Parameters.** ``q`` (a prime) and ``t``, by default those of least variance among the ``(q, t)``
whose ``K`` holds the categories and whose reconstruction stays cheap: a Fourier table ``q**t``
within :data:`WORK_CELLS`, or, where that keeps ``q`` well below ``e**ε + 1`` (large ``k`` and
large ε), a geometry summed hyperplane by hyperplane (``k h`` within :data:`ENUMERATION_WORK`,
``K`` within :data:`DEFAULT_POINTS`), taken only when it cuts the variance by more than
:data:`BEYOND_TABLE_GAIN` so that every other default is the table's (``t = 2`` needs neither:
each hyperplane of PG(1, q) is one point, and the mechanism is k-ary randomized response over
``q + 1`` symbols). The planner shows the geometry and its cost.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property
from typing import Any, ClassVar, Final

from protocol.categories import FixedCategories, convert_categories
from protocol.checks import check_int, encoded_size
from protocol.errors import ParameterError
from protocol.interfaces import MechanismEntry
from protocol.randomness import Coin, RandomSource, coin_at_most, dexp, log_ratio, uniform_word

__all__ = [
    "BEYOND_TABLE_GAIN",
    "DEFAULT_POINTS",
    "ENTRY",
    "ENUMERATION_WORK",
    "MAX_CELLS",
    "MAX_ENUMERATION",
    "WORK_CELLS",
    "Geometry",
    "ProjectiveGeometryResponse",
    "choose_geometry",
    "is_prime",
    "point_offsets",
]

WORK_CELLS: Final = 1 << 23
"""The largest reconstruction table (``q**t`` complex numbers, 128 MiB) the default ``(q, t)`` uses."""
MAX_CELLS: Final = 1 << 26
"""The largest reconstruction table an explicit ``(q, t)`` may ask for (1 GiB), and the most points
``K`` any geometry may have (its aggregate is ``K`` counts)."""
ENUMERATION_WORK: Final = 1 << 28
"""The most ``k h`` (categories times a hyperplane's points) a default geometry past the table sums."""
MAX_ENUMERATION: Final = 1 << 31
"""The most ``k h`` an explicit geometry past the table may ask the reconstruction to sum."""
DEFAULT_POINTS: Final = 1 << 22
"""The most points ``K`` a default geometry past the table may have (an aggregate of 32 MiB)."""
BEYOND_TABLE_GAIN: Final = 0.9
"""A default geometry past the table is taken only below this share of the table's best variance:
its aggregate is far larger and its reconstruction slower, worth it only where the table's field is
far from ``e**ε + 1`` (k = 65,536 at ε = 8: 5.9x subset selection's variance within the table,
1.06x past it)."""
DRAW_WORDS: Final = 2
"""Uniform words a report draws: the coin's and the point's."""
_OUTPUT_LIMIT: Final = 1 << 16


def is_prime(n: int) -> bool:
    """Whether ``n`` is prime (trial division; ``n`` up to a few times ``2**24`` here)."""
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    return all(n % f for f in range(3, math.isqrt(n) + 1, 2))


@dataclass(frozen=True)
class Geometry:
    """PG(t-1, q): its point count ``K``, a hyperplane's ``h``, two hyperplanes' common ``h2``."""

    q: int
    t: int

    @property
    def points(self) -> int:
        """``K = (q**t - 1) / (q - 1)``."""
        return int((self.q**self.t - 1) // (self.q - 1))

    @property
    def h(self) -> int:
        """Points on one hyperplane: ``(q**(t-1) - 1) / (q - 1)``."""
        return int((self.q ** (self.t - 1) - 1) // (self.q - 1))

    @property
    def h2(self) -> int:
        """Points on two distinct hyperplanes: ``(q**(t-2) - 1) / (q - 1)``."""
        return int((self.q ** (self.t - 2) - 1) // (self.q - 1))

    @property
    def table_cells(self) -> int:
        """The Fourier reconstruction's table, ``q**t``."""
        return int(self.q**self.t)

    def enumeration_work(self, k: int) -> int:
        """The histogram cells summed hyperplane by hyperplane for ``k`` categories: ``k h``."""
        return k * self.h

    def reconstruction(self, k: int, *, table_limit: int = WORK_CELLS) -> str:
        """How the server half sums ``k`` categories' hyperplanes (:mod:`protocol.server.pgr`):
        ``"direct"`` for ``t = 2``, a Fourier ``"table"`` when ``q**t`` fits ``table_limit``,
        else ``"enumeration"`` (the cheaper of the two for an explicit geometry)."""
        if self.t == 2:
            return "direct"
        if self.table_cells <= table_limit:
            return "table"
        table_ok = self.table_cells <= MAX_CELLS
        enumeration_ok = self.enumeration_work(k) <= MAX_ENUMERATION
        if table_ok and enumeration_ok:
            # Both give the same integers; the transform costs about q**t (t log2 q) operations,
            # the sums about 8 numpy passes over k h cells.
            table_ops = self.table_cells * (self.t * math.log2(self.q) + 4)
            return "table" if table_ops <= 8 * self.enumeration_work(k) else "enumeration"
        return "table" if table_ok else "enumeration"

    def support(self, alpha: float) -> tuple[float, float]:
        """``(α, β)`` of the support estimator for the coin ``α`` (module docstring)."""
        h, h2, k = self.h, self.h2, self.points
        return alpha, alpha * h2 / h + (1 - alpha) * (h - h2) / (k - h)

    def ideal_alpha(self, epsilon: float) -> float:
        """``h e**ε / (h e**ε + K - h)``."""
        e = math.exp(min(epsilon, 700.0))
        return self.h * e / (self.h * e + self.points - self.h)

    def variance(self, epsilon: float) -> float:
        """Per-report variance of an unheld category's count, ``β (1 - β) / (α - β)**2``."""
        a, b = self.support(self.ideal_alpha(epsilon))
        return b * (1 - b) / (a - b) ** 2


def _next_prime(n: int) -> int:
    while not is_prime(n):
        n += 1
    return n


@functools.cache
def _primes_to(n: int) -> tuple[int, ...]:
    """The primes up to ``n`` (a sieve: :func:`choose_geometry` walks a few hundred of them)."""
    sieve = bytearray([1]) * (n + 1)
    sieve[:2] = b"\x00\x00"
    for p in range(2, math.isqrt(n) + 1):
        if sieve[p]:
            sieve[p * p :: p] = bytes(len(range(p * p, n + 1, p)))
    return tuple(i for i, is_p in enumerate(sieve) if is_p)


def choose_geometry(k: int, epsilon: float, *, work_cells: int = WORK_CELLS) -> Geometry:
    """The default ``(q, t)`` for ``k`` categories at ε (module docstring, "Parameters").

    ``t = 2`` with the smallest prime ``q >= k - 1`` always qualifies (k-ary randomized response);
    ``t >= 3`` is tried for every prime ``q`` with ``q**t`` within ``work_cells``, and past it for
    ``q`` up to the largest that keeps ``K`` within :data:`DEFAULT_POINTS`.
    """
    best = Geometry(_next_prime(max(2, k - 1)), 2)
    best_variance = best.variance(epsilon)
    beyond: Geometry | None = None
    beyond_variance = math.inf
    # Past both limits for t = 3 no larger q qualifies, and for larger t a smaller one already stops.
    primes = _primes_to(max(round(work_cells ** (1 / 3)), math.isqrt(DEFAULT_POINTS)) + 2)
    t = 3
    while 2**t <= work_cells:
        for q in primes:
            g = Geometry(q, t)
            in_table = q**t <= work_cells
            if not in_table and g.points > DEFAULT_POINTS:
                break
            if g.points < k:
                continue
            variance = g.variance(epsilon)
            if in_table:
                if variance < best_variance:
                    best, best_variance = g, variance
            elif variance < beyond_variance and g.enumeration_work(k) <= ENUMERATION_WORK:
                beyond, beyond_variance = g, variance
        t += 1
    if beyond is not None and beyond_variance < BEYOND_TABLE_GAIN * best_variance:
        return beyond
    return best


@dataclass(frozen=True, kw_only=True)
class ProjectiveGeometryResponse(FixedCategories):
    """Projective geometry response over fixed categories; a record is the reported point's index.

    Args:
        epsilon, categories: as :class:`~protocol.categories.FixedCategories` (checked there).
        q: the field size, a prime; ``0`` (the default) chooses ``q`` and ``t`` (:func:`choose_geometry`).
        t: the dimension, at least 2 (``0`` with ``q = 0``).
    """

    name: ClassVar[str] = "pgr"
    record_type: ClassVar[type[int]] = int
    server: ClassVar[str] = "protocol.server.pgr:PGRServer"
    q: int = field(default=0)
    t: int = field(default=0)

    def __post_init__(self) -> None:
        super().__post_init__()
        cats = self.categories
        if type(self.q) is int and type(self.t) is int and self.q == self.t == 0:
            g = choose_geometry(len(cats), self.epsilon)
            object.__setattr__(self, "q", g.q)
            object.__setattr__(self, "t", g.t)
        check_int(self.q, "q", low=2, high=1 << 32)
        if not is_prime(self.q):
            raise ParameterError("q", "a prime (the field F_q; 0 with t = 0 chooses both)", self.q)
        check_int(self.t, "t", low=2, high=64)
        g = Geometry(self.q, self.t)
        if g.points < len(cats):
            raise ParameterError("t", f"(q**t - 1)/(q - 1) >= the {len(cats):,} categories", self.t)
        if g.points > MAX_CELLS:
            raise ParameterError("q", f"(q**t - 1)/(q - 1) <= {MAX_CELLS:,} points (the aggregate)", self.q)
        if g.t >= 3 and g.table_cells > MAX_CELLS and g.enumeration_work(len(cats)) > MAX_ENUMERATION:
            raise ParameterError(
                "q",
                f"q**t <= {MAX_CELLS:,} (a reconstruction table) or k h <= {MAX_ENUMERATION:,} (the hyperplane sums)",
                self.q,
            )

    @cached_property
    def geometry(self) -> Geometry:
        """PG(t-1, q)."""
        return Geometry(self.q, self.t)

    @cached_property
    def reconstruction(self) -> str:
        """How the server half sums the hyperplanes (:meth:`Geometry.reconstruction`)."""
        return self.geometry.reconstruction(self.k)

    @cached_property
    def hyperplane_coin(self) -> Coin:
        """The report lies on ``v``'s hyperplane: ``h e**ε / (h e**ε + K - h)``, rounded down."""
        g = self.geometry
        e = dexp(self.epsilon)
        return coin_at_most(g.h * e / (g.h * e + g.points - g.h))

    @property
    def support_probabilities(self) -> tuple[float, float]:
        """``(α, β)`` for the implemented coin."""
        return self.geometry.support(float(self.hyperplane_coin.probability))

    @cached_property
    def epsilon_report(self) -> float:
        """``ln(α (K - h) / ((1 - α) h))`` for the implemented coin (at most ε)."""
        a, g = self.hyperplane_coin.probability, self.geometry
        return log_ratio(a * (g.points - g.h) / ((1 - a) * g.h))

    # ------------------------------------------------------------------ the points

    @cached_property
    def offsets(self) -> tuple[int, ...]:
        """``offsets[i]``: the index of the first point whose leading 1 is at position ``i``."""
        return point_offsets(self.q, self.t)

    def point_of(self, index: int) -> tuple[int, ...]:
        """The canonical vector of point ``index`` of PG(t-1, q)."""
        return _point(index, self.q, self.t, self.offsets)

    @cached_property
    def _hyperplane_offsets(self) -> tuple[int, ...]:
        # The points of PG(t-2, q), which index a hyperplane's points (module docstring).
        return point_offsets(self.q, self.t - 1)

    @cached_property
    def _off_points(self) -> int:
        return int(self.q ** (self.t - 1))

    @cached_property
    def _others(self) -> tuple[tuple[int, ...], ...]:
        # For each leading position, the other positions: where a hyperplane basis puts c.
        return tuple(tuple(j for j in range(self.t) if j != lead) for lead in range(self.t))

    def index_of_point(self, u: Sequence[int]) -> int:
        """The index of the point of any non-zero vector ``u`` (scaled to its canonical form)."""
        q = self.q
        lead = 0
        while u[lead] % q == 0:
            lead += 1
        inverse = pow(u[lead] % q, q - 2, q)
        rest = 0
        for x in u[lead + 1 :]:
            rest = rest * q + (x * inverse) % q
        return self.offsets[lead] + rest

    def privatize(self, value: str, state: None, rng: RandomSource) -> tuple[int, None]:
        """One reported point for category ``value`` (module docstring)."""
        v = self.point_of(self.index_of(value))
        coin_word, point_word = rng.draw(DRAW_WORDS)
        on = coin_word < self.hyperplane_coin.numerator
        return self.reported_point(v, on, point_word, rng), None

    def reported_point(self, v: tuple[int, ...], on: bool, word: int, rng: RandomSource) -> int:
        """The point the word chooses on ``v``'s hyperplane (``on``) or off it."""
        q, t = self.q, self.t
        lead = v.index(1)
        c: Sequence[int]
        if on:
            c = _point(uniform_word(rng, word, self.geometry.h), q, t - 1, self._hyperplane_offsets)
            first = 0
        else:
            c = _digits(uniform_word(rng, word, self._off_points), q, t - 1)
            first = 1
        u = [0] * t
        for cj, j in zip(c, self._others[lead], strict=True):
            u[j] = cj
            first -= cj * v[j]
        u[lead] = first % q
        return self.index_of_point(u)

    def output_distribution(self, value: str) -> dict[int, Fraction]:
        """Exact ``Pr[point | value]`` for every point, as the coins implement it (small ``K`` only)."""
        g = self.geometry
        if g.points > _OUTPUT_LIMIT:
            raise ValueError(f"K = {g.points} points too many to enumerate")
        v = self.point_of(self.index_of(value))
        a = self.hyperplane_coin.probability
        on, off = a / g.h, (1 - a) / (g.points - g.h)
        return {
            i: on if sum(x * y for x, y in zip(self.point_of(i), v, strict=True)) % self.q == 0 else off
            for i in range(g.points)
        }

    def encode_records(self, records: Sequence[int]) -> list[Any]:
        """Records are their wire form already (point indices)."""
        return list(records)

    @property
    def max_record_bytes(self) -> int:
        """The largest point index, in msgpack."""
        return encoded_size(self.geometry.points - 1)


def point_offsets(q: int, t: int) -> tuple[int, ...]:
    """The first index of the points of PG(t-1, q) with their leading 1 at each position: points are
    ordered by that position, then by their remaining coordinates read as a base-q number."""
    out, total = [], 0
    for i in range(t):
        out.append(total)
        total += q ** (t - 1 - i)
    return tuple(out)


def _digits(value: int, q: int, width: int) -> list[int]:
    """``value`` in base ``q``, ``width`` digits, most significant first."""
    out = [0] * width
    for i in range(width - 1, -1, -1):
        value, out[i] = divmod(value, q)
    return out


def _point(index: int, q: int, t: int, offsets: Sequence[int]) -> tuple[int, ...]:
    lead = bisect.bisect_right(offsets, index) - 1
    return (0,) * lead + (1, *_digits(index - offsets[lead], q, t - 1 - lead))


ENTRY: Final = MechanismEntry(
    name=ProjectiveGeometryResponse.name,
    build=ProjectiveGeometryResponse,
    epsilon_parameter=True,
    converters={"categories": convert_categories},
)
"""This module's entry in the registry's table (:data:`protocol.registry.BUILTIN_MECHANISMS`)."""
