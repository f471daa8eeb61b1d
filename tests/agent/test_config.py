"""Config decoding: frozen typed objects; every mistake names the file and the field."""

from __future__ import annotations

from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest

from agent.config import ActiveSecondsProbe, AgentConfig, load_config, parse_config
from agent.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]

MINIMAL = """
[broker]
host = "127.0.0.1"
[registry]
path = "usecases.toml"
[state]
directory = "state"
key_file = "state.key"
[api]
socket = "agent.sock"
"""


def test_example_config_decodes() -> None:
    """deploy/agent.example.toml is a valid config (it documents every key)."""
    cfg = load_config(ROOT / "deploy" / "agent.example.toml")
    assert cfg.broker.port == 8883
    assert cfg.broker.tls
    assert cfg.schedule.interval_hours == 6
    assert [p.kind for p in cfg.probes] == ["uptime", "active-seconds", "process-names"]
    assert isinstance(cfg.probes[1], ActiveSecondsProbe)
    assert cfg.source == ROOT / "deploy" / "agent.example.toml"


def test_minimal_config_defaults_and_relative_paths(tmp_path: Path) -> None:
    """Omitted sections take their defaults; relative paths are relative to the config file."""
    path = tmp_path / "agent.toml"
    path.write_text(MINIMAL)
    cfg = load_config(path)
    assert cfg.registry.path == tmp_path / "usecases.toml"
    assert cfg.state.directory == tmp_path / "state"
    assert cfg.policy.max_epsilon_report == 8.0
    with pytest.raises(FrozenInstanceError):
        cfg.broker.port = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("edit", "field", "message"),
    [
        (lambda t: t + "\n[extra]\n", "extra", "unknown key"),
        (lambda t: t.replace('host = "127.0.0.1"', 'host = "h"\nhots = 1'), "broker.hots", "unknown key"),
        (lambda t: t.replace('host = "127.0.0.1"', "port = 1883"), "broker.host", "is required"),
        (lambda t: t.replace('host = "127.0.0.1"', 'host = "h"\nport = "x"'), "broker.port", "expected an integer"),
        (lambda t: t.replace('host = "127.0.0.1"', 'host = "h"\nport = 70000'), "broker.port", r"\[1, 65535\]"),
        (lambda t: t.replace('host = "127.0.0.1"', 'host = "h"\ntls = "yes"'), "broker.tls", "true or false"),
        (
            lambda t: t.replace('host = "127.0.0.1"', 'host = "h"\nreceipt_timeout_seconds = 0'),
            "broker.receipt_timeout_seconds",
            "positive",
        ),
        (
            lambda t: t.replace('host = "127.0.0.1"', 'host = "h"\nreceipt_prefix = "ldp/v1/receipts/#"'),
            "broker.receipt_prefix",
            "wildcards",
        ),
        (
            lambda t: t.replace('host = "127.0.0.1"', 'host = "h"\nreceipt_backoff_max = 1.0'),
            "broker.receipt_backoff_max",
            "at least receipt_timeout_seconds",
        ),
        (
            lambda t: t.replace('key_file = "state.key"', 'key_file = "k"\nkey_credential = "c"'),
            "state.key_file",
            "exactly one",
        ),
        (lambda t: t + "\n[schedule]\ninterval_hours = 5\n", "schedule.interval_hours", "divide 24"),
        (lambda t: t + '\n[log]\nlevel = "loud"\n', "log.level", "one of"),
        (lambda t: t + '\n[[probes]]\nkind = "gps"\nuse_case = "x"\n', "probes[0].kind", "one of"),
        (lambda t: t + '\n[[probes]]\nkind = "uptime"\n', "probes[0].use_case", "is required"),
        (
            lambda t: t + '\n[[probes]]\nkind = "active-seconds"\nsource = "file"\ntargets = {a = "x"}\n',
            "probes[0].path",
            "needs a path",
        ),
        (lambda t: t + "\n[policy]\nmax_epsilon_report = -1\n", "policy.max_epsilon_report", "positive"),
    ],
)
def test_mistakes_name_file_and_field(tmp_path: Path, edit: object, field: str, message: str) -> None:
    """Unknown keys, missing keys, wrong types and out-of-range values stop start-up naming file and field."""
    path = tmp_path / "agent.toml"
    path.write_text(edit(MINIMAL))  # type: ignore[operator]
    with pytest.raises(ConfigError, match=message) as info:
        load_config(path)
    assert info.value.path == str(path)
    assert info.value.field == field
    assert str(path) in str(info.value)
    assert field in str(info.value)


def test_syntax_errors_and_unreadable_files(tmp_path: Path) -> None:
    """A file that is not TOML, or cannot be read, is reported with its name."""
    with pytest.raises(ConfigError, match="not valid TOML"):
        parse_config("[broker\n", path="x.toml")
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")


def test_decoded_config_is_typed(tmp_path: Path) -> None:
    """The decoder builds the declared types (paths as Path, floats as float)."""
    cfg = parse_config(MINIMAL + "\n[schedule]\njitter_seconds = 10\n", base=tmp_path)
    assert isinstance(cfg, AgentConfig)
    assert isinstance(cfg.schedule.jitter_seconds, float)
    assert isinstance(cfg.api.socket, Path)
