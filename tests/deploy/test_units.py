"""The systemd units in deploy/: ``systemd-analyze verify`` accepts every one of them, each
carries the directives the deployment relies on (Type=notify with a watchdog, an
unprivileged user, a state directory, credentials, the sandbox), the offline security
review rates it OK, and the credentials the example configs read are the ones the units load.

``systemd-analyze verify`` checks that each Exec*= program exists. The project's console
scripts (``ldp-agent``, ``ldp-collector``) are installed on a real host at the path the unit
names, but here they live in the test's virtualenv: the copy that is verified points there
instead. Nothing else in the unit is changed. Warnings (an unknown key, a bad value that
systemd ignores) exit 0 from verify, so any output line naming the unit fails the test too.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.deploy.secure_broker import DEPLOY, REPO

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_systemd_analyze = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None,
    reason="systemd-analyze is not installed (Debian: apt-get install systemd), so the units cannot be verified",
)


def _systemd_version() -> int:
    if SYSTEMD_ANALYZE is None:
        return 0
    first = subprocess.run(
        [SYSTEMD_ANALYZE, "--version"], capture_output=True, text=True, timeout=30, check=False
    ).stdout.split()
    return int(first[1]) if len(first) > 1 and first[1].isdigit() else 0


needs_offline_security = pytest.mark.skipif(
    _systemd_version() < 250,
    reason="systemd-analyze security --offline needs systemd 250 or later (Debian 12 has 252)",
)
EXPECTED_UNITS = ("ldp-agent.service", "ldp-collector.service")
UNITS = sorted(DEPLOY.glob("*.service"))
MAX_EXPOSURE = 20  # systemd-analyze security on its 0-100 scale: 2.0, within "OK"

# Which example config feeds which unit, and where in it the broker password file is named.
EXAMPLE_CONFIGS = {
    "ldp-agent.service": (DEPLOY / "agent.example.toml", ("broker", "password_file")),
    "ldp-collector.service": (DEPLOY / "collector.example.toml", ("mqtt", "password_file")),
}

Unit = dict[str, dict[str, list[str]]]


def parse_unit(text: str) -> Unit:
    """Sections -> key -> values, as systemd reads them (continuations joined, an empty value resets)."""
    unit: Unit = {}
    section: dict[str, list[str]] | None = None
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if pending:
            if line.startswith(("#", ";")):
                continue
            pending += " " + line
        else:
            if not line or line.startswith(("#", ";")):
                continue
            pending = line
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        logical.append(pending)
        pending = ""
    if pending:
        logical.append(pending)
    for line in logical:
        if line.startswith("[") and line.endswith("]"):
            section = unit.setdefault(line[1:-1], {})
            continue
        if section is None or "=" not in line:
            raise ValueError(f"not a unit file line: {line!r}")
        key, _, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if value:
            section.setdefault(key, []).append(value)
        else:
            section[key] = []  # "Key=" resets a list setting
    return unit


def _console_scripts() -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    return set(project["project"].get("scripts", {}))


_EXEC = re.compile(r"^(Exec(?:Start|StartPre|StartPost|Reload|Stop|StopPost|Condition)\s*=\s*[-@:+!]*)(\S+)(.*)$")


def localise_executables(text: str) -> tuple[str, list[str]]:
    """Point Exec*= lines at this virtualenv's console scripts where the unit's path is absent here."""
    scripts = _console_scripts()
    here = Path(sys.prefix) / "bin"
    changed: list[str] = []
    out = []
    for line in text.splitlines():
        m = _EXEC.match(line.strip())
        local = here / Path(m.group(2)).name if m else None
        if m and local and not Path(m.group(2)).exists() and local.name in scripts and local.exists():
            changed.append(f"{m.group(2)} -> {local}")
            out.append(f"{m.group(1)}{local}{m.group(3)}")
        else:
            out.append(line)
    return "\n".join(out) + "\n", changed


def verify(unit_path: Path, workdir: Path) -> list[str]:
    """Problems ``systemd-analyze verify`` reports for a copy of ``unit_path``; [] when there are none."""
    assert SYSTEMD_ANALYZE is not None
    text, _ = localise_executables(unit_path.read_text(encoding="utf-8"))
    copy = workdir / unit_path.name  # the file name is the unit name: keep it
    copy.write_text(text, encoding="utf-8")
    done = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", str(copy)], capture_output=True, text=True, timeout=60, check=False
    )
    output = (done.stdout + done.stderr).splitlines()
    problems = [ln for ln in output if unit_path.name in ln or str(copy) in ln]
    if done.returncode != 0:
        problems.append(f"systemd-analyze verify exited with {done.returncode}: {output}")
    return problems


def test_expected_units_exist() -> None:
    """deploy/ holds the agent's and the collector's units."""
    assert set(EXPECTED_UNITS) <= {u.name for u in UNITS}, f"deploy/ has {[u.name for u in UNITS]}"


@needs_systemd_analyze
@pytest.mark.parametrize("unit", UNITS, ids=[u.name for u in UNITS])
def test_systemd_analyze_verify(unit: Path, tmp_path: Path) -> None:
    """systemd-analyze verify reports no error and no warning for the unit."""
    assert verify(unit, tmp_path) == []


@needs_systemd_analyze
@pytest.mark.parametrize(
    ("line", "complaint"),
    [("ProtectSytem=strict", "Unknown key"), ("Type=notfy", "Failed to parse"), ("ExecStart=/nonexistent/x", "")],
    ids=["misspelt-key", "bad-value", "missing-program"],
)
def test_verify_catches_a_broken_unit(tmp_path: Path, line: str, complaint: str) -> None:
    """The verification above fails on a misspelt key, a bad value and a missing program (it is not vacuous)."""
    good = "[Unit]\nDescription=probe\n\n[Service]\nType=notify\nExecStart=/bin/true\n"
    (tmp_path / "good").mkdir()
    (tmp_path / "good" / "ldp-probe.service").write_text(good, encoding="utf-8")
    assert verify(tmp_path / "good" / "ldp-probe.service", tmp_path / "good") == []
    bad = tmp_path / "bad" / "ldp-probe.service"
    bad.parent.mkdir()
    bad.write_text(good + line + "\n", encoding="utf-8")
    problems = verify(bad, tmp_path / "bad")
    assert problems
    assert any(complaint in p for p in problems)


@needs_systemd_analyze
@needs_offline_security
@pytest.mark.parametrize("unit", UNITS, ids=[u.name for u in UNITS])
def test_offline_security_review_rates_the_unit_ok(unit: Path, tmp_path: Path) -> None:
    """systemd-analyze security --offline rates the unit's exposure at most 2.0 (OK)."""
    assert SYSTEMD_ANALYZE is not None
    copy = tmp_path / unit.name
    copy.write_text(localise_executables(unit.read_text(encoding="utf-8"))[0], encoding="utf-8")
    done = subprocess.run(
        [SYSTEMD_ANALYZE, "security", "--offline=true", f"--threshold={MAX_EXPOSURE}", "--no-pager", str(copy)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    summary = [ln for ln in done.stdout.splitlines() if "Overall exposure" in ln]
    assert done.returncode == 0, f"{summary}\n{done.stdout}{done.stderr}"


# --- required directives ------------------------------------------------------------------


def _one(service: dict[str, list[str]], key: str) -> str:
    values = service.get(key, [])
    return values[-1] if values else ""


def _yes(service: dict[str, list[str]], key: str) -> bool:
    return _one(service, key).lower() in {"yes", "true", "on", "1"}


def _seconds(value: str) -> float:
    """A systemd time span ("60", "1min", "30s", "2min 30s") in seconds; 0 for none."""
    units = {"": 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "ms": 1e-3, "h": 3600.0}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value):
        total += float(number) * units.get(unit, float("nan"))
    return total


def _credential_names(service: dict[str, list[str]]) -> set[str]:
    keys = ("LoadCredential", "LoadCredentialEncrypted", "SetCredential", "SetCredentialEncrypted")
    return {v.split(":", 1)[0] for k in keys for v in service.get(k, [])}


Check = Callable[[dict[str, list[str]]], bool]
REQUIREMENTS: dict[str, Check] = {
    "Type=notify": lambda s: _one(s, "Type") == "notify",
    "WatchdogSec>0": lambda s: _seconds(_one(s, "WatchdogSec")) > 0,
    "Restart=on-failure|always": lambda s: _one(s, "Restart") in {"on-failure", "always", "on-abnormal"},
    "DynamicUser or a non-root User": lambda s: _yes(s, "DynamicUser") or _one(s, "User") not in {"", "root", "0"},
    "StateDirectory": lambda s: bool(_one(s, "StateDirectory")),
    "LoadCredential": lambda s: bool(_credential_names(s)),
    "ProtectSystem=strict": lambda s: _one(s, "ProtectSystem") == "strict",
    "NoNewPrivileges=yes": lambda s: _yes(s, "NoNewPrivileges"),
    "ProtectHome": lambda s: _one(s, "ProtectHome") in {"yes", "true", "read-only", "tmpfs"},
    "PrivateTmp=yes": lambda s: _yes(s, "PrivateTmp"),
    "PrivateDevices=yes": lambda s: _yes(s, "PrivateDevices"),
    "ProtectKernelTunables=yes": lambda s: _yes(s, "ProtectKernelTunables"),
    "ProtectKernelModules=yes": lambda s: _yes(s, "ProtectKernelModules"),
    "ProtectKernelLogs=yes": lambda s: _yes(s, "ProtectKernelLogs"),
    "ProtectControlGroups=yes": lambda s: _yes(s, "ProtectControlGroups"),
    "ProtectClock=yes": lambda s: _yes(s, "ProtectClock"),
    "ProtectHostname=yes": lambda s: _yes(s, "ProtectHostname"),
    "RestrictNamespaces=yes": lambda s: _yes(s, "RestrictNamespaces"),
    "RestrictRealtime=yes": lambda s: _yes(s, "RestrictRealtime"),
    "RestrictSUIDSGID=yes": lambda s: _yes(s, "RestrictSUIDSGID"),
    "LockPersonality=yes": lambda s: _yes(s, "LockPersonality"),
    "SystemCallArchitectures=native": lambda s: _one(s, "SystemCallArchitectures") == "native",
    "SystemCallFilter=@system-service": lambda s: "@system-service" in " ".join(s.get("SystemCallFilter", [])),
    "CapabilityBoundingSet= (empty)": lambda s: "CapabilityBoundingSet" in s and s["CapabilityBoundingSet"] == [],
    "RestrictAddressFamilies (IP and Unix only)": lambda s: (
        bool(s.get("RestrictAddressFamilies"))
        and set(" ".join(s["RestrictAddressFamilies"]).split()) <= {"AF_UNIX", "AF_INET", "AF_INET6"}
    ),
    "UMask=0077": lambda s: _one(s, "UMask") in {"0077", "077"},
}


@pytest.mark.parametrize("requirement", list(REQUIREMENTS))
@pytest.mark.parametrize("unit", UNITS, ids=[u.name for u in UNITS])
def test_unit_has_required_directive(unit: Path, requirement: str) -> None:
    """The unit's [Service] section sets the directive the deployment depends on."""
    service = parse_unit(unit.read_text(encoding="utf-8")).get("Service", {})
    assert REQUIREMENTS[requirement](service), f"{unit.name}: [Service] lacks {requirement}"


def _credential_path_name(path: str, unit_name: str) -> str | None:
    """The credential name if ``path`` is this unit's credentials directory entry, else None."""
    prefix = f"/run/credentials/{unit_name}/"
    return path[len(prefix) :] if path.startswith(prefix) and "/" not in path[len(prefix) :] else None


@pytest.mark.parametrize(
    "unit_name",
    [
        "ldp-agent.service",
        "ldp-collector.service",
    ],
)
def test_broker_password_comes_from_a_credential(unit_name: str) -> None:
    """The example config reads the broker password from a credential the unit loads, not from /etc."""
    unit = DEPLOY / unit_name
    config_path, keys = EXAMPLE_CONFIGS[unit_name]
    if not unit.exists() or not config_path.exists():
        pytest.fail(f"{unit.name} or {config_path.name} is missing from deploy/")
    config = tomllib.loads(config_path.read_text(encoding="utf-8"))
    password_file = config[keys[0]][keys[1]]
    name = _credential_path_name(password_file, unit_name)
    assert name is not None, (
        f"{config_path.name}: {'.'.join(keys)} = {password_file!r} is not under /run/credentials/{unit_name}/"
    )
    service = parse_unit(unit.read_text(encoding="utf-8")).get("Service", {})
    assert name in _credential_names(service), f"{unit_name} loads no credential named {name!r}"


def test_agent_state_key_is_a_loaded_credential() -> None:
    """agent.example.toml's state.key_credential is a credential ldp-agent.service loads."""
    config = tomllib.loads((DEPLOY / "agent.example.toml").read_text(encoding="utf-8"))
    name = config["state"].get("key_credential")
    assert name, "agent.example.toml keeps the state key in a file, not a credential"
    service = parse_unit((DEPLOY / "ldp-agent.service").read_text(encoding="utf-8")).get("Service", {})
    assert name in _credential_names(service)


def test_parse_unit_follows_systemd_rules() -> None:
    """Continuation lines join, comments are skipped, repeated keys accumulate, and an empty value resets."""
    unit = parse_unit(
        "[Service]\n# comment\nSystemCallFilter=@system-service\nSystemCallFilter=~@privileged \\\n"
        "  @resources\nCapabilityBoundingSet=CAP_NET_RAW\nCapabilityBoundingSet=\n; other comment\n"
    )
    assert unit["Service"]["SystemCallFilter"] == ["@system-service", "~@privileged @resources"]
    assert unit["Service"]["CapabilityBoundingSet"] == []
    assert _seconds("1min 30s") == 90


def test_the_collector_may_hold_more_files_than_a_flood_of_slow_clients_takes() -> None:
    """LimitNOFILE= lifts the default soft limit of 1024, which a slow-client flood on the HTTP port exhausted."""
    service = parse_unit((DEPLOY / "ldp-collector.service").read_text(encoding="utf-8")).get("Service", {})
    (limit,) = service["LimitNOFILE"]
    assert int(limit) >= 16384
