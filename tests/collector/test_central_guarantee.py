"""Every estimate states the central (ε, δ) of its period's shuffled batch next to the
per-record ε: in the typed result, the CLI's JSON and text, and the API's schema
(docs/privacy-accounting.md, "The central guarantee")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collector.amplification import BOUND, bound_reports, central_epsilon, default_delta
from collector.cli import main
from collector.config import load_config
from collector.estimation import central_guarantee, estimate_aggregate
from collector.rendering import format_estimate
from collector.results import EstimateResult, from_json, json_schema, to_json
from collector.store import CheckpointStore, KeyInfo
from protocol.registry import Registry
from protocol.wire import decode_report, encode_report
from tests.collector.support import current_period, privatized_reports


def test_the_guarantee_is_the_bound_at_the_periods_reports_and_the_records_epsilon(registry: Registry) -> None:
    """ε0 is the per-record cost, n the reports rounded down to two significant figures, δ the default."""
    uc = registry.use_cases["emoji"]
    g = central_guarantee(uc, KeyInfo(uc.ref, 7, 12_345, 12_345))
    assert g is not None
    assert (g.n, g.delta, g.epsilon_local, g.bound) == (12_000, default_delta(12_000), uc.cost, BOUND)
    assert g.epsilon == central_epsilon(uc.cost, 12_000, default_delta(12_000))
    assert g.epsilon is not None
    assert g.epsilon < uc.cost
    assert g.unit == "one record of the period"
    assert g.note is None  # fresh coins for every record: nothing to add
    assert central_guarantee(uc, KeyInfo(uc.ref, 7, 0, 0)) is None


def test_memoized_mechanisms_state_it_for_one_period_or_not_at_all(registry: Registry) -> None:
    """A memoized mechanism's figure holds for its period alone; when its reports carried several
    records, which share memos, no amplified ε is stated."""
    for name in ("usage", "home"):  # one-bit-mean, rappor
        uc = registry.use_cases[name]
        one = central_guarantee(uc, KeyInfo(uc.ref, 7, 5_000, 5_000))
        assert one is not None
        assert one.epsilon is not None
        assert one.epsilon < uc.cost
        assert one.note == "this period alone: its memo is shared with other periods"
        several = central_guarantee(uc, KeyInfo(uc.ref, 7, 5_000, 9_000))
        assert several is not None
        assert several.epsilon is None
        assert several.note is not None
        assert "no amplified ε is stated" in several.note


def test_a_period_below_min_reports_still_states_its_guarantee(registry: Registry) -> None:
    """Nothing is released, but what the store keeps of the period is covered, at what few
    reports give: next to nothing below the per-record ε."""
    uc = registry.use_cases["usage"]
    agg = uc.server.new_aggregate()
    for r in privatized_reports(registry, "usage", 3, period=100, seed=5):
        uc.server.fold(agg, uc.server.decode_records(list(r.records)))
    result = estimate_aggregate(uc, agg, KeyInfo(uc.ref, 100, 3, 3))
    assert not result.released
    assert result.central is not None
    assert result.central.epsilon is not None
    assert uc.cost * 0.99 < result.central.epsilon <= uc.cost
    assert from_json(to_json(result), EstimateResult) == result


def test_estimate_json_and_text_carry_it(
    tmp_path: Path, registry: Registry, registry_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`estimate --json` has ``central`` with the amplified ε next to ``epsilon_report``; the
    text says the same in a line of its own."""
    config_path = tmp_path / "collector.toml"
    config_path.write_text(f'registry = "{registry_path}"\n[store]\npath = "store.sqlite3"\n', encoding="utf-8")
    config = load_config(config_path)
    store = CheckpointStore(config.store.path, registry, instance="cli")
    try:
        reports = privatized_reports(registry, "emoji", 300, period=current_period(registry, "emoji"), seed=4)
        store.commit([decode_report(encode_report(r), registry) for r in reports], {"messages": 300})
    finally:
        store.close()
    uc = registry.use_cases["emoji"]
    assert main(["--config", str(config_path), "estimate", "emoji", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    expected = central_epsilon(uc.cost, bound_reports(300), default_delta(300))
    assert data["epsilon_report"] == uc.cost
    assert data["central"] == {
        "epsilon": expected,
        "delta": default_delta(300),
        "epsilon_local": uc.cost,
        "n": 300,
        "bound": BOUND,
        "unit": "one record of the period",
    }
    assert main(["--config", str(config_path), "estimate", "emoji"]) == 0
    text = capsys.readouterr().out
    assert "central guarantee: (ε " in text
    assert "among 300 shuffled reports" in text
    result = from_json(json.dumps(data), EstimateResult)
    assert format_estimate(result).splitlines()[1] == next(
        line for line in text.splitlines() if "central guarantee" in line
    )


def test_the_api_schema_declares_it() -> None:
    """``/api/v1/schema`` (json_schema) defines the estimate's ``central`` and its fields, so the
    dashboard may read them."""
    schema = json_schema()
    defs = schema["$defs"]
    assert isinstance(defs, dict)
    assert "central" in defs["EstimateResult"]["properties"]
    assert set(defs["CentralGuarantee"]["properties"]) == {
        "epsilon",
        "delta",
        "epsilon_local",
        "n",
        "bound",
        "unit",
        "note",
    }
