"""A registry rollout on a running fleet: 1,000 devices, half move to a second registry mid-run.

A real Mosquitto and a real collector process (given both registry files, the second current,
the use case the second drops retired from the day after the change) and ``ldp-fleet`` with
commit receipts: every report is counted under the definition it was made with (or refused as
retired, after its date), every definition's estimates are within 5 SE of its own truth, and
no device's ε spent for a use case ever goes down or passes its lifetime cap across the change.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import urllib.request
from pathlib import Path

from fleet.cli import main as fleet_main
from protocol.catalog import Catalog
from protocol.registry import parse_registry
from tests.collector.processes import CollectorProcess
from tests.support.broker import Broker, free_port

ROOT = Path(__file__).resolve().parents[2]
V1 = ROOT / "deploy" / "fleet.usecases.toml"
V2 = ROOT / "deploy" / "fleet.usecases.v2.toml"
DEVICES = 1000
DAYS = 3
CHANGE_DAY = 2  # the moving half takes the second registry at the start of day 2
RETIRED = "safari-energy-domains"
SIMULATED = (
    "app-usage-seconds",
    "app-usage-histogram",
    "dark-mode-enabled",
    "emoji",
    RETIRED,
    "default-browser",
    "crash-reported",
)
"""What the rollout is about: the use cases that stay, change, retire or arrive (the registries'
frequency-oracle twins are left out; their definitions do not change)."""


def _collector_config(root: Path, port: int, http: int, retire: dt.date) -> Path:
    path = root / "collector.toml"
    path.write_text(
        f"""registry = "{V2}"
earlier_registries = ["{V1}"]
instance = "rollout"

[retire]
"{RETIRED}" = {retire.isoformat()}

[mqtt]
host = "127.0.0.1"
port = {port}
client_id = "ldp-collector-rollout"
reconnect_max_s = 0.5

[ingest]
commit_interval_s = 0.05
retention_periods = {(DAYS + 2) * 4}

[store]
path = "{root / "collector.sqlite3"}"

[http]
host = "127.0.0.1"
port = {http}
""",
        encoding="utf-8",
    )
    return path


def test_half_the_fleet_moves_to_a_second_registry_and_every_report_counts_under_its_own_definition(
    mosquitto: Broker, tmp_path: Path
) -> None:
    """Added, changed (memoized and event-level) and retired use cases: all counted, all within 5 SE, ε never reset."""
    v1 = parse_registry(V1.read_bytes(), source=str(V1))
    v2 = parse_registry(V2.read_bytes(), source=str(V2))
    catalog = Catalog.build(v2, [v1])
    today = dt.datetime.now(dt.UTC).date()
    start = today - dt.timedelta(days=DAYS)
    retire = start + dt.timedelta(days=CHANGE_DAY)  # from the day after the change on
    http = free_port()
    collector = CollectorProcess(_collector_config(tmp_path, mosquitto.port, http, retire), log=tmp_path / "c.log")
    collector.start()
    try:
        began = time.monotonic()
        status = fleet_main(
            [
                *("--devices", str(DEVICES), "--days", str(DAYS), "--start", start.isoformat(), "--seed", "5"),
                *("--registry", str(V1), "--registry-change", str(V2), "--change-at-day", str(CHANGE_DAY)),
                *("--no-tls", "--broker", f"127.0.0.1:{mosquitto.port}", "--collector-url", f"http://127.0.0.1:{http}"),
                *("--output", str(tmp_path / "results.json"), "--quiet"),
                *(arg for name in SIMULATED for arg in ("--use-case", name)),
            ]
        )
        took = time.monotonic() - began
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/api/v1/status", timeout=30) as response:
            served = json.load(response)
    finally:
        assert collector.stop() == 0
    print(f"{DEVICES} devices x {DAYS} days with a registry change: {took:.0f} s")
    results = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    assert status == 0, results
    # Per device and use case, the ε its ledger records never went down nor passed the cap.
    assert results["epsilon_audit"] == {"checked": results["epsilon_audit"]["checked"], "problems": []}
    assert results["epsilon_audit"]["checked"] >= DEVICES * 6
    receipts = results["receipts"]
    assert receipts["missing"] == 0
    by_definition: dict[str, dict[str, int]] = receipts["by_definition"]
    # Every report counted, but the retired use case's for the day after its date, each refused as such.
    refused = {(ref, s): n for ref, said in by_definition.items() for s, n in said.items() if s != "counted"}
    stayed = DEVICES // 2  # the devices that did not move still report the retired use case
    assert refused == {(v1[RETIRED].ref, "refused: retired"): stayed * (DAYS - CHANGE_DAY)}
    # Each definition reported under and compared on its own: the changed use cases under both.
    compared = {
        info["definition"] for info in results["use_cases"].values() if info.get("comparison", {}).get("compared")
    }
    for name in ("emoji", "default-browser"):
        assert {v1[name].ref, v2[name].ref} <= compared, name
        assert v1[name].ref != v2[name].ref
    assert v2["crash-reported"].ref in compared
    assert v1[RETIRED].ref in compared
    for name in ("dark-mode-enabled", "app-usage-seconds", "app-usage-histogram"):
        assert v1[name].ref == v2[name].ref  # unchanged: one definition, whoever reports it
    for info in results["use_cases"].values():
        assert info["comparison"]["ok"], info["definition"]
        assert info["current"] == catalog.is_current(catalog.use_cases[info["definition"]])
    # The collector names each definition, which is current, and the retirement.
    definitions = {d["definition"]: d for info in served["use_cases"].values() for d in info["definitions"]}
    # Exactly once: the collector holds, per definition, as many reports as receipts said counted.
    held = {ref: sum(p["reports"] for p in d["periods"]) for ref, d in definitions.items() if d["periods"]}
    assert held == {ref: said["counted"] for ref, said in by_definition.items() if said.get("counted")}
    assert definitions[v1["emoji"].ref]["current"] is False
    assert definitions[v2["emoji"].ref]["current"] is True
    assert definitions[v1[RETIRED].ref]["retired_from"] == retire.isoformat()
    assert served["use_cases"][RETIRED]["in_current_registry"] is False
