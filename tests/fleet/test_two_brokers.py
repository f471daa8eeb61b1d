"""``ldp-fleet`` over two brokers: a real collector subscribed to two real Mosquittos, the fleet
given both (``--broker A,B``) spreads its devices over them, each device through its own
primary, with commit receipts; every report is counted once and both brokers carried reports."""

from __future__ import annotations

import json
import urllib.request
from contextlib import ExitStack
from pathlib import Path

from fleet.cli import main as fleet_main
from tests.collector.processes import CollectorProcess
from tests.support.broker import free_port, running_broker

ROOT = Path(__file__).resolve().parents[2]
REGISTRY = ROOT / "deploy" / "fleet.usecases.toml"
DEVICES = 200


def _collector_config(root: Path, ports: list[int], http: int) -> Path:
    addresses = ", ".join(f'"127.0.0.1:{p}"' for p in ports)
    path = root / "collector.toml"
    path.write_text(
        f"""registry = "{REGISTRY}"
instance = "two-brokers"

[mqtt]
addresses = [{addresses}]
client_id = "ldp-collector-two"
reconnect_max_s = 0.5

[ingest]
commit_interval_s = 0.05

[store]
path = "{root / "collector.sqlite3"}"

[http]
host = "127.0.0.1"
port = {http}
""",
        encoding="utf-8",
    )
    return path


def test_the_fleet_spreads_over_two_brokers_and_every_report_counts_once(tmp_path: Path) -> None:
    with ExitStack() as stack:
        brokers = [stack.enter_context(running_broker(tmp_path / f"broker-{i}")) for i in range(2)]
        http = free_port()
        collector = CollectorProcess(
            _collector_config(tmp_path, [b.port for b in brokers], http), log=tmp_path / "collector.log"
        )
        collector.start()
        try:
            status = fleet_main(
                [
                    *("--devices", str(DEVICES), "--days", "1", "--seed", "3", "--registry", str(REGISTRY)),
                    *("--no-tls", "--broker", ",".join(f"127.0.0.1:{b.port}" for b in brokers)),
                    *("--collector-url", f"http://127.0.0.1:{http}"),
                    *("--output", str(tmp_path / "results.json"), "--quiet"),
                ]
            )
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/healthz", timeout=30) as response:
                health = json.load(response)
        finally:
            assert collector.stop() == 0
    results = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    receipts = results["receipts"]
    assert receipts["missing"] == 0, receipts
    counted = sum(said.get("counted", 0) for said in receipts["by_definition"].values())
    assert counted == DEVICES * 14  # every report of the day counted once (the collector refuses a repeated id)
    # Both brokers carried part of the fleet: each device's primary, by its rendezvous order.
    received = {b["address"]: b["received"] for b in health["brokers"]}
    assert set(received) == {f"127.0.0.1:{b.port}" for b in brokers}
    assert all(n > 0 for n in received.values()), received
    assert sum(received.values()) == counted
    assert status in (0, 7), results  # 200 devices may release nothing to compare (7): not a failure here
