"""Estimates: release rules, consistency projection, RAPPOR decoding accuracy and false discoveries."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from collector.decoding.rappor import RapporDecoder
from collector.estimation import estimate_aggregate, project_simplex, z_value
from collector.numbers import format_number
from collector.rendering import format_estimate
from collector.store import KeyInfo
from protocol.cms import CountMeanSketch
from protocol.randomness import SeededRandom
from protocol.rappor import Rappor
from protocol.registry import Registry, parse_registry
from protocol.server.cms import CMSServer
from protocol.server.contract import Aggregate
from protocol.server.rappor import RapporServer
from tests.collector.support import EMOJI, plain, privatized_reports


@given(st.lists(st.floats(min_value=-5, max_value=5, allow_nan=False), min_size=1, max_size=40))
def test_the_consistent_histogram_is_a_distribution_and_the_nearest_one(values: list[float]) -> None:
    """The projection is non-negative, sums to 1, and leaves a distribution unchanged."""
    p = project_simplex(np.array(values))
    assert (p >= 0).all()
    assert math.isclose(float(p.sum()), 1.0, rel_tol=1e-9)
    assert np.allclose(project_simplex(p), p, atol=1e-12)


def test_z_value_is_the_normal_quantile() -> None:
    """95% gives 1.96 and 99% gives 2.576."""
    assert z_value(0.95) == pytest.approx(1.959964, abs=1e-6)
    assert z_value(0.99) == pytest.approx(2.575829, abs=1e-6)


def _fold(registry: Registry, name: str, count: int, seed: int) -> tuple[Aggregate, KeyInfo]:
    uc = registry.use_cases[name]
    agg = uc.server.new_aggregate()
    reports = privatized_reports(registry, name, count, period=100, seed=seed)
    for r in reports:
        uc.server.fold(agg, uc.server.decode_records(list(r.records)))
    return agg, KeyInfo(name, 100, count, count)


def plain_estimate(*args: Any, **kwargs: Any) -> Any:
    """:func:`estimate_aggregate`'s result as the API's JSON (what a reader sees)."""
    return plain(estimate_aggregate(*args, **kwargs))


def test_nothing_is_released_below_min_reports(registry: Registry) -> None:
    """A period with fewer than min_reports reports gives no numbers at all, only the reason."""
    agg, info = _fold(registry, "usage", 19, seed=1)
    result = plain_estimate(registry.use_cases["usage"], agg, info)
    assert not result["released"]
    assert result["estimate"] is None
    assert "at least 20" in result["withheld_reason"]


def test_frequencies_below_the_release_threshold_are_withheld(registry: Registry, registry_path: Path) -> None:
    """Dictionary entries whose estimated count is below the threshold T are not shown (003 §3.2.2)."""
    agg, info = _fold(registry, "emoji", 600, seed=2)
    result = plain_estimate(registry.use_cases["emoji"], agg, info, registry_dir=registry_path.parent)
    est = result["estimate"]
    assert result["released"]
    assert est["tested"] == len(EMOJI)
    assert all(item["count"] >= 5 for item in est["items"])
    assert len(est["items"]) + est["withheld"] == len(EMOJI)
    top = est["items"][0]
    assert top["value"] == "heart"
    assert top["ci"][0] < top["count"] < top["ci"][1]


def test_histogram_estimate_has_intervals_and_a_consistent_version(registry: Registry) -> None:
    """Each bucket has value, SE, CI and a consistent share; the consistent shares sum to 1."""
    agg, info = _fold(registry, "hist", 500, seed=3)
    est = plain_estimate(registry.use_cases["hist"], agg, info)["estimate"]
    assert len(est["buckets"]) == 8
    assert math.isclose(sum(b["consistent"] for b in est["buckets"]), 1.0, rel_tol=1e-9)
    for b in est["buckets"]:
        assert b["standard_error"] > 0
        assert b["ci"][0] < b["value"] < b["ci"][1]
    assert [b["low"] for b in est["buckets"]] == [12.5 * i for i in range(8)]


def test_rappor_decoding_finds_the_true_strings_within_5_se_and_no_decoys() -> None:
    """004 §4 decoding: the three real values are found with counts within 5 SE; none of 60 decoys is."""
    mech = Rappor(k=128, h=2, cohorts=16, f=0.25, p=0.25, q=0.75, seed=b"rappor-decoding-test-seed")
    truth = {"alpha.example": 12_000, "beta.example": 6_000, "gamma.example": 2_000}
    values = [v for v, c in truth.items() for _ in range(c)]
    gen = np.random.default_rng(6)
    cohorts = gen.integers(0, mech.cohorts, size=len(values))
    server = RapporServer(mech)
    agg = server.new_aggregate()
    agg.add(server.privatize_many(values, cohorts, SeededRandom(7)))
    decoys = [f"decoy{i}.example" for i in range(60)]
    candidates = list(truth) + decoys
    result = RapporDecoder().decode(agg, candidates)
    found = {d.value: d for d in result.found()}
    assert set(found) == set(truth)
    for value, count in truth.items():
        d = found[value]
        assert abs(d.count - count) < 5 * d.standard_error, (value, d)
        assert d.p_value < 0.05 / len(candidates)
    bh = RapporDecoder(control="bh").decode(agg, candidates)
    assert {d.value for d in bh.found()} == set(truth)


def test_plan_verb_is_reachable_from_the_collector_cli(capsys: pytest.CaptureFixture[str]) -> None:
    """`ldp-collector plan` runs the planner without a config and prints the expected SE."""
    from collector.cli import main  # noqa: PLC0415

    assert main(["plan", "cms", "--epsilon", "4", "--n", "1000000", "--k", "65536", "--m", "1024", "--json"]) == 0
    assert "standard_error" in capsys.readouterr().out


def test_rappor_estimate_uses_the_use_cases_correction(registry: Registry, registry_path: Path) -> None:
    """The registry's correction and alpha reach the decoder and are reported with the estimate."""
    uc = registry.use_cases["home"]
    agg, info = _fold(registry, "home", 400, seed=4)
    default = plain_estimate(uc, agg, info, registry_dir=registry_path.parent)["estimate"]
    assert (default["correction"], default["alpha"]) == ("bh", 0.05)
    pfer = replace(uc, collector=replace(uc.collector, correction="pfer", alpha=2.0))
    typed = estimate_aggregate(pfer, agg, info, registry_dir=registry_path.parent)
    result = plain(typed)
    chosen = result["estimate"]
    assert (chosen["correction"], chosen["alpha"]) == ("pfer", 2.0)
    assert f"({chosen['tested']} entries tested; pfer: at most 2 false releases expected)" in format_estimate(typed)
    # pfer at 2 rejects at least what Bonferroni at 0.05 does (same p-values, a higher threshold).
    assert {d["value"] for d in default["items"]} <= {d["value"] for d in chosen["items"]}


