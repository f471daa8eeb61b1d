"""Estimates leave the collector as the API computes them: the per-period export (CSV and JSON
lines) and the ``ldp_estimate_*`` gauges in ``/metrics``, read back against ``/estimate`` and
against the examples docs/deploy.md shows."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import re
import time
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from collector.export import EXPORT_COLUMNS
from collector.http import HttpApi
from protocol.registry import Registry
from tests.collector.support import run_async
from tests.collector.test_dashboard import _config, _get
from tests.collector.test_dashboard_periods import _populate_two_periods

DEPLOY_MD = Path(__file__).resolve().parents[2] / "docs" / "deploy.md"


def _docs_block(language: str, containing: str) -> str:
    """The fenced block of docs/deploy.md in ``language`` that contains ``containing`` (indent removed)."""
    for block in re.findall(rf"^( *)```{language}\n(.*?)^\1```", DEPLOY_MD.read_text(), re.S | re.M):
        indent, body = block
        if containing in body:
            return "".join(line[len(indent) :] + "\n" for line in body.splitlines())
    raise AssertionError(f"docs/deploy.md has no {language} block with {containing!r}")


def _number(cell: str) -> float | None:
    return None if cell == "" else float(cell)


async def _serve(
    tmp_path: Path, registry: Registry, registry_path: Path, now: float | None = None
) -> tuple[HttpApi, asyncio.Task[None], dict[str, int]]:
    at = time.time() if now is None else now
    older = _populate_two_periods(tmp_path / "dash.sqlite3", registry, at)
    api = HttpApi(_config(tmp_path, registry_path))
    await api.start()
    return api, asyncio.create_task(api.serve()), older


async def _fetch(port: int, path: str) -> tuple[int, str, str]:
    status, ctype, body = await asyncio.to_thread(_get, port, path)
    return status, ctype, body.decode()


@run_async
async def test_the_export_is_the_estimate_and_reads_like_the_documented_file(
    tmp_path: Path, registry: Registry, registry_path: Path
) -> None:
    """Every entry of a period, released and withheld, in CSV and JSON lines: the /estimate figures."""
    api, serving, older = await _serve(tmp_path, registry, registry_path)
    base = f"/api/v1/use-cases/home/export?period={older['home']}"
    try:
        csv_status, csv_type, csv_text = await _fetch(api.port, base + "&format=csv")
        _, jsonl_type, jsonl_text = await _fetch(api.port, base + "&format=jsonl")
        _, _, estimate_text = await _fetch(
            api.port, f"/api/v1/use-cases/home/estimate?period={older['home']}&withheld=1"
        )
        bad = await _fetch(api.port, base + "&format=xml")
        unknown = await _fetch(api.port, "/api/v1/use-cases/nope/export")
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
    assert csv_status == 200
    assert csv_type.startswith("text/csv")
    assert jsonl_type.startswith("application/x-ndjson")
    assert bad[0] == 400
    assert "csv, jsonl" in bad[2]
    assert unknown[0] == 404
    estimate = json.loads(estimate_text)
    entries = estimate["estimate"]["items"] + estimate["estimate"]["withheld_items"]
    assert estimate["estimate"]["withheld_items"], "the period withholds entries, so the export shows them"
    rows = list(csv.DictReader(io.StringIO(csv_text)))
    lines = [json.loads(line) for line in jsonl_text.splitlines()]
    assert [tuple(r) for r in lines] == [EXPORT_COLUMNS] * len(entries)
    for row, line, entry in zip(rows, lines, entries, strict=True):
        assert row["item"] == line["item"] == entry["value"]
        assert _number(row["value"]) == line["value"] == entry["count"]
        se = entry.get("selection_standard_error", entry["standard_error"])
        assert _number(row["standard_error"]) == line["standard_error"] == se
        assert [_number(row["ci_low"]), _number(row["ci_high"])] == [line["ci_low"], line["ci_high"]] == entry["ci"]
        assert row["released"] == ("true" if entry["released"] else "false")
        assert line["released"] is entry["released"]
        assert (row["withheld_reason"] or None) == line["withheld_reason"] == entry.get("withheld_reason")
        assert int(row["period"]) == line["period"] == older["home"]
        assert int(row["reports"]) == line["reports"] == estimate["reports"]
    # The file docs/deploy.md shows reads back with the same columns, values and flags.
    documented = list(csv.DictReader(io.StringIO(_docs_block("csv", "use_case,definition"))))
    assert documented
    assert csv_text.splitlines()[0] == ",".join(EXPORT_COLUMNS)
    assert tuple(documented[0]) == EXPORT_COLUMNS
    for row in documented:
        assert row["released"] in ("true", "false")
        assert all(_number(row[c]) is not None for c in ("value", "standard_error", "ci_low", "ci_high", "p_value"))
        assert bool(row["withheld_reason"]) == (row["released"] == "false")


def _gauges(text: str) -> dict[str, dict[str, float]]:
    """``ldp_estimate_*`` families of a scrape: name → {use_case: value}, each sample's labels checked."""
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("ldp_estimate_"):
            for sample in family.samples:
                assert set(sample.labels) == {"use_case", "definition"}
                out.setdefault(family.name, {})[sample.labels["use_case"]] = sample.value
    return out


@run_async
async def test_metrics_carry_the_latest_estimate_of_means_and_proportions(
    tmp_path: Path, registry: Registry, registry_path: Path
) -> None:
    """One series per mean and proportion use case, the figures /estimate shows without ?period."""
    api, serving, _ = await _serve(tmp_path, registry, registry_path)
    try:
        _, _, scrape = await _fetch(api.port, "/metrics")
        expected: dict[str, Any] = {}
        for name in ("usage", "flag"):
            expected[name] = json.loads((await _fetch(api.port, f"/api/v1/use-cases/{name}/estimate"))[2])
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
    gauges = _gauges(scrape)
    for name, est in expected.items():
        assert est["released"]
        assert gauges["ldp_estimate_value"][name] == est["estimate"]["value"]
        assert gauges["ldp_estimate_standard_error"][name] == est["estimate"]["standard_error"]
        assert [gauges["ldp_estimate_ci_low"][name], gauges["ldp_estimate_ci_high"][name]] == est["estimate"]["ci"]
        assert gauges["ldp_estimate_reports"][name] == est["reports"] == 400  # the current period
    # Bounded: means and proportions only, never a frequency table's entries.
    assert {uc for family in gauges.values() for uc in family} == {"usage", "flag"}
    # The scrape docs/deploy.md shows parses the same way, with families the collector serves.
    documented = _gauges(_docs_block("text", "ldp_estimate_value"))
    assert set(documented) <= set(gauges)
    assert set(documented["ldp_estimate_value"]) == {"usage", "flag"}
    assert "ldp_collector_" in scrape  # the service's own metrics are still there
