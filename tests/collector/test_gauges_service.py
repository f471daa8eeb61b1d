"""The real collector's ``ldp_estimate_*`` gauges show what its API calls the latest estimate: the
same period and the same numbers, also when later periods hold too few reports or none."""

from __future__ import annotations

import asyncio
import calendar
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from collector.config import load_config
from collector.export import GAUGED_KINDS
from protocol.registry import Registry
from protocol.wire import encode_report
from tests.collector.conftest import FixedClock
from tests.collector.processes import write_config
from tests.collector.support import current_period, privatized_reports, run_async
from tests.collector.test_integration import _running, _until_committed
from tests.support.broker import Broker, free_port
from tests.support.mqtt_publisher import MqttPublisher

# (use case, periods back from the current one, reports): the released period of each is older
# than the last closed one, which has a few reports (below min_reports = 20) or none.
STREAMS = (("usage", 3, 300), ("usage", 1, 5), ("flag", 2, 300))


def _get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as response:
        body: bytes = response.read()
        return body.decode()


def _gauges(scrape: str) -> dict[str, dict[str, float]]:
    """``{family: {use case: value}}`` of the ``ldp_estimate_*`` families of a Prometheus scrape."""
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(scrape):
        if family.name.startswith("ldp_estimate_"):
            for sample in family.samples:
                out.setdefault(family.name, {})[sample.labels["use_case"]] = sample.value
    return out


@run_async
async def test_each_gauge_is_the_apis_latest_estimate(
    tmp_path: Path, mosquitto: Broker, registry: Registry, registry_path: Path
) -> None:
    """Reports through a real broker into a real collector: each gauge equals /estimate without ?period."""
    now = time.time()
    http_port = free_port()
    config = load_config(
        write_config(tmp_path, registry=registry_path, host=mosquitto.host, port=mosquitto.port, http_port=http_port)
    )
    items = []
    for i, (name, back, count) in enumerate(STREAMS):
        period = current_period(registry, name, now) - back
        for report in privatized_reports(registry, name, count, period=period, seed=700 + i):
            items.append((f"ldp/v1/reports/{name}", encode_report(report)))
    # The clock stands still, so no period boundary passes between the reports and the scrape.
    async with _running(config, clock=FixedClock(now)) as service:
        await MqttPublisher(mosquitto.host, mosquitto.port, client_id="gauges").publish_all(items)
        await _until_committed(service, len(items))
        scrape = await asyncio.to_thread(_get, http_port, "/metrics")
        latest: dict[str, Any] = {}
        for name, uc in registry.use_cases.items():
            if uc.mechanism.kind.result in GAUGED_KINDS:
                path = f"/api/v1/use-cases/{name}/estimate"
                latest[name] = json.loads(await asyncio.to_thread(_get, http_port, path))
    gauges = _gauges(scrape)
    assert set(latest) == {"usage", "flag"}
    for name, est in latest.items():
        assert est["released"], est
        assert gauges["ldp_estimate_reports"][name] == est["reports"] == 300
        start = calendar.timegm(time.strptime(est["period_start"], "%Y-%m-%dT%H:%M:%SZ"))
        assert gauges["ldp_estimate_period_start_seconds"][name] == start
        assert gauges["ldp_estimate_value"][name] == est["estimate"]["value"]
        assert gauges["ldp_estimate_standard_error"][name] == est["estimate"]["standard_error"]
        assert [gauges["ldp_estimate_ci_low"][name], gauges["ldp_estimate_ci_high"][name]] == est["estimate"]["ci"]
        # Not the last closed period: that one has too few reports (usage) or none (flag).
        assert est["period"] < current_period(registry, name, now) - 1
