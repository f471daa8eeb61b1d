"""``ldp-collector plan``: the papers' formulas, solved for what the user leaves out."""

from __future__ import annotations

import functools
import json
import math
from typing import Any

import pytest

from collector.decoding.stats import normal_quantile
from collector.planner import PlanError, main, plan, sfp_top_t
from protocol.cms import CountMeanSketch
from protocol.hcms import HadamardCountMeanSketch
from protocol.one_bit_mean import epsilon_prime
from protocol.rappor import Rappor
from protocol.server.cms import CMSServer
from protocol.server.contract import server_of

SEED = b"tests/collector/planner/plan"


def test_rappor_appendix_limit() -> None:
    """004 Appendix: with p = 1/2, f = 0 the detectable strings are (2q - 1) sqrt N / Q (about 10,000 at 10^10)."""
    out = plan(["rappor", "--variant", "basic", "--f", "0", "--q", "0.75", "--n", "1e10", "--candidates", "1e4"])
    q_crit = normal_quantile(1 - 0.05 / 1e4)
    assert out["appendix_max_strings"] == pytest.approx(0.5 * 1e5 / q_crit)
    assert 10_000 < out["appendix_max_strings"] < 12_000
    assert out["epsilon_one"] == pytest.approx(math.log(3))


def test_rappor_epsilons_and_count_se_match_the_mechanism() -> None:
    """ε∞, ε1 equal the mechanism's (004 §5.2 parameters); the count SE is 2,812 at N = 10^6 (Table 1: ~2,800)."""
    out = plan(["rappor", "--cohorts", "16", "--f", "0.5", "--n", "1e6", "--candidates", "200"])
    mech = Rappor(k=128, h=2, cohorts=16, f=0.5, p=0.5, q=0.75, seed=SEED)
    assert out["epsilon_one"] == pytest.approx(mech.epsilon_one, rel=1e-9)
    assert out["epsilon_infinity"] == pytest.approx(mech.epsilon_infinity, rel=1e-9)
    assert out["count_standard_error"] == pytest.approx(2812, abs=1)


def test_rappor_solves_n_for_a_share() -> None:
    """Solving N for a detectable share gives back that share."""
    out = plan(["rappor", "--f", "0.75", "--cohorts", "32", "--target-share", "0.001", "--candidates", "8616"])
    assert out["solved"]["n"] == out["n"]
    assert out["smallest_share_detected"] == pytest.approx(0.001, rel=1e-4)


def test_one_bit_mean_theorem_1_and_perturbation() -> None:
    """000 Thm 1 bound and the SE use ε' of 000 §4; solving n meets the target."""
    out = plan(["one-bit-mean", "--epsilon", "1", "--gamma", "0.2", "--m", "21600", "--target-se", "60"])
    eps_p = epsilon_prime(1.0, 0.2)
    c = (math.exp(eps_p) - 1) / (math.exp(eps_p) + 1)
    n = out["solved"]["n"]
    assert out["epsilon_report"] == pytest.approx(eps_p, rel=1e-9)
    assert out["standard_error_max"] == pytest.approx(21600 / (2 * c * math.sqrt(n)))
    assert out["standard_error_max"] <= 60 < 21600 / (2 * c * math.sqrt(n - 1))
    bound = 21600 / math.sqrt(2 * n) * (1 / c) * math.sqrt(math.log(2 / 0.05))
    assert out["error_bound"] == pytest.approx(bound)


def test_one_bit_mean_solves_epsilon() -> None:
    """Given n and a target, the ε found gives exactly that SE."""
    out = plan(["one-bit-mean", "--m", "86400", "--n", "3e5", "--target-se", "100"])
    c = math.tanh(out["epsilon"] / 2)
    assert 86400 / (2 * c * math.sqrt(3e5)) == pytest.approx(100)


def test_dbitflip_smallest_d() -> None:
    """The solved d is the smallest meeting the target (000 Thm 2 / the exact bucket variance)."""
    out = plan(["dbitflip", "--epsilon", "1", "--k", "32", "--n", "3e5", "--target-se", "0.005"])
    d = out["solved"]["d"]
    assert out["standard_error_uniform_bucket"] <= 0.005
    smaller = plan(["dbitflip", "--epsilon", "1", "--k", "32", "--n", "3e5", "--d", str(d - 1)])
    assert smaller["standard_error_uniform_bucket"] > 0.005
    a = math.exp(0.5)
    bound = math.sqrt(5 * 32 / (3e5 * d)) * (a + 1) / (a - 1) * math.sqrt(math.log(6 * 32 / 0.05))
    assert out["error_bound"] == pytest.approx(bound)


