"""Config decoding (frozen objects, errors naming file and field) and the command line."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from collector.cli import main
from collector.config import CollectorConfig, load_config, parse_config
from collector.errors import ConfigError
from collector.store import CheckpointStore
from protocol.registry import Registry
from protocol.wire import decode_report, encode_report
from tests.collector.support import current_period, privatized_reports

ROOT = Path(__file__).resolve().parents[2]


def test_the_example_config_decodes_into_frozen_objects() -> None:
    """deploy/collector.example.toml is valid, complete, and decodes into frozen values."""
    cfg = load_config(ROOT / "deploy" / "collector.example.toml")
    assert cfg.mqtt.port == 8883
    assert cfg.mqtt.tls is not None
    assert cfg.mqtt.password_file == Path("/run/credentials/ldp-collector.service/broker-password")
    assert cfg.store.path == Path("/var/lib/ldp-collector/collector.sqlite3")
    assert cfg.mqtt.topic_filter == "ldp/v1/reports/#"
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.mqtt.port = 1  # type: ignore[misc]


def test_defaults_and_shared_subscription_filter() -> None:
    """Only the registry is required; a shared group turns the filter into $share/<group>/..."""
    cfg = parse_config({"registry": "r.toml", "mqtt": {"shared_group": "collectors"}}, base=Path("/srv"))
    assert cfg.registry == Path("/srv/r.toml")
    assert cfg.mqtt.topic_filter == "$share/collectors/ldp/v1/reports/#"
    assert cfg.store.path == Path("/srv/collector.sqlite3")
    assert cfg.ingest.commit_max_reports == 4000


@pytest.mark.parametrize(
    ("doc", "field", "words"),
    [
        ({}, "registry", "required"),
        ({"registry": "r", "mqtt": {"prot": 1}}, "mqtt.prot", "unknown key"),
        ({"registry": "r", "mqtt": {"port": 0}}, "mqtt.port", "[1, 65535]"),
        ({"registry": "r", "mqtt": {"port": "1883"}}, "mqtt.port", "expected an integer"),
        ({"registry": "r", "mqtt": {"keepalive_s": True}}, "mqtt.keepalive_s", "boolean"),
        ({"registry": "r", "mqtt": {"topic": "a/#/b"}}, "mqtt.topic", "topic filter"),
        ({"registry": "r", "mqtt": {"shared_group": "a/b"}}, "mqtt.shared_group", "cannot contain"),
        ({"registry": "r", "mqtt": {"tls": {"ca": "x"}}}, "mqtt.tls.ca", "unknown key"),
        ({"registry": "r", "ingest": {"commit_interval_s": 0}}, "ingest.commit_interval_s", "(0, 60]"),
        ({"registry": "r", "ingest": {"retention_periods": 0}}, "ingest.retention_periods", "[1, 100000]"),
        ({"registry": "r", "estimation": {"confidence": 2}}, "estimation.confidence", "[0.5, 0.9999]"),
        ({"registry": "r", "estimation": {"sfp_alphabet": "ab "}}, "estimation.sfp_alphabet", "collector.alphabet"),
        ({"registry": "r", "http": 3}, "http", "expected a table"),
        ({"registry": "r", "extra": 1}, "extra", "unknown key"),
    ],
)
def test_bad_config_names_the_file_and_the_field(doc: dict[str, object], field: str, words: str) -> None:
    """Each mistake stops decoding with a ConfigError naming the file and the dotted field."""
    with pytest.raises(ConfigError) as info:
        parse_config(doc, source="collector.toml")
    assert info.value.path == "collector.toml"
    assert info.value.field == field
    assert words in str(info.value)
    assert str(info.value).startswith(f"collector.toml: {field}: ")


def test_unreadable_or_invalid_toml_names_the_file(tmp_path: Path) -> None:
    """A missing file or a TOML syntax error is a ConfigError naming the file."""
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("registry = \n", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid TOML") as info:
        load_config(bad)
    assert info.value.path == str(bad)


def _write(tmp_path: Path, registry_path: Path, extra: str = "") -> Path:
    path = tmp_path / "collector.toml"
    path.write_text(f'registry = "{registry_path}"\n[store]\npath = "store.sqlite3"\n{extra}', encoding="utf-8")
    return path


def test_check_config_accepts_a_good_config_and_names_a_bad_field(
    tmp_path: Path, registry_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`check-config` exits 0 for a good config; 2, naming file and field, for a bad one or a bad registry."""
    good = _write(tmp_path, registry_path)
    assert main(["--config", str(good), "check-config"]) == 0
    assert "ok; registry" in capsys.readouterr().out
    bad = _write(tmp_path, registry_path, "[mqtt]\nport = 70000\n")
    assert main(["--config", str(bad), "check-config"]) == 2
    assert f"{bad}: mqtt.port: expected an integer in [1, 65535]" in capsys.readouterr().err
    broken = tmp_path / "broken-registry.toml"
    broken.write_text(registry_path.read_text().replace("m = 3_600", "m = -1"), encoding="utf-8")
    path = tmp_path / "c2.toml"
    path.write_text(f'registry = "{broken}"\n', encoding="utf-8")
    assert main(["--config", str(path), "check-config"]) == 2
    err = capsys.readouterr().err
    assert str(broken) in err
    assert "use_cases.usage.parameters.m" in err


