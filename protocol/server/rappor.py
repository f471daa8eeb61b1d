"""The server half of RAPPOR: decode, fold, estimate, simulate (004 §4 and Appendix; see
:mod:`protocol.rappor` for the randomizer and the estimator's derivation).

The aggregate keeps the per-cohort bit counts ``c_ij`` and report counts ``N_j``; its
estimates are the unbiased ``t_ij`` with plug-in standard errors and, for the basic variants,
the category counts ``Σ_j t_ij``. The Bloom-filter variants are decoded against candidate
strings by the collector (:mod:`collector.decoding.rappor`), from :meth:`RapporServer.estimate_bits`
and the candidates' Bloom bits (:meth:`RapporServer.candidate_positions`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar, Self

import numpy as np
import numpy.typing as npt

from protocol.errors import InputError, ParameterError, StateError
from protocol.plain import PlainDoc
from protocol.randomness import SCALE, RandomSource, bernoulli
from protocol.rappor import Rappor, RapporRecord
from protocol.server.contract import PlainServer, PlanFigures
from protocol.server.estimate import BitEstimates, VectorEstimate
from protocol.server.hashing import Fingerprints, evaluate, family_fingerprints
from protocol.server.parallel import Threads
from protocol.server.plain import array_from_plain, array_to_plain, require
from protocol.server.records import decode_indexed_bits

__all__ = ["RapporAggregate", "RapporBatch", "RapporServer"]

_CHUNK = 1 << 16
"""Devices per block in the batch paths, so ``block x k`` coin words stay a few tens of MB."""

# _BYTE_BITS[v, b] is bit b (most significant first) of the byte value v.
_BYTE_BITS = ((np.arange(256, dtype=np.int64)[:, None] >> (7 - np.arange(8, dtype=np.int64))[None, :]) & 1).astype(
    np.int64
)


@dataclass(frozen=True, eq=False)
class RapporBatch:
    """Reports in columnar form.

    Attributes:
        cohorts: ``int64`` array ``(n,)`` of cohort numbers.
        bits: ``uint8`` array ``(n, ceil(k/8))`` of packed reports (zero padding bits).
    """

    cohorts: npt.NDArray[np.int64]
    bits: npt.NDArray[np.uint8]

    def __len__(self) -> int:
        return int(self.cohorts.size)


class RapporAggregate:
    """Per-cohort bit counts ``c_ij`` and report counts ``N_j`` (004 §4); merges by addition."""

    def __init__(
        self,
        mechanism: Rappor,
        *,
        counts: npt.NDArray[np.int64] | None = None,
        sizes: npt.NDArray[np.int64] | None = None,
    ) -> None:
        self.mechanism = mechanism
        shape = (mechanism.cohorts, mechanism.k)
        self.counts = np.zeros(shape, dtype=np.int64) if counts is None else counts
        self.sizes = np.zeros(mechanism.cohorts, dtype=np.int64) if sizes is None else sizes
        if self.counts.shape != shape or self.sizes.shape != (mechanism.cohorts,):
            raise ValueError("aggregate arrays do not match the mechanism's cohorts and k")

    @property
    def n(self) -> int:
        """Number of reports folded in."""
        return int(self.sizes.sum())

    def add(self, batch: RapporBatch) -> None:
        """Fold a batch of reports (vectorised: one ``bincount`` per byte of the report)."""
        m = self.mechanism
        n = len(batch)
        if batch.bits.shape != (n, m.report_bytes):
            raise ValueError(f"batch bits must have shape ({n}, {m.report_bytes})")
        if n == 0:
            return
        coh = batch.cohorts.astype(np.intp, copy=False)
        if int(coh.min()) < 0 or int(coh.max()) >= m.cohorts:
            raise ValueError(f"batch cohorts must lie in [0, {m.cohorts})")
        # Count, per cohort and byte position, how often each byte value occurs; a
        # (256 x 8) table of the bits of each byte value then turns those histograms into
        # per-bit counts. This touches every report byte once, with no unpacked copy.
        base = coh * 256
        columns = np.ascontiguousarray(batch.bits.T)
        hist = np.empty((m.cohorts, m.report_bytes, 256), dtype=np.int64)
        for b in range(m.report_bytes):
            hist[:, b, :] = np.bincount(base + columns[b], minlength=m.cohorts * 256).reshape(m.cohorts, 256)
        counts = (hist @ _BYTE_BITS).reshape(m.cohorts, m.report_bytes * 8)[:, : m.k]
        self.counts += counts
        self.sizes += np.bincount(coh, minlength=m.cohorts)

    def merge(self, other: Self) -> Self:
        """The aggregate of both inputs' reports."""
        if other.mechanism != self.mechanism:
            raise ValueError("cannot merge aggregates of different mechanisms")
        return type(self)(self.mechanism, counts=self.counts + other.counts, sizes=self.sizes + other.sizes)

    def to_plain(self) -> PlainDoc:
        """Plain, msgpack-ready data."""
        return {"counts": array_to_plain(self.counts), "sizes": array_to_plain(self.sizes)}

    @classmethod
    def from_plain(cls, mechanism: Rappor, data: object) -> RapporAggregate:
        """Restore an aggregate saved by :meth:`to_plain`.

        Raises:
            StateError: on malformed data or counts that no set of reports can produce.
        """
        where = "rappor aggregate"
        counts = array_from_plain(
            require(data, "counts", dict, where=where),
            dtype="<i8",
            shape=(mechanism.cohorts, mechanism.k),
            field=f"{where}.counts",
        )
        sizes = array_from_plain(
            require(data, "sizes", dict, where=where), dtype="<i8", shape=(mechanism.cohorts,), field=f"{where}.sizes"
        )
        if (sizes < 0).any() or (counts < 0).any() or (counts > sizes[:, None]).any():
            raise StateError(f"{where}: need 0 <= counts[j, i] <= sizes[j]")
        return cls(mechanism, counts=counts, sizes=sizes)

    def _variances(self, t: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        one, zero = self.mechanism.coordinate_probabilities("report")
        q_star, p_star = float(one), float(zero)
        n_j = self.sizes.astype(np.float64)[:, None]
        # Plug-in of Var[c_ij] = T q*(1-q*) + (N - T) p*(1-p*) (Lemma 1; independent reports).
        t_clip = np.clip(t, 0.0, n_j)
        var_c = t_clip * q_star * (1 - q_star) + (n_j - t_clip) * p_star * (1 - p_star)
        return var_c / float(one - zero) ** 2

    def estimate_bits(self) -> BitEstimates:
        """``t_ij`` (004 §4) with plug-in standard errors, for every cohort and bit.

        With ``f = 1`` the reports carry no signal (``q* = p*``): values are NaN and the
        standard errors infinite.
        """
        one, zero = self.mechanism.coordinate_probabilities("report")
        n_j = self.sizes.astype(np.float64)[:, None]
        shape = self.counts.shape
        if one == zero:
            return BitEstimates(np.full(shape, np.nan), np.full(shape, np.inf), self.sizes.copy(), self.n)
        t = (self.counts - float(zero) * n_j) / float(one - zero)
        return BitEstimates(t, np.sqrt(self._variances(t)), self.sizes.copy(), self.n)

    def estimate_categories(self) -> VectorEstimate:
        """Basic variants: the number of devices in each category, ``Σ_j t_ij``, with its SE.

        Raises:
            ParameterError: for the Bloom-filter variants (decode those against candidates).
        """
        if not self.mechanism.basic:
            raise ParameterError("variant", "basic or basic-one-time for direct decoding", self.mechanism.variant)
        bits = self.estimate_bits()
        values = bits.values.sum(axis=0)
        # Cohorts are independent, so their variances add.
        ses = np.sqrt((bits.standard_errors**2).sum(axis=0))
        return VectorEstimate(values, ses, self.n)

    def estimate(self) -> VectorEstimate:
        """Category counts for the basic variants; the flattened ``t_ij`` vector otherwise.

        For the Bloom-filter variants the entry ``j·k + i`` is ``t_ij``, the ``Y`` that the
        004 §4 decoding regresses on the candidates' :meth:`RapporServer.candidate_bits`.
        """
        if self.mechanism.basic:
            return self.estimate_categories()
        return self.estimate_bits().flat()


class RapporServer(PlainServer[Rappor, RapporBatch, RapporAggregate]):
    """RAPPOR's server half."""

    batch_type: ClassVar[type[RapporBatch]] = RapporBatch
    aggregate_type: ClassVar[type[RapporAggregate]] = RapporAggregate

    # ----- records and wire --------------------------------------------------------------

    def batch(self, records: Sequence[RapporRecord]) -> RapporBatch:
        """Typed records in columnar form."""
        m = self.mechanism
        n = len(records)
        coh = np.fromiter((r.cohort for r in records), dtype=np.int64, count=n)
        raw = b"".join(r.bits for r in records)
        if len(raw) != n * m.report_bytes:
            raise InputError(f"every record carries {m.report_bytes} bytes of bits")
        bits = np.frombuffer(raw, dtype=np.uint8).reshape(n, m.report_bytes).copy()
        return RapporBatch(cohorts=coh, bits=bits)

    def decode_records(self, raw: object) -> RapporBatch:
        """Strictly decode the wire form of :meth:`Rappor.encode_records`.

        Raises:
            MalformedReportError: ``bad-type``, ``bad-length``, ``out-of-range`` or
                ``bad-padding``, naming ``records[i]``, ``records[i].cohort`` or ``records[i].bits``.
        """
        m = self.mechanism
        cohorts, bits = decode_indexed_bits(raw, bound=m.cohorts, width=m.k, index_name="cohort")
        return RapporBatch(cohorts=cohorts, bits=bits)

    # ----- simulation --------------------------------------------------------------------

    @cached_property
    def _category_index(self) -> dict[str, int]:
        return {c: i for i, c in enumerate(self.mechanism.categories)}

    def _category_indices(self, values: Sequence[str | bytes]) -> npt.NDArray[np.int64]:
        index = self._category_index
        try:
            # map() and fromiter keep the per-value work in C; a miss (None) is a TypeError.
            return np.fromiter(map(index.get, values), dtype=np.int64, count=len(values))  # type: ignore[arg-type]
        except TypeError:
            bad = next(v for v in values if not isinstance(v, str) or v not in index)
            raise InputError(f"basic RAPPOR takes one of its {self.mechanism.k} categories; got {bad!r}") from None

    def _bloom_matrix(self, values: Sequence[str | bytes], cohorts: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        m = self.mechanism
        n = len(values)
        out = np.zeros((n, m.k), dtype=np.bool_)
        rows = np.arange(n)
        if m.basic:
            out[rows, self._category_indices(values)] = True
            return out
        # Fingerprint each distinct value once (a fleet reports few distinct values);
        # dict.fromkeys and map keep the per-value work in C.
        try:
            distinct = dict.fromkeys(values)
        except TypeError:
            raise InputError("RAPPOR takes str or bytes values") from None
        for v in distinct:
            if not isinstance(v, str | bytes):
                raise InputError(f"RAPPOR takes str or bytes values; got {type(v).__name__}")
        number = {v: i for i, v in enumerate(distinct)}
        inverse = np.fromiter(map(number.__getitem__, values), dtype=np.int64, count=n)
        fp_distinct = family_fingerprints(m.family, distinct)
        fp = Fingerprints(lo=fp_distinct.lo[inverse], hi=fp_distinct.hi[inverse])
        for i in range(m.h):
            out[rows, evaluate(m.family, fp, cohorts * m.h + i)] = True
        return out

    @cached_property
    def _irr_thresholds(self) -> npt.NDArray[np.uint64]:
        # Entry b is the threshold for B'_i = b. A numerator of 2**64 (q = 1) does not fit
        # in uint64; it is stored as 2**64 - 1 and the missing word is added back in _irr.
        m = self.mechanism
        return np.array([m.irr_zero_coin.numerator, min(m.irr_one_coin.numerator, SCALE - 1)], dtype=np.uint64)

    def _irr(self, bprime: npt.NDArray[np.uint8], rng: RandomSource) -> npt.NDArray[np.bool_]:
        """Step 3: ``S_i = 1`` w.p. ``q`` where ``B'_i = 1`` and w.p. ``p`` elsewhere (``bprime`` is 0/1)."""
        thresholds = self._irr_thresholds[bprime]
        report = rng.words(int(bprime.size)).reshape(bprime.shape) < thresholds
        if self.mechanism.irr_one_coin.numerator == SCALE:
            # q = 1: every set B' bit is reported set, including for the word 2**64 - 1.
            # Only set bits carry the threshold 2**64 - 1 (p < 1 - 2**-53 as a float).
            report |= thresholds == np.uint64(SCALE - 1)
        return report

    def privatize_many(
        self,
        values: Sequence[str | bytes],
        cohorts: npt.ArrayLike,
        rng: RandomSource,
    ) -> RapporBatch:
        """One report from each of ``len(values)`` fresh devices (the simulator's and tests' path).

        Device ``d`` is in cohort ``cohorts[d]`` and reports ``values[d]``; its ``B'`` and
        (unless one-time) its ``S`` are drawn for this call, with the same distribution as
        :meth:`Rappor.privatize` on a fresh state (for one device, the same coins: a test
        compares them).
        """
        m = self.mechanism
        coh = np.asarray(cohorts, dtype=np.int64).reshape(-1)
        n = len(values)
        if coh.size != n:
            raise InputError(f"need one cohort per value; got {coh.size} cohorts for {n} values")
        if n and (int(coh.min()) < 0 or int(coh.max()) >= m.cohorts):
            raise InputError(f"cohorts must lie in [0, {m.cohorts})")
        bits = np.empty((n, m.report_bytes), dtype=np.uint8)
        for start in range(0, n, _CHUNK):
            stop = min(n, start + _CHUNK)
            bloom = self._bloom_matrix(values[start:stop], coh[start:stop])
            bprime = bloom ^ bernoulli(rng, m.prr_coin, bloom.size).reshape(bloom.shape)
            report = bprime if m.one_time else self._irr(bprime.view(np.uint8), rng)
            bits[start:stop] = np.packbits(report, axis=1)
        return RapporBatch(cohorts=coh.copy(), bits=bits)

    # ----- candidates (004 §4's design matrix) -------------------------------------------

    def candidate_positions(self, candidates: Sequence[str | bytes]) -> npt.NDArray[np.int64]:
        """Sparse design matrix of 004 §4: ``(len, cohorts, h)`` Bloom bit numbers per candidate."""
        m = self.mechanism
        if m.basic:
            idx = self._category_indices(candidates)
            return np.broadcast_to(idx[:, None, None], (idx.size, m.cohorts, 1)).copy()
        fp = family_fingerprints(m.family, candidates)
        out = np.empty((len(fp), m.cohorts, m.h), dtype=np.int64)
        for j in range(m.family.count):
            out[:, j // m.h, j % m.h] = evaluate(m.family, fp, j)
        return out

    def candidate_bits(self, candidates: Sequence[str | bytes]) -> npt.NDArray[np.uint8]:
        """Dense design-matrix bits of 004 §4: ``(len, cohorts, k)``, 1 where a candidate sets a bit.

        Reshaped to ``(len, cohorts·k)`` and transposed, it is the ``X`` that the vector of
        :meth:`~protocol.server.estimate.BitEstimates.flat` is regressed on.
        """
        m = self.mechanism
        pos = self.candidate_positions(candidates)
        out = np.zeros((pos.shape[0], m.cohorts, m.k), dtype=np.uint8)
        m_idx = np.arange(pos.shape[0])[:, None, None]
        c_idx = np.arange(m.cohorts)[None, :, None]
        out[m_idx, c_idx, pos] = 1
        return out

    @property
    def bit_probabilities(self) -> tuple[float, float]:
        """``(q*, p*)``: the chance that a reported bit is set where the Bloom bit is, and where
        it is not (004 Lemma 1; ``B'``'s for the one-time variants)."""
        one, zero = self.mechanism.coordinate_probabilities("report")
        return float(one), float(zero)

    # ----- estimates ---------------------------------------------------------------------

    def estimate_bits(self, aggregate: object) -> BitEstimates:
        """``t_ij`` with plug-in standard errors (004 §4), what the candidates are regressed on."""
        return self.own_aggregate(aggregate).estimate_bits()

    def estimate_frequencies(
        self, aggregate: object, candidates: Sequence[str], *, threads: Threads | None = None
    ) -> VectorEstimate:
        """Basic variants: the count of each category (``candidates`` are the categories, in order;
        one pass over the counts: ``threads`` are not needed).

        Raises:
            ParameterError: for the Bloom-filter variants, or candidates other than the categories.
        """
        if tuple(candidates) != self.mechanism.categories:
            raise ParameterError("categories", "the candidates of direct decoding (basic variants)", candidates)
        return self.own_aggregate(aggregate).estimate_categories()

    def plan(self, n: float) -> PlanFigures:
        """004 Appendix: a bit count has ``sd = sqrt(p*(1-p*) N)/(q* - p*)`` under H0; a Bloom-decoded
        count averages the ``h̄ = k(1 - (1 - 1/k)^h)`` distinct bits of a candidate (1 for basic)."""
        m = self.mechanism
        q_star, p_star = self.bit_probabilities
        h_bar = 1.0 if m.basic else m.k * (1 - (1 - 1 / m.k) ** m.h)
        unit_bit = math.sqrt(p_star * (1 - p_star)) / (q_star - p_star)
        return PlanFigures(
            n=n,
            standard_error=unit_bit * math.sqrt(n / h_bar),
            unit="count",
            figures={**m.privacy_figures(), "bit_sd_under_h0": unit_bit * math.sqrt(n), "h_bar": h_bar},
            formulas=(
                "004 Thm 1: eps_inf = 2h ln((1-f/2)/(f/2)); Thm 2: eps_1 = h ln(q*(1-p*)/(p*(1-q*)))",
                "004 Appendix: sd(T_hat) = sqrt(p*(1-p*) N)/(q*-p*); count SE ~ sd/sqrt(h_bar)",
            ),
        )
