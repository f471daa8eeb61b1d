"""Config decoding (frozen objects, errors naming file and field) and the command line."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from collector.cli import main
from collector.config import CollectorConfig, load_config, parse_config
from collector.errors import ConfigError
from collector.service import check_size_caps, load_registry
from collector.store import CheckpointStore
from protocol.registry import Registry
from protocol.wire import decode_report, encode_report
from runtime.exit_status import ExitStatus
from tests.collector.support import current_period, privatized_reports
from tests.collector.test_tls import _make_pki

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
        # A filter without '/#' at its end would hide the sender a receipt may go to.
        ({"registry": "r", "mqtt": {"topic": "ldp/v1/reports/+/+"}}, "mqtt.topic", "name the sender"),
        ({"registry": "r", "mqtt": {"topic": "ldp/v1/reports/+/#"}}, "mqtt.topic", "name the sender"),
        ({"registry": "r", "mqtt": {"shared_group": "a/b"}}, "mqtt.shared_group", "cannot contain"),
        ({"registry": "r", "mqtt": {"tls": {"ca": "x"}}}, "mqtt.tls.ca", "unknown key"),
        ({"registry": "r", "mqtt": {"receipt_prefix": "ldp/v1/reports/#"}}, "mqtt.receipt_prefix", "ending in '/'"),
        ({"registry": "r", "mqtt": {"receipt_prefix": "receipts"}}, "mqtt.receipt_prefix", "ending in '/'"),
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
    out = capsys.readouterr().out
    assert "ok; every file it names exists, is readable and parses" in out
    assert "use_cases.emoji.collector.dictionary" in out
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


def _with_files(tmp_path: Path, registry_path: Path) -> tuple[Path, dict[str, Path]]:
    """A config naming every kind of file: TLS CA, client certificate and key, password, registry, dictionary."""
    ca, cert, key = _make_pki(tmp_path / "pki")
    password = tmp_path / "password"
    password.write_text("s3cret\n", encoding="utf-8")
    password.chmod(0o600)  # a password file is readable by its owner only
    extra = (
        f'[mqtt]\nusername = "collector"\npassword_file = "{password}"\n'
        f'[mqtt.tls]\nca_file = "{ca}"\ncert_file = "{cert}"\nkey_file = "{key}"\n'
    )
    files = {
        "mqtt.tls.ca_file": ca,
        "mqtt.tls.cert_file": cert,
        "mqtt.tls.key_file": key,
        "mqtt.password_file": password,
        "registry": registry_path,
        "use_cases.emoji.collector.dictionary": registry_path.parent / "emoji.txt",
    }
    return _write(tmp_path, registry_path, extra), files


@pytest.mark.parametrize(
    "field",
    [
        "mqtt.tls.ca_file",
        "mqtt.tls.cert_file",
        "mqtt.tls.key_file",
        "mqtt.password_file",
        "registry",
        "use_cases.emoji.collector.dictionary",
    ],
)
def test_check_config_names_each_missing_file_and_its_field(
    tmp_path: Path, registry_path: Path, capsys: pytest.CaptureFixture[str], field: str
) -> None:
    """With each file the config or the registry names missing in turn, check-config exits 2 naming it and its field."""
    config, files = _with_files(tmp_path, registry_path)
    assert main(["--config", str(config), "check-config"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert all(f"{name}: {path}" in out for name, path in files.items() if name != "registry")
    files[field].unlink()
    assert main(["--config", str(config), "check-config"]) == ExitStatus.CONFIG
    err = capsys.readouterr().err
    assert f"{field}: " in err
    assert str(files[field].name) in err
    assert "No such file or directory" in err
    # `run` makes the same checks before it connects anywhere.
    assert main(["--config", str(config), "run"]) == ExitStatus.CONFIG
    assert f"{field}: " in capsys.readouterr().err


@pytest.mark.parametrize(
    "case",
    [
        ("mqtt.tls.ca_file", "not a certificate\n", "holds no PEM CA certificate"),
        ("mqtt.tls.cert_file", "not a certificate\n", "is not a PEM certificate"),
        ("mqtt.tls.key_file", "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", "private key"),
        ("mqtt.password_file", "\n", "is empty"),
        ("use_cases.emoji.collector.dictionary", "# only a comment\n", "has no entries"),
    ],
)
def test_check_config_names_a_file_that_does_not_parse(
    tmp_path: Path, registry_path: Path, capsys: pytest.CaptureFixture[str], case: tuple[str, str, str]
) -> None:
    """A file that is there but holds the wrong thing is named with its field and what it should hold."""
    field, content, words = case
    config, files = _with_files(tmp_path, registry_path)
    files[field].write_text(content, encoding="utf-8")
    assert main(["--config", str(config), "check-config"]) == ExitStatus.CONFIG
    err = capsys.readouterr().err
    assert f"{field}: " in err
    assert words in err


def test_run_stops_at_start_up_on_a_bad_registry(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`run` with an unreadable registry exits 2 before connecting anywhere."""
    path = tmp_path / "c.toml"
    path.write_text(f'registry = "{tmp_path / "nope.toml"}"\n', encoding="utf-8")
    assert main(["--config", str(path), "run"]) == 2
    assert f"registry: cannot read {tmp_path / 'nope.toml'}" in capsys.readouterr().err


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
    assert re.search(r"^usage@[0-9a-f]{8} \(one-bit-mean\), period ", out, re.M)
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
    assert main(["--config", cfg, "estimate", "usage", "--period", str(period)]) == ExitStatus.NOT_RELEASED
    assert "not released" in capsys.readouterr().out
    assert main(["--config", cfg, "estimate", "nope"]) == 2
    # The same mistake as an unknown use case to ldp-agent record: 2, with the known names.
    err = capsys.readouterr().err
    assert "unknown use case or definition 'nope'; the use cases are " in err
    assert "usage" in err.rsplit("the use cases are", 1)[1]
    assert main(["--config", cfg, "status", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["counters"]["reports"] == 400
    assert config.store.path.exists()


def _closed_pipe_run(*args: str) -> subprocess.CompletedProcess[bytes]:
    """Run a tool with stdout a pipe whose reader is already gone (as after ``| head -1`` has read its line)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, *args], stdout=write_end, stderr=subprocess.PIPE, cwd=ROOT, timeout=120, check=False
        )
    finally:
        os.close(write_end)


def test_a_closed_pipe_ends_quietly(
    tmp_path: Path, registry: Registry, registry_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`estimate --json | head -1` and `plan | head -1`: no BrokenPipeError traceback, status 0."""
    _populated(tmp_path, registry, registry_path)
    cfg = str(tmp_path / "collector.toml")
    for args in (
        ("-m", "collector", "--config", cfg, "estimate", "emoji", "--json"),
        ("-m", "collector", "plan", "cms", "--epsilon", "4", "--n", "1000000", "--k", "65536", "--m", "1024"),
    ):
        done = _closed_pipe_run(*args)
        assert done.stderr == b"", done.stderr.decode()
        assert done.returncode == 0


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    """`ldp-collector --version` prints the package version."""
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("ldp-collector 0.")


def test_a_report_cap_below_the_registrys_largest_report_stops_start_up(tmp_path: Path) -> None:
    """ingest.max_report_bytes below a use case's largest report, or a packet limit below the cap, is a config error."""
    example = ROOT / "deploy" / "usecases.example.toml"
    registry = load_registry(example)
    good = parse_config({"registry": str(example)}, source="c.toml")
    check_size_caps(good, registry)
    low = dataclasses.replace(good, ingest=dataclasses.replace(good.ingest, max_report_bytes=500))
    with pytest.raises(ConfigError) as info:
        check_size_caps(low, registry)
    assert info.value.field == "ingest.max_report_bytes"
    assert "'new-words'" in str(info.value)
    assert "602 bytes" in str(info.value)
    small = dataclasses.replace(good, mqtt=dataclasses.replace(good.mqtt, max_packet_bytes=65536))
    with pytest.raises(ConfigError) as info:
        check_size_caps(small, registry)
    assert info.value.field == "mqtt.max_packet_bytes"


def test_check_config_warns_when_the_api_listens_beyond_this_machine(
    tmp_path: Path, registry_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The API has no authentication: `[http] host = "0.0.0.0"` is legal but never passes silently."""
    quiet = _write(tmp_path, registry_path)
    assert main(["--config", str(quiet), "check-config"]) == 0
    assert "no authentication" not in capsys.readouterr().out
    exposed = _write(tmp_path, registry_path, '[http]\nhost = "0.0.0.0"\n')
    assert main(["--config", str(exposed), "check-config"]) == 0
    out = capsys.readouterr().out
    assert "warning: http.host = '0.0.0.0': the HTTP API and dashboard have no authentication" in out
    assert "reverse proxy" in out