def test_run_stops_at_start_up_on_a_bad_registry(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`run` with an unreadable registry exits 2 before connecting anywhere."""
    path = tmp_path / "c.toml"
    path.write_text(f'registry = "{tmp_path / "nope.toml"}"\n', encoding="utf-8")
    assert main(["--config", str(path), "run"]) == 2
    assert "cannot read the registry" in capsys.readouterr().err


def _populated(tmp_path: Path, registry: Registry, registry_path: Path) -> CollectorConfig:
    config = load_config(_write(tmp_path, registry_path))
    store = CheckpointStore(config.store.path, registry, instance="cli")
    try:
        for seed, name in enumerate(("usage", "emoji")):
            reports = privatized_reports(registry, name, 200, period=current_period(registry, name), seed=3 + seed)
            store.commit([decode_report(encode_report(r), registry) for r in reports], {"messages": 200})
    finally:
        store.close()
    return config


def test_estimate_prints_text_and_json(
    tmp_path: Path, registry: Registry, registry_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`estimate USE_CASE` prints the estimate with SE and CI; `--json` prints the same as JSON."""
    config = _populated(tmp_path, registry, registry_path)
    cfg = str(tmp_path / "collector.toml")
    assert main(["--config", cfg, "estimate", "usage"]) == 0
    out = capsys.readouterr().out
    assert "usage (one-bit-mean)" in out
    assert "(SE); 95% CI" in out
    assert main(["--config", cfg, "estimate", "emoji", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["released"]
    assert data["kind"] == "frequencies"
    assert all({"count", "standard_error", "ci"} <= set(i) for i in data["estimate"]["items"])
    assert "withheld_items" not in data["estimate"]
    assert main(["--config", cfg, "estimate", "emoji", "--json", "--all"]) == 0
    full = json.loads(capsys.readouterr().out)["estimate"]
    assert len(full["items"]) + len(full["withheld_items"]) == full["tested"]
    assert all(i["released"] is False and i["withheld_reason"] for i in full["withheld_items"])
    assert main(["--config", cfg, "estimate", "emoji", "--all"]) == 0
    assert "withheld (not released)" in capsys.readouterr().out
    period = current_period(registry, "usage") - 1
    assert main(["--config", cfg, "estimate", "usage", "--period", str(period)]) == 3
    assert "not released" in capsys.readouterr().out
    assert main(["--config", cfg, "estimate", "nope"]) == 2
    assert main(["--config", cfg, "status", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["counters"]["reports"] == 400
    assert config.store.path.exists()
