"""The production broker config beyond access rules: TLS on every listener, a collector
backlog far beyond Mosquitto's default queue limit that survives a broker restart, and the
rewriter that lets the tests run the production file unchanged in substance."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.config import IngestConfig
from collector.service import MQTT_FRAMING_BYTES
from protocol.registry import MAX_REPORT_BYTES
from protocol.wire import DEFAULT_MAX_SIZE
from tests.deploy.conftest import BrokerUsers, Clients
from tests.deploy.probe import V311
from tests.deploy.secure_broker import PRODUCTION_CONF, rewrite_config, running_secure_broker

TLS_OPTIONS = ("cafile", "certfile", "keyfile")


def _settings(text: str) -> list[tuple[str, str]]:
    pairs = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            key, _, value = stripped.partition(" ")
            pairs.append((key, value.strip()))
    return pairs


def test_every_listener_requires_tls_and_a_credential() -> None:
    """Each listener of the production config has a certificate and key; anonymous access is off."""
    settings = _settings(PRODUCTION_CONF.read_text(encoding="utf-8"))
    blocks: list[dict[str, str]] = []
    general: dict[str, str] = {}
    for key, value in settings:
        if key == "listener":
            blocks.append({"listener": value})
        elif blocks:
            blocks[-1][key] = value
        else:
            general[key] = value
    assert blocks, "no listener"
    for block in blocks:
        missing = [k for k in TLS_OPTIONS if k not in block]
        assert not missing, f"listener {block['listener']} lacks {missing}: it would accept plaintext"
        assert block.get("require_certificate") == "true" or "password_file" in dict(settings)
    everything = dict(settings)
    assert everything.get("allow_anonymous") == "false"
    assert everything.get("per_listener_settings") == "false"  # one password file and ACL for all listeners
    assert "port" not in everything  # the old-style default listener on 1883 is plaintext
    for block in blocks:
        assert int(block.get("max_connections", "-1")) > 0, f"listener {block['listener']} has no connection limit"


def test_packet_size_agrees_with_the_report_cap() -> None:
    """The broker carries the largest report the registry allows plus MQTT framing, and not much more."""
    everything = dict(_settings(PRODUCTION_CONF.read_text(encoding="utf-8")))
    assert MAX_REPORT_BYTES == DEFAULT_MAX_SIZE == IngestConfig().max_report_bytes
    assert int(everything["max_packet_size"]) == MAX_REPORT_BYTES + MQTT_FRAMING_BYTES


def test_queue_drops_are_logged_and_counters_published() -> None:
    """Queue overflow is logged (notice) and $SYS counters are published for the collector to export."""
    settings = _settings(PRODUCTION_CONF.read_text(encoding="utf-8"))
    assert ("log_type", "notice") in settings
    assert 0 < int(dict(settings)["sys_interval"]) <= 60


def test_collector_backlog_beyond_default_limit_survives_restart(
    tmp_path: Path, pki: Path, broker_users: BrokerUsers
) -> None:
    """1,500 reports (Mosquitto's default queue holds 1,000) queued for an offline collector survive a restart."""
    topic = "ldp/v1/reports/devices/backlog"
    payloads = [b"report %05d" % i for i in range(1500)]
    with running_secure_broker(
        tmp_path / "broker", pki=pki, passwd=broker_users.passwd, passwords=broker_users.passwords
    ) as broker:
        clients = Clients(broker)
        try:
            client_id = "ldp-collector-backlog-test"
            first = clients.connected("collector", client_id=client_id, session_expiry=300)
            assert first.subscribe("ldp/v1/reports/#") == [1]
            first.close()

            device = clients.connected("devices", protocol=V311)
            device.publish_many(topic, payloads)
            device.close()

            broker.stop()  # SIGTERM: mosquitto writes its persistence file
            broker.start()

            resumed = clients.connected("collector", client_id=client_id, session_expiry=1)
            got = resumed.wait_messages(len(payloads), topic, timeout=30)
            resumed.sync()
            assert sorted(resumed.received(topic)) == payloads, f"{len(got)} of {len(payloads)} delivered"
        finally:
            clients.close()


@pytest.mark.parametrize(
    "line",
    [
        "listener 1883",
        "port 1883",
        "include_dir /etc/mosquitto/conf.d",
        "crlfile /etc/mosquitto/ldp/crl.pem",
        "some_new_option /etc/mosquitto/secret",
    ],
)
def test_rewriter_refuses_what_it_cannot_relocate(tmp_path: Path, line: str) -> None:
    """A listener, default port or path the tests cannot move is an error, never left pointing at the host."""
    with pytest.raises(ValueError, match=r"\S"):
        rewrite_config(f"{line}\n", directory=tmp_path, ports={8883: 1}, user="nobody")


def test_rewriter_changes_only_ports_paths_user_and_log(tmp_path: Path) -> None:
    """Every production setting but listeners, paths, user and log reaches the test broker verbatim."""
    production = PRODUCTION_CONF.read_text(encoding="utf-8")
    rewritten = rewrite_config(production, directory=tmp_path, ports={8883: 1, 8884: 2}, user="nobody")
    moved = {"listener", "cafile", "certfile", "keyfile", "password_file", "acl_file", "persistence_location"}
    moved |= {"pid_file", "log_dest", "user"}
    before = [kv for kv in _settings(production) if kv[0] not in moved]
    after = [kv for kv in _settings(rewritten) if kv[0] not in moved]
    assert before == after
    assert [v for k, v in _settings(rewritten) if k == "listener"] == ["1 127.0.0.1", "2 127.0.0.1"]
