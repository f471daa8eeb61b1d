"""The sketches' standard errors on a heavy-headed population, against the exact variance and the spread.

A population of words is heavy-headed: at ``10^6`` reports of the 20,000 most frequent English
words the top word holds 5.9 % of the reports and ``Σ f**2 = 0.0088 n**2``. Two checks that the
standard error CMS and HCMS report (the variance of 003 App. A / App. B with plug-ins) is the
spread of the estimate for the heavy entries as well as for the light ones:

* the exact variance over the coins and the hash family, computed from the collisions of a
  drawn family without any coin (``q_v``, the share of rows where ``v`` collides with the
  queried value), averaged over many families, equals :meth:`CMSServer.variance`;
* seeded simulations with the batch privatizers: the mean of ``z**2`` over the heavy entries
  and over the light ones is 1 within four of its analytic standard errors (``sqrt(2 / N)``
  for ``N`` standard normal ``z``).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pytest

from protocol.cms import CountMeanSketch
from protocol.hcms import HadamardCountMeanSketch
from protocol.randomness import SeededRandom
from protocol.server.cms import CMSServer
from protocol.server.hashing import Fingerprints, evaluate, family_fingerprints
from protocol.server.hcms import HCMSServer


def _zipf_counts(n: int, universe: int) -> npt.NDArray[np.int64]:
    """Zipf(1.0) counts of ``n`` reports: the top value holds ``1 / H(universe)`` of them (12 % for 2,000)."""
    weights = 1.0 / np.arange(1, universe + 1, dtype=np.float64)
    counts: npt.NDArray[np.int64] = np.floor(weights / weights.sum() * n).astype(np.int64)
    counts[0] += n - int(counts.sum())
    return counts


def _seed(tag: str, rep: int) -> bytes:
    return hashlib.blake2b(f"{tag}-{rep}".encode(), digest_size=16).digest()


def _cms_moments_given_family(
    mech: CountMeanSketch, names: list[str], counts: npt.NDArray[np.int64], queried: Sequence[int]
) -> list[tuple[float, float]]:
    """``(Var[f̃(d) | hashes], E[f̃(d) | hashes] - f(d))`` of each queried ``d`` for one drawn family, exactly.

    A report of ``v`` picks row ``j`` uniformly and its cell ``h_j(d)`` is +1 with probability
    ``p`` if ``h_j(v) = h_j(d)`` and ``1 - p`` otherwise; ``c Y - (c - 1)/2`` has mean that
    indicator and variance ``(c**2 - 1)/4`` either way. So a report of ``d`` adds
    ``(c**2 - 1)/4``, a report of ``v != d`` adds ``(c**2 - 1)/4 + q_v (1 - q_v)``, and the mean is
    off by ``(m/(m-1)) Σ_{v != d} f(v) (q_v - 1/m)``.
    """
    k, m = mech.k, mech.m
    fp = family_fingerprints(mech.family, names)
    rows = [evaluate(mech.family, fp, j) for j in range(k)]
    f = counts.astype(np.float64)
    coin = CMSServer(mech).coin_variance
    scale = m / (m - 1)
    out = []
    for d in queried:
        q = sum((h == h[d]).astype(np.float64) for h in rows) / k
        others = np.arange(len(names)) != d
        var = scale**2 * (float(f.sum()) * coin + float((f * q * (1 - q))[others].sum()))
        offset = scale * float((f * (q - 1 / m))[others].sum())
        out.append((var, offset))
    return out


def test_cms_variance_is_the_exact_one_over_coins_and_families() -> None:
    """E over families of (conditional variance + squared offset) equals the reported variance,
    for the top, the second, a middle and a tail value.

    k = 16, m = 8 on a Zipf(1.0) population makes the collision term (Σ f**2 / (k m)) larger
    than the coin term, so a formula that averaged the collisions of heavy values wrongly, or
    that missed the queried value's own count, would show; 3,000 families bound the Monte
    Carlo error. Each family serves the four queried values (their moments given the family
    are computed from the same hashes; each value's check stands alone).
    """
    n, universe, families = 100_000, 2_000, 3_000
    queried = {"top": 0, "second": 1, "middle": 40, "tail": 1999}
    counts = _zipf_counts(n, universe)
    names = [f"w{i}" for i in range(universe)]
    total = np.empty((families, len(queried)))
    for rep in range(families):
        mech = CountMeanSketch(epsilon=4.0, k=16, m=8, seed=_seed("cms-exact", rep))
        moments = _cms_moments_given_family(mech, names, counts, list(queried.values()))
        total[rep] = [var + offset**2 for var, offset in moments]
    f = counts.astype(np.float64)
    server = CMSServer(CountMeanSketch(epsilon=4.0, k=16, m=8, seed=_seed("cms-exact", 0)))
    for column, (label, d) in enumerate(queried.items()):
        stated = float(server.variance(n=n, count=float(f[d]), others_sum_sq=float((f**2).sum() - f[d] ** 2)))
        mean = float(total[:, column].mean())
        assert abs(mean - stated) <= 4 * float(total[:, column].std(ddof=1)) / math.sqrt(families), (
            label,
            mean,
            stated,
        )


def _z_and_se(
    server: CMSServer | HCMSServer,
    *,
    reports: Fingerprints,
    dictionary: list[str],
    truth: npt.NDArray[np.float64],
    rng: SeededRandom,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """``z = (estimate - truth) / SE`` of every dictionary entry, and the SE reported."""
    if isinstance(server, CMSServer):
        cms = server.new_aggregate()
        cms.add(server.privatize_fingerprints(reports, rng))
        est = cms.estimate(dictionary)
    else:
        hcms = server.new_aggregate()
        hcms.add(server.privatize_fingerprints(reports, rng))
        est = hcms.estimate(dictionary)
    z: npt.NDArray[np.float64] = (est.values - truth) / est.standard_errors
    return z, est.standard_errors


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", ["cms", "hcms"])
def test_heavy_and_light_entries_spread_as_their_standard_error(mechanism: str) -> None:
    """Heavy-headed population (Zipf(1.0) over 2,000 values, top value 12 %), 150 hash seeds.

    The coin term dominates, as at the deployed sizes (the collision term Σ f**2 / (k m) is 234
    against a coin term of 9,050 for CMS and 53,750 for HCMS):
    the 20 heaviest entries' mean ``z**2`` and that of 20 light and 10 absent entries are each 1
    within 4 analytic SEs (``4 sqrt(2 / N)``: 0.103 for the 3,000 heavy ``z``): a standard error
    10 % too large for the heavy entries (mean ``z**2`` 0.83) fails. The SE the sketch
    reports (with its plug-ins: the estimate for ``f(d)``, the sketch's ``Σ f**2``) is within
    2 % of the exact one at the true counts (0.7 % at most over 20 seeds of HCMS).
    """
    n, universe, reps = 50_000, 2_000, 150
    counts = _zipf_counts(n, universe)
    names = [f"word-{i}" for i in range(universe)]
    codes = np.repeat(np.arange(universe), counts)
    heavy, light = list(range(20)), list(range(1000, 1020))
    dictionary = [names[i] for i in heavy + light] + [f"absent-{i}" for i in range(10)]
    truth = np.array([counts[i] for i in heavy + light] + [0] * 10, dtype=np.float64)
    f2 = float((counts.astype(np.float64) ** 2).sum())
    rng = SeededRandom(24)
    z = np.empty((reps, len(dictionary)))
    ratio = np.empty((reps, len(dictionary)))
    for rep in range(reps):
        seed = _seed(f"{mechanism}-spread", rep)
        server: CMSServer | HCMSServer = (
            CMSServer(CountMeanSketch(epsilon=4.0, k=4_096, m=64, seed=seed))
            if mechanism == "cms"
            else HCMSServer(HadamardCountMeanSketch(epsilon=4.0, k=256, m=1_024, seed=seed))
        )
        fp = family_fingerprints(server.mechanism.family, names)
        reports = Fingerprints(lo=fp.lo[codes], hi=fp.hi[codes])
        z[rep], se = _z_and_se(server, reports=reports, dictionary=dictionary, truth=truth, rng=rng)
        exact = np.sqrt(server.variance(n=n, count=truth, others_sum_sq=f2 - truth**2))
        ratio[rep] = se / exact
    assert np.all(np.abs(ratio - 1) < 0.02), float(np.abs(ratio - 1).max())
    for group in (slice(0, 20), slice(20, len(dictionary))):
        block = z[:, group]
        tolerance = 4 * math.sqrt(2 / block.size)
        assert abs(float((block**2).mean()) - 1) <= tolerance, (group, float((block**2).mean()))
        assert abs(float(block.mean())) <= 4 / math.sqrt(block.size)