def test_rappor_estimate_says_how_much_of_the_reports_its_fit_leaves_unexplained(tmp_path: Path) -> None:
    """Through the one estimate path, a RAPPOR estimate carries the fit's figures: the share of the
    reports its fitted candidates leave unexplained (here the 40 % that belong to strings outside
    the list, within 5 SE), the dispersion and what the SEs are; the CLI prints the same figures."""
    (tmp_path / "candidates.txt").write_text(
        "\n".join(["a.example", "b.example", "c.example", *(f"decoy{i}" for i in range(40))]) + "\n"
    )
    uc = parse_registry(
        b"""
format = 1
[use_cases.home]
mechanism = "rappor"
epsilon = 4
period = "1d"
daily_limit = 1
lifetime_epsilon = 400
seed = "726170706f722d756e6578706c61696e"
parameters = { k = 128, h = 2, cohorts = 16, f = 0.25, p = 0.25, q = 0.75 }
[use_cases.home.collector]
min_reports = 100
dictionary = "candidates.txt"
""",
        source="test",
    ).use_cases["home"]
    counts = {"a.example": 30_000, "b.example": 20_000, "c.example": 10_000}
    counts |= {f"outside{i}.example": 4_000 for i in range(10)}
    values = [v for v, c in counts.items() for _ in range(c)]
    server: Any = uc.server
    agg = server.new_aggregate()
    gen = np.random.default_rng(21)
    agg.add(server.privatize_many(values, gen.integers(0, 16, size=len(values)), SeededRandom(21)))
    typed = estimate_aggregate(uc, agg, KeyInfo("home", 0, len(values), len(values)), registry_dir=tmp_path)
    fit = plain(typed)["estimate"]["fit"]
    assert fit["fitted"] >= 3
    share, se = fit["unexplained_share"], fit["unexplained_share_standard_error"]
    assert abs(share - 0.4) < 5 * se, fit
    assert fit["dispersion"] >= 1
    assert "residuals" in fit["standard_errors"]
    assert f"unexplained: {format_number(100 * share, 2)} % ± {format_number(100 * se, 2)} % of the reports" in (
        format_estimate(typed)
    )


