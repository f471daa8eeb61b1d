"""The benchmarks of issue 33 run small: RAPPOR against guessed candidate lists and the sketches on
real words (bench_populations), and the sketches' SE with the hash family fixed (bench_sketch_family)."""

from __future__ import annotations

import math

import pytest

from benchmarks import bench_populations, bench_sketch_family
from tests.benchmarks.support import covers, report, require_keys, run_main


@covers("bench_populations")
def test_populations(capsys: pytest.CaptureFixture[str]) -> None:
    """Small sketches, 10^5 reports, 500 strings: every setting's document is complete (RAPPOR's
    comparison with the model's variance too), nothing false is released, and the unexplained
    share the RAPPOR estimate shows is larger with the list that holds half the reports than with
    the one that holds 95 % of them."""
    argv = [
        "--small",
        "--reports",
        "100000",
        "--strings",
        "500",
        "--decoys",
        "100",
        "--population",
        "zipf",
        "--population",
        "en",
        "--min-released",
        "5",
        "--sketch-min-released",
        "20",
        "--max-seeds",
        "3",
        "--model-only",
    ]
    doc = run_main(bench_populations.main, argv, capsys)
    settings = doc["settings"]
    keys = [(s["population"], s["mechanism"], s.get("candidate_coverage")) for s in settings]
    compared = bench_populations.MODEL_ONLY
    assert keys == [
        ("en", "cms", None),
        ("en", "hcms", None),
        *(("en", mechanism, c) for mechanism in ("rappor", compared) for c in (0.5, 0.8, 0.95)),
        *(("zipf", mechanism, c) for mechanism in ("rappor", compared) for c in (0.5, 0.8, 0.95)),
    ]
    for s in settings:
        require_keys(s, ("seeds", "released", "coverage", "coverage_se", "precision", "ok"), where=str(s["mechanism"]))
        assert s["false_released"] == 0, s
    rappor = {(s["population"], s["candidate_coverage"]): s for s in settings if s["mechanism"] == "rappor"}
    # The comparison (the model's variance times the dispersion) runs on the same seeds.
    assert {s["seeds"] for s in settings if s["mechanism"] == compared} == {3}
    for population in ("zipf", "en"):
        half, most = rappor[(population, 0.5)], rappor[(population, 0.95)]
        require_keys(half, ("unexplained_share", "outside_share", "decoys_released"), where=population)
        assert half["outside_share"] > most["outside_share"]
        assert half["unexplained_share"] > most["unexplained_share"], (half, most)
    assert doc["parameters"]["guess"] == "random order"
    report("bench_populations", {"wall_s": doc["wall_s"]})


@covers("bench_sketch_family")
@pytest.mark.parametrize("mechanism", ["cms", "hcms"])
def test_sketch_family(mechanism: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Small sketches, 20 runs of 10^5 reports with one hash family: the spread over the coins is the
    SE shown for the heavy and the light entries (within 5 of its Monte Carlo SEs), and the
    family's exact offsets are computed for every entry."""
    argv = ["--small", "--mechanism", mechanism, "--population", "en", "--reports", "100000"]
    argv += ["--strings", "2000", "--runs", "20", "--heavy", "20", "--light", "200"]
    doc = run_main(bench_sketch_family.main, argv, capsys)
    for name, group in doc["groups"].items():
        require_keys(group, ("coin_sd_over_se", "exact_offset_over_se_rms", "plain_coverage"), where=name)
        assert abs(group["coin_sd_over_se"] - 1) < 5 * group["coin_sd_over_se_se"], (name, group)
        assert math.isfinite(group["exact_offset_over_se_max"])
    report(f"bench_sketch_family {mechanism}", {"wall_s": doc["wall_s"]})