@pytest.mark.parametrize(("kind", "cls"), [("cms", CountMeanSketch), ("hcms", HadamardCountMeanSketch)])
def test_sketch_se_is_the_theorem_bound(kind: str, cls: type) -> None:
    """003 Thm 4.2 / 4.4 with Σf² = F n² equals the mechanism's variance_bound."""
    out = plan([kind, "--epsilon", "4", "--n", "1e8", "--k", "65536", "--m", "1024", "--top-share", "0.05"])
    server: Any = server_of(cls(epsilon=4.0, k=65536, m=1024, seed=SEED))
    bound = server.variance_bound(n=1e8, sum_sq=0.05 * 1e16)
    assert out["standard_error"] == pytest.approx(math.sqrt(bound), rel=1e-6)
    bits = 16 + 1024 if kind == "cms" else 16 + 10 + 1
    assert out["bandwidth_bits"] == pytest.approx(bits)


def test_sketch_search_under_a_bandwidth() -> None:
    """With a bandwidth budget every option fits it and the choice is within 1% of the best SE."""
    out = plan(["hcms", "--epsilon", "4", "--n", "1e8", "--bandwidth", "26", "--dictionary-size", "250000"])
    assert all(r["bandwidth_bits"] <= 26 for r in out["options"])
    best = min(r["standard_error"] for r in out["options"])
    assert out["standard_error"] <= 1.01 * best


def test_sketch_search_for_a_target() -> None:
    """With a target SE the least-bandwidth option that meets it is chosen."""
    out = plan(["cms", "--epsilon", "4", "--n", "1e8", "--target-se", "6000", "--top-share", "0.01"])
    assert out["standard_error"] <= 6000
    assert out["bandwidth_bits"] == min(r["bandwidth_bits"] for r in out["options"])


def test_sfp_sums_the_epsilons() -> None:
    """SFP costs ε + ε' per report (003 Thm 4.5); the word SE is the CMS bound over n."""
    out = plan(["sfp", "--n", "1e6"])
    assert out["epsilon_report"] == 8.0
    mech = CMSServer(CountMeanSketch(epsilon=2.0, k=2048, m=1024, seed=SEED))
    assert out["word_standard_error"] == pytest.approx(math.sqrt(mech.variance_bound(n=1e6, sum_sq=0.1 * 1e12)))


deployed_top_t = functools.partial(
    sfp_top_t,
    epsilon=2.0,
    epsilon_fragment=6.0,
    k=2048,
    m=1024,
    k_fragment=2048,
    m_fragment=1024,
    length=10,
    fragment_length=2,
    alphabet_size=28,
)
"""003 §6.1's New Words parameters, the default alphabet (a-z, apostrophe, space)."""


def test_sfp_top_t_covers_the_releasable_words_within_the_cost() -> None:
    """T keeps twice the words that can reach the smallest releasable count, capped at half the assembly budget."""
    out = plan(["sfp", "--n", "1e6", "--release-threshold", "1000"])
    t = deployed_top_t(n=10**6, release_threshold=1000.0)
    assert out["top_t"] == t == math.ceil(2e6 / max(1000.0, out["smallest_word_found"]))
    # A higher threshold leaves fewer words that can be released, so fewer pieces are needed.
    assert deployed_top_t(n=10**6, release_threshold=20_000.0) == math.ceil(2e6 / 20_000)
    # With a small budget T is capped where 256 E[Poisson(T/256)^5] reaches half of it.
    capped = deployed_top_t(n=10**6, release_threshold=1000.0, max_words=20_000)
    assert capped < t

    def assembled(top_t: int) -> float:
        lam = top_t / 256  # E[X^5] of a Poisson (Touchard polynomial, Stirling numbers S(5, j))
        return 256 * (lam**5 + 10 * lam**4 + 25 * lam**3 + 15 * lam**2 + lam)

    assert assembled(capped) <= 10_000 < assembled(capped + 1)
    assert deployed_top_t(n=0) == 1


def test_unreachable_target_is_a_plan_error() -> None:
    """A target below what the mechanism can give is refused with a reason."""
    with pytest.raises(PlanError, match="target"):
        plan(["cms", "--epsilon", "4", "--n", "1e8", "--target-se", "100"])


def test_main_text_json_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    """main() prints text or JSON and returns 0; usage errors and unreachable targets return 2."""
    assert main(["rr", "--epsilon", "1", "--n", "10000"]) == 0
    assert "standard error" in capsys.readouterr().out
    assert main(["rappor", "--n", "1e6", "--f", "0", "--variant", "one-time", "--json"]) == 2
    assert "no privacy" in capsys.readouterr().err
    assert main(["rappor", "--n", "1e6", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["mechanism"] == "rappor"
    assert main(["nonsense"]) == 2
    assert main(["--help"]) == 0
    assert "papers' formulas" in capsys.readouterr().out
