"""Dictionary queries (003 Alg. 4) with a release threshold and tests; SFP word discovery (003 Alg. 10)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from collector.decoding import sketches
from collector.decoding.sketches import discover_words, query_dictionary
from protocol.cms import CountMeanSketch
from protocol.hcms import HadamardCountMeanSketch
from protocol.randomness import SeededRandom
from protocol.server.cms import CMSAggregate, CMSServer
from protocol.server.hcms import HCMSAggregate, HCMSServer
from protocol.server.sfp import SFPServer
from protocol.sfp import SequenceFragmentPuzzle

SEED = b"tests/collector/decoding/sketches"
DICTIONARY = [f"site-{i}.example" for i in range(400)]


def _zipf_values(n: int, present: int, gen: np.random.Generator) -> tuple[list[str], np.ndarray]:
    w = 1.0 / np.arange(1, present + 1) ** 1.2
    counts = gen.multinomial(n, w / w.sum())
    values = [DICTIONARY[i] for i in np.repeat(np.arange(present), counts)]
    truth = np.zeros(len(DICTIONARY))
    truth[:present] = counts
    return values, truth


@pytest.fixture(scope="module")
def cms_case() -> tuple[CMSAggregate, np.ndarray]:
    """60,000 reports over 100 Zipf(1.2) entries of a 400-entry dictionary (CMS, ε = 4)."""
    mech = CMSServer(CountMeanSketch(epsilon=4.0, k=256, m=256, seed=SEED))
    values, truth = _zipf_values(60_000, 100, np.random.default_rng(1))
    agg = mech.new_aggregate()
    agg.add(mech.privatize_many(values, SeededRandom(1)))
    return agg, truth


@pytest.fixture(scope="module")
def hcms_case() -> tuple[HCMSAggregate, np.ndarray]:
    """The same population through HCMS (ε = 4)."""
    mech = HCMSServer(HadamardCountMeanSketch(epsilon=4.0, k=256, m=256, seed=SEED))
    values, truth = _zipf_values(60_000, 100, np.random.default_rng(2))
    agg = mech.new_aggregate()
    agg.add(mech.privatize_many(values, SeededRandom(2)))
    return agg, truth


def test_query_matches_the_aggregate_estimate(
    cms_case: tuple[CMSAggregate, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocked queries give the aggregate's own estimates and standard errors, entry by entry."""
    agg, _ = cms_case
    monkeypatch.setattr(sketches, "_BLOCK", 97)
    out = query_dictionary(agg, DICTIONARY)
    est = agg.estimate(DICTIONARY)
    assert out.tested == len(DICTIONARY)
    assert out.released == len(DICTIONARY)
    by_value = {e.value: e for e in out.entries}
    for i, value in enumerate(DICTIONARY):
        assert by_value[value].count == pytest.approx(est.values[i], rel=1e-12, abs=1e-9)
        assert by_value[value].standard_error == pytest.approx(est.standard_errors[i], rel=1e-12)


@pytest.mark.parametrize("case", ["cms_case", "hcms_case"])
def test_release_rule_threshold_and_bonferroni(case: str, request: pytest.FixtureRequest) -> None:
    """Released entries pass both rules, the rest are only counted; heavy entries are released, absent ones not."""
    agg, truth = request.getfixturevalue(case)
    out = query_dictionary(agg, DICTIONARY, threshold=300.0, alpha=0.05, control="bonferroni")
    assert out.released + out.withheld == len(DICTIONARY)
    assert all(e.count >= 300 and e.p_value <= 0.05 / len(DICTIONARY) for e in out.entries)
    released = {e.value for e in out.entries}
    se = float(np.median([e.standard_error for e in out.entries]))
    heavy = [DICTIONARY[i] for i in np.flatnonzero(truth > max(300.0, 5.5 * se) + 5 * se)]
    assert heavy
    assert set(heavy) <= released
    absent = {DICTIONARY[i] for i in np.flatnonzero(truth == 0)}
    assert not released & absent
    counts = [e.count for e in out.entries]
    assert counts == sorted(counts, reverse=True)


@pytest.mark.parametrize("case", ["cms_case", "hcms_case"])
def test_errors_are_honest(case: str, request: pytest.FixtureRequest) -> None:
    """Over the dictionary, (estimate - truth) / SE has SD 1 within 5 SE (003 Thm 4.2 / 4.4 variance)."""
    agg, truth = request.getfixturevalue(case)
    out = query_dictionary(agg, DICTIONARY)
    by_value = {e.value: e for e in out.entries}
    z = np.array([(by_value[v].count - truth[i]) / by_value[v].standard_error for i, v in enumerate(DICTIONARY)])
    assert abs(z.mean()) < 5 / math.sqrt(z.size)
    assert abs(z.std(ddof=1) - 1) < 5 / math.sqrt(2 * z.size)


def test_top_n_and_interval(cms_case: tuple[CMSAggregate, np.ndarray]) -> None:
    """top_n keeps the largest released entries; intervals are count ± 1.96 SE at 95%."""
    agg, truth = cms_case
    out = query_dictionary(agg, DICTIONARY, alpha=0.05, control="bh", top_n=5)
    assert len(out.entries) == 5
    assert out.released >= 5
    assert out.entries[0].value == DICTIONARY[int(np.argmax(truth))]
    e = out.entries[0]
    assert e.high - e.count == pytest.approx(1.959963984540054 * e.standard_error)
    assert out.control == "bh"


def test_bad_rules_are_refused(cms_case: tuple[CMSAggregate, np.ndarray]) -> None:
    """alpha, control and top_n are checked."""
    agg, _ = cms_case
    with pytest.raises(ValueError, match="alpha"):
        query_dictionary(agg, DICTIONARY, alpha=2.0)
    with pytest.raises(ValueError, match="control"):
        query_dictionary(agg, DICTIONARY, alpha=0.05, control="none")
    with pytest.raises(ValueError, match="top_n"):
        query_dictionary(agg, DICTIONARY, top_n=-1)


def test_sfp_discovers_frequent_words_with_errors() -> None:
    """SFP: the frequent words are released with SEs, nothing that was never typed is."""
    mech = SequenceFragmentPuzzle(
        epsilon=4.0, epsilon_fragment=6.0, k=64, m=256, k_fragment=64, m_fragment=256, seed=SEED, length=6
    )
    words = ["abc", "bca", "cab", "aabbcc", "cc", "ba"]
    counts = [20_000, 12_000, 8_000, 5_000, 300, 100]
    values = [w for w, c in zip(words, counts, strict=True) for _ in range(c)]
    np.random.default_rng(3).shuffle(values)
    server = SFPServer(mech)
    agg = server.new_aggregate()
    agg.add(server.privatize_many(values, SeededRandom(3)))
    out = discover_words(agg, alphabet="abc ", top_t=40, threshold=1000.0, alpha=0.05)
    found = {e.value: e for e in out.entries}
    assert set(found) == {"abc", "bca", "cab", "aabbcc"}
    assert out.tested >= len(found)
    for w, c in zip(words[:4], counts[:4], strict=True):
        assert abs(found[w].count - c) < 5 * found[w].standard_error
