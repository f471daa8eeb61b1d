"""Fast, exact simulation of RAPPOR aggregates for the decoding tests.

Given the Bloom filters, a report's bits are independent with ``Pr[1] = q*`` where the
filter has a 1 and ``p*`` elsewhere (004 Lemma 1; for the one-time variants the ``B'``
probabilities), so the per-cohort counts are exactly
``c_ij ~ Binomial(T_ij, q*) + Binomial(N_j - T_ij, p*)``. Drawing them directly is the
same distribution as privatizing every report, at a fraction of the cost; the tests that
go through ``privatize_many`` check the two agree.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from protocol.rappor import Rappor
from protocol.server.rappor import RapporAggregate, RapporServer


def simulate_counts(
    mech: Rappor,
    values: Sequence[str],
    counts: npt.ArrayLike,
    gen: np.random.Generator,
) -> RapporAggregate:
    """An aggregate of ``counts[i]`` reports of ``values[i]``, cohorts uniform, one report each."""
    c = np.asarray(counts, dtype=np.int64)
    per_cohort = np.array([gen.multinomial(int(x), np.full(mech.cohorts, 1 / mech.cohorts)) for x in c])
    bits = RapporServer(mech).candidate_bits(list(values)).astype(np.int64)  # (V, cohorts, k)
    t_true = np.einsum("vj,vji->ji", per_cohort, bits)
    sizes = per_cohort.sum(axis=0)
    one, zero = mech.coordinate_probabilities("report")
    ones = gen.binomial(t_true, float(one)) + gen.binomial(sizes[:, None] - t_true, float(zero))
    return RapporAggregate(mech, counts=ones.astype(np.int64), sizes=sizes.astype(np.int64))


def exponential_counts(n: int, present: int, gen: np.random.Generator, *, rate: float = 5.0) -> npt.NDArray[np.int64]:
    """``n`` reports over ``present`` strings with weights ``exp(-rate i / present)`` (004 §5.2's population)."""
    w = np.exp(-rate * np.arange(1, present + 1) / present)
    return gen.multinomial(n, w / w.sum()).astype(np.int64)