def test_estimate_aggregate_releases_cms_entries_by_the_tested_rule(tmp_path: Path) -> None:
    """Through estimate_aggregate a real CMS keeps false releases within 5 %; the count threshold alone does not.

    2,000 strings, Zipf(1.1), 2 x 10^5 reports, T = 500 (2.5 SE): the count threshold alone
    releases many entries far below T; the default rule's false share stays within the
    binomial SE of 5 %. Every entry is listed (released or withheld), each with its SE.
    """
    strings = [f"s{i}.example" for i in range(2_000)]
    (tmp_path / "dict.txt").write_text("\n".join(strings) + "\n", encoding="utf-8")
    gen = np.random.default_rng(11)
    weights = np.arange(1, len(strings) + 1, dtype=np.float64) ** -1.1
    counts = gen.multinomial(200_000, weights / weights.sum())
    order = np.repeat(np.arange(len(strings)), counts)
    gen.shuffle(order)
    mech = CountMeanSketch(epsilon=4.0, k=256, m=1024, seed=b"release-rule-cms-test-seed")
    server = CMSServer(mech)
    agg = server.new_aggregate()
    agg.add(server.privatize_many([strings[i] for i in order.tolist()], SeededRandom(11)))
    uc = parse_registry(
        b"""
format = 1
[use_cases.tags]
mechanism = "cms"
epsilon = 4
period = "1d"
daily_limit = 1
lifetime_epsilon = 100
seed = "72656c656173652d72756c652d636d732d746573742d73656564"
parameters = { k = 256, m = 1024 }
[use_cases.tags.collector]
min_reports = 1000
release_threshold = 500
dictionary = "dict.txt"
""",
        source="test",
    ).use_cases["tags"]
    assert uc.mechanism == mech
    est = plain_estimate(uc, agg, KeyInfo("tags", 0, 200_000, 200_000), registry_dir=tmp_path, withheld=True)[
        "estimate"
    ]
    truth = dict(zip(strings, counts.tolist(), strict=True))
    released = [i["value"] for i in est["items"]]
    assert len(released) + len(est["withheld_items"]) == len(strings)
    assert len(released) >= 10
    false = sum(1 for v in released if truth[v] < 500)
    assert false / len(released) <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / len(released))
    everything = est["items"] + est["withheld_items"]
    naive = [i["value"] for i in everything if i["count"] >= 500]
    assert sum(1 for v in naive if truth[v] < 500) / len(naive) > 0.2


def test_sfp_release_keeps_apostrophes_and_survives_a_too_large_t(registry: Registry) -> None:
    """The default alphabet finds "it's" and "don't"; a T that would assemble too many words is halved, not fatal."""
    uc = registry.use_cases["words"]
    mech: Any = uc.server
    truth = {"it's": 3_000, "don't": 2_000, "yeet": 1_500}
    values = [w for w, c in truth.items() for _ in range(c)]
    np.random.default_rng(8).shuffle(values)
    agg = mech.new_aggregate()
    agg.add(mech.privatize_many(values, SeededRandom(8)))
    info = KeyInfo("words", 0, len(values), len(values))
    est = plain_estimate(uc, agg, info, withheld=True)["estimate"]
    assert est["alphabet"] == "abcdefghijklmnopqrstuvwxyz' "
    assert {i["value"] for i in est["items"]} == set(truth)
    assert all(" " not in i["value"] for i in est["items"])
    # Every one of the 256 x 10^2 pairs per position kept would assemble about 256 x 100^3
    # words, far beyond the 2 x 10^6 the puzzle scores: T is halved until it fits.
    crowded = replace(uc, collector=replace(uc.collector, top_t=1 << 20))
    small = plain_estimate(crowded, agg, info, sfp_alphabet="dinostey' ")["estimate"]
    assert small["top_t"] < 25_600
    assert set(truth) <= {i["value"] for i in small["items"]}
