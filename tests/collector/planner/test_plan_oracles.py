"""``ldp-collector plan oracles`` and ``plan compare``: every frequency oracle side by side, and the advice."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from collector.planner import PlanError, main, plan

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "deploy" / "usecases.example.toml"


def _row(out: dict[str, object], mechanism: str) -> dict[str, float]:
    rows = out["table"]
    assert isinstance(rows, list)
    return next(r for r in rows if r["mechanism"] == mechanism)


def test_the_deployed_emoji_use_case_is_advised_to_take_olh() -> None:
    """emoji (CMS, ε = 4, 10,000 reports): olh is recommended, with 0.66x the SE and 0.44x the devices."""
    out = plan(["compare", "--registry", str(EXAMPLE), "emoji"])
    (emoji,) = out["plans"]
    assert emoji["current"] == "cms"
    assert emoji["recommended"] == "olh"
    e = math.exp(4.0)
    cms = (e**0.5 / (e**0.5 - 1) ** 2) * (1024 / 1023) ** 2
    olh = 4 * e / (e - 1) ** 2
    # The analytic ratio of the leading terms, with the small collision terms of each on top.
    assert emoji["se_ratio"] == pytest.approx(math.sqrt(olh / cms), rel=0.03)
    assert emoji["devices_ratio"] == pytest.approx(emoji["se_ratio"] ** 2)
    assert "switch to olh" in emoji["advice"]
    assert "fewer" in emoji["advice"]


def test_hcms_domains_are_advised_to_take_olh_at_a_seventh_of_the_variance() -> None:
    """safari-energy-domains (HCMS, ε = 4): olh's variance is under a tenth of HCMS's."""
    (domains,) = plan(["compare", "--registry", str(EXAMPLE), "safari-energy-domains"])["plans"]
    assert domains["recommended"] == "olh"
    assert domains["devices_ratio"] < 0.1


def test_every_frequency_use_case_is_compared_and_the_others_are_left_out() -> None:
    """With no use case named, every dictionary and category use case has a plan; means and RAPPOR do not."""
    out = plan(["compare", "--registry", str(EXAMPLE)])
    names = {p["use_case"] for p in out["plans"]}
    assert names == {
        "emoji",
        "emoji-olh",
        "safari-energy-domains",
        "default-browser",
        "keyboard-locale",
        "screen-resolution",
        "utc-offset",
    }
    for p in out["plans"]:
        assert _row(p, p["current"])["variance_vs_best"] >= 1 - 1e-12


def test_categories_list_every_oracle_with_its_record_size_and_cost() -> None:
    """A fixed domain: grr, oue, ss, pgr and olh, each with an SE, a record size and a decode cost."""
    out = plan(["oracles", "--epsilon", "4", "--n", "1e5", "--categories", "843"])
    assert {r["mechanism"] for r in out["table"]} >= {"grr", "oue", "ss", "pgr", "olh"}
    ss, pgr, grr = _row(out, "ss"), _row(out, "pgr"), _row(out, "grr")
    assert pgr["standard_error"] <= 1.05 * ss["standard_error"]
    assert grr["standard_error"] > 2 * ss["standard_error"]
    assert _row(out, "oue")["report_bytes"] >= 843 // 8
    assert all(r["decode_ops"] > 0 for r in out["table"])


def test_a_large_n_suggests_a_larger_olh_family() -> None:
    """At 10^6 reports the fixed family's collision term dominates at 4,096 functions; a wider family is listed."""
    out = plan(["oracles", "--epsilon", "4", "--n", "1e6", "--dictionary-size", "65536"])
    families = [r for r in out["table"] if r["mechanism"] == "olh"]
    assert len(families) == 2
    assert families[1]["standard_error"] < families[0]["standard_error"] / 2
    assert out["recommended"] == "olh"
    assert "seeds=262,144" in out["recommended_parameters"]


def test_the_text_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    """Text: an aligned table with its headers and the advice; JSON: the same numbers."""
    assert main(["compare", "--registry", str(EXAMPLE), "emoji"]) == 0
    printed = capsys.readouterr().out
    assert "SE of a count" in printed
    assert "advice: switch to olh" in printed
    assert main(["oracles", "--epsilon", "2", "--n", "1000", "--categories", "8", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["recommended"] in ("grr", "ss", "pgr")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["oracles", "--epsilon", "4", "--n", "1e3"], "--categories K"),
        (["oracles", "--epsilon", "4", "--n", "1e3", "--categories", "8", "--dictionary-size", "9"], "--categories K"),
        (["compare", "--registry", str(EXAMPLE), "app-usage-seconds"], "not a frequency oracle"),
        (["compare", "--registry", str(EXAMPLE), "nope"], "no use case 'nope'"),
    ],
)
def test_bad_inputs_say_what_to_change(argv: list[str], message: str) -> None:
    """Missing or conflicting domains, a use case that is no frequency oracle, an unknown one: a PlanError."""
    with pytest.raises(PlanError, match=message):
        plan(argv)


def test_a_wider_family_of_the_same_mechanism_is_advised_as_such() -> None:
    """The example's emoji-olh at 10^6 reports: keep olh with a wider family, not 'keep olh' unchanged."""
    (plan_,) = plan(["compare", "--registry", str(EXAMPLE), "emoji-olh", "--n", "1e6"])["plans"]
    assert plan_["recommended"] == "olh"
    assert plan_["advice"].startswith("keep olh with other parameters (g=56 seeds=262,144)")
    assert plan_["devices_ratio"] < 0.2


def test_a_large_epsilon_plans_every_mechanism_that_builds() -> None:
    """At ε = 20 every oracle still builds (olh's g stops at 4,096) and the table lists them all."""
    out = plan(["oracles", "--epsilon", "20", "--n", "1e5", "--categories", "8"])
    assert {r["mechanism"] for r in out["table"]} == {"olh", "grr", "oue", "ss", "pgr"}
