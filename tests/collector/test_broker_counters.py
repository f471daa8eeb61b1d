"""Loss at the broker is visible: the collector follows Mosquitto's $SYS counters and exports
the messages the broker dropped on a full queue as ldp_broker_messages_dropped_total."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

from collector.config import MqttConfig
from collector.metrics import IngestMetrics, render_prometheus
from collector.mqtt import MqttTransport
from tests.collector.support import run_async
from tests.support.broker import running_broker
from tests.support.mqtt_publisher import MqttPublisher


@run_async
async def test_messages_dropped_on_a_full_queue_show_up_in_the_metrics(tmp_path: Path) -> None:
    """An offline session with a 5-message queue gets 20 reports: the collector's metrics show >= 15 dropped."""
    with running_broker(tmp_path / "broker", extra_config="sys_interval 1\nmax_queued_messages 5\n") as broker:
        base = MqttConfig(host=broker.host, port=broker.port, session_expiry_s=600, reconnect_max_s=0.2)
        offline = MqttTransport(replace(base, client_id="ldp-offline-collector"))
        running = asyncio.create_task(offline.run())
        await asyncio.wait_for(offline.wait_subscribed(), 20)
        await offline.close()
        await asyncio.wait_for(running, 20)

        publisher = MqttPublisher(broker.host, broker.port, client_id="ldp-test-device")
        await publisher.publish_all([("ldp/v1/reports/flag", bytes([i])) for i in range(20)])

        watcher = MqttTransport(replace(base, client_id="ldp-watching-collector"))
        watching = asyncio.create_task(watcher.run())
        try:
            await asyncio.wait_for(watcher.wait_subscribed(), 20)
            deadline = time.monotonic() + 30
            while watcher.statistics().broker.get("$SYS/broker/publish/messages/dropped", 0) < 15:
                assert time.monotonic() < deadline, watcher.statistics().broker
                await asyncio.sleep(0.1)
            text = render_prometheus(IngestMetrics(), watcher.statistics(), instance="t")
            line = next(x for x in text.splitlines() if x.startswith("ldp_broker_messages_dropped_total "))
            assert float(line.split()[1]) >= 15
            assert "ldp_broker_stored_messages " in text
            assert watcher.statistics().received == 0  # the counters never reach ingest
        finally:
            await watcher.close()
            await asyncio.wait_for(watching, 20)
