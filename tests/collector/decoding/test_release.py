"""The release rule of every frequency output: threshold, one-sided test against it, correction."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest

from collector.decoding.release import DEFAULT_ALPHA, DEFAULT_CONTROL, ReleaseRule, release
from collector.decoding.sketches import PADDING, discover_words, producible
from protocol.randomness import SeededRandom
from protocol.registry import CollectorSettings
from protocol.server.sfp import SFPServer
from protocol.sfp import SequenceFragmentPuzzle

SEED = bytes(range(16))
ENTRIES = 20_000
THRESHOLD = 1_000.0
REPLICATES = 10


def _population(n: int) -> npt.NDArray[np.float64]:
    """Zipf(1.1) expected counts of ``n`` reports over 20,000 entries (the shape of bench_release)."""
    weights = np.arange(1, ENTRIES + 1, dtype=np.float64) ** -1.1
    counts: npt.NDArray[np.float64] = n * weights / weights.sum()
    return counts


def _false_share(n: int, *, rule: ReleaseRule, seed: int) -> tuple[int, int]:
    """Released entries and false ones (true count below the threshold) over REPLICATES draws.

    Estimates are the true count plus normal noise with a CMS-like standard error
    ``0.43 sqrt(n)`` (003 Thm 4.2 at the deployed emoji parameters, ε = 4).
    """
    gen = np.random.default_rng(seed)
    truth = _population(n)
    se = np.full(ENTRIES, 0.43 * math.sqrt(n))
    values = [str(i) for i in range(ENTRIES)]
    released = false = 0
    for _ in range(REPLICATES):
        counts = truth + gen.normal(0.0, se)
        out = release(values, counts, se, n=n, rule=rule)
        released += out.released_count
        false += int((out.released & (truth < THRESHOLD)).sum())
    return released, false


@pytest.mark.parametrize(("n", "seed"), [(10**6, 1), (10**8, 2)])
def test_default_rule_keeps_false_releases_at_5_percent_at_any_n(n: int, seed: int) -> None:
    """Under the default (BH 0.05 against T) the share of released entries below T stays <= 5 %, at n = 1e6 and 1e8."""
    rule = ReleaseRule(threshold=THRESHOLD, min_reports=1)
    assert (rule.control, rule.alpha) == (DEFAULT_CONTROL, DEFAULT_ALPHA) == ("bh", 0.05)
    released, false = _false_share(n, rule=rule, seed=seed)
    assert released > 100
    share = false / released
    # The bound is on the expected share; the pooled share of `released` releases has at
    # most the binomial SE of a 5 % share around it.
    assert share <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / released), (share, released)


def test_count_threshold_alone_breaks_the_bound_as_n_grows() -> None:
    """The rule the test replaced (count >= T only) releases mostly false entries at n = 1e8: the test is needed."""
    rule = ReleaseRule(threshold=THRESHOLD, alpha=None)
    released, false = _false_share(10**8, rule=rule, seed=3)
    assert false / released > 0.5


def test_the_test_is_against_the_threshold_not_zero() -> None:
    """An entry clearly present but not clearly above T is withheld; z and p are against T."""
    out = release(
        ["a", "b", "c"], [1500.0, 5000.0, 900.0], [400.0, 400.0, 10.0], n=10**6, rule=ReleaseRule(threshold=1000.0)
    )
    assert out.released.tolist() == [False, True, False]
    assert out.z.tolist() == pytest.approx([1.25, 10.0, -10.0])
    assert "not significant" in str(out.reasons[0])
    assert out.reasons[2] == "estimate below the release threshold 1000"
    assert out.reasons[1] is None


def test_min_reports_withholds_everything_with_the_reason() -> None:
    """Below min_reports no entry is released, whatever its estimate."""
    out = release(["a"], [1e9], [1.0], n=99, rule=ReleaseRule(min_reports=100))
    assert not out.released.any()
    assert out.reasons[0] == "99 reports; at least 100 are needed before release"


def test_ineligible_entries_are_withheld_and_not_counted_in_the_correction() -> None:
    """An entry marked ineligible is never released and does not enter the correction's count."""
    rule = ReleaseRule(control="bonferroni", alpha=0.05)
    out = release(
        ["ok", "junk"], [1e6, 1e6], [1.0, 1.0], n=10**6, rule=rule, eligible=[True, False], ineligible_reason="x"
    )
    assert out.released.tolist() == [True, False]
    assert out.tested == 1
    assert out.reasons[1] == "x"


def test_rule_follows_the_registry_defaults() -> None:
    """The registry's default correction is the rule's default: BH at 0.05."""
    settings = CollectorSettings(min_reports=0)
    assert (settings.correction, settings.alpha) == (DEFAULT_CONTROL, DEFAULT_ALPHA)


def test_bad_rules_are_refused() -> None:
    """Level, correction, min_reports and threshold are checked when the rule is made."""
    with pytest.raises(ValueError, match="alpha"):
        ReleaseRule(alpha=1.5)
    with pytest.raises(ValueError, match="control"):
        ReleaseRule(control="holm")
    with pytest.raises(ValueError, match="min_reports"):
        ReleaseRule(min_reports=-1)
    with pytest.raises(ValueError, match="threshold"):
        ReleaseRule(threshold=math.nan)


@pytest.mark.parametrize(
    ("word", "ok"),
    [("bae", True), ("it's", True), ("", False), ("  cdvlhe m", False), (" abc", False), ("ab c", False)],
)
def test_only_words_with_trailing_padding_are_producible(word: str, ok: bool) -> None:
    """A device pads on the right only: padding inside or before a word marks a puzzle artefact."""
    assert producible(word) is ok


def test_sfp_never_releases_a_word_with_padding_inside() -> None:
    """With a large T the puzzle assembles strings with padding inside; none is released, each says why."""
    mech = SequenceFragmentPuzzle(
        epsilon=4.0, epsilon_fragment=6.0, k=64, m=256, k_fragment=64, m_fragment=256, seed=SEED, length=6
    )
    words = ["abc", "bca", "cab", "aabbcc", "cc", "ba", "a"]
    counts = [20_000, 12_000, 8_000, 5_000, 3_000, 3_000, 3_000]
    values = [w for w, c in zip(words, counts, strict=True) for _ in range(c)]
    np.random.default_rng(5).shuffle(values)
    server = SFPServer(mech)
    agg = server.new_aggregate()
    agg.add(server.privatize_many(values, SeededRandom(5)))
    # threshold -inf and pfer at a large level: only the padding rule can withhold a word.
    out = discover_words(agg, alphabet="abc ", top_t=2000, alpha=50.0, control="pfer", threshold=-math.inf)
    detail = out.detail
    junk = [i for i, w in enumerate(detail.values) if not producible(str(w))]
    assert junk, "the puzzle assembled no string with padding inside; raise top_t"
    assert not detail.released[junk].any()
    assert all("padding inside" in str(detail.reasons[i]) for i in junk)
    assert all(PADDING not in str(e.value) for e in out.entries)
    assert out.tested == len(detail.values) - len(junk)
    assert {"abc", "bca", "cab", "aabbcc"} <= {e.value for e in out.entries}
    # Under the default rule and a threshold, what is released is what was typed.
    default = discover_words(agg, alphabet="abc ", top_t=2000, alpha=0.05, control="bh", threshold=1000.0)
    assert {e.value for e in default.entries} == set(words)
