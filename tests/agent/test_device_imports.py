"""What a device's agent loads: no numpy, and nothing heavy it does not use.

A fresh interpreter imports the daemon and the command line as ``ldp-agent`` does; numpy (the
server half of the mechanisms, docs/deploy.md) and ``cryptography.x509`` (a client certificate's
check, runtime/tls.py) must stay out, and the commands other than ``run`` load no asyncio.
The daemon's own run, with a value recorded for every use case and a collection cycle, is
checked for numpy by ``benchmarks/bench_agent.py`` (``daemon_never_loaded_numpy``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent.aes_gcm import libcrypto_loaded

ROOT = Path(__file__).resolve().parents[2]


def _loaded_after(imports: str, watched: list[str]) -> list[str]:
    """The ``watched`` modules in ``sys.modules`` of a fresh interpreter after ``imports``."""
    script = f"{imports}\nimport json, sys\nprint(json.dumps(sorted(m for m in {watched!r} if m in sys.modules)))\n"
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True, timeout=120
    )
    loaded: list[str] = json.loads(done.stdout)
    return loaded


def test_the_daemon_and_the_command_line_import_no_numpy_and_no_x509() -> None:
    watched = ["numpy", "cryptography.x509", "apscheduler"]
    assert _loaded_after("import agent.daemon, agent.cli, agent.verbs", watched) == []


def test_the_commands_load_no_asyncio() -> None:
    """``ldp-agent --help``, ``status`` and the other verbs start without the event loop's modules."""
    assert _loaded_after("import agent.cli, agent.verbs", ["asyncio", "ssl", "numpy"]) == []


def test_the_usage_text_loads_none_of_the_agent() -> None:
    """``ldp-agent --help`` (and a wrong command line) is answered by the parser alone: the verbs,
    the config and the state's modules are loaded once the arguments are parsed (agent/cli.py)."""
    heavy = ["agent.verbs", "agent.config", "agent.status", "protocol.registry", "logging", "socket"]
    assert _loaded_after("import agent.cli; agent.cli._parser()", heavy) == []


def test_the_commands_without_a_daemon_load_no_asyncio() -> None:
    """Without a daemon, ``status`` and the other verbs open the state themselves
    (agent/opening.py, agent/api.py's dispatcher), still without the event loop, and no command
    looks its version up unless ``--version`` asks (docs/deploy.md, "The device's footprint")."""
    imports = "import agent.cli, agent.verbs, agent.api, agent.opening; agent.cli._parser()"
    assert _loaded_after(imports, ["asyncio", "ssl", "importlib.metadata", "numpy"]) == []


def test_the_sealed_state_needs_no_cryptography_package() -> None:
    """Sealing and opening go through the system's libcrypto (agent/aes_gcm.py), so the daemon
    maps no second OpenSSL; the package is loaded only where no libcrypto can be."""
    if not libcrypto_loaded():
        pytest.skip("no system libcrypto 3 or 1.1 to load: the cryptography package seals")
    code = "import agent.daemon, agent.cli\nfrom agent.sealed import Sealer\ns = Sealer(bytes(32))\n"
    code += "assert s.open('agent', 1, s.seal('agent', 1, {})) == {}"
    assert _loaded_after(code, ["cryptography", "agent.aes_gcm"]) == ["agent.aes_gcm"]


def test_the_probe_sees_numpy_once_it_is_loaded() -> None:
    """The check can fail: the server half of a mechanism loads numpy."""
    assert _loaded_after("import protocol.server.cms", ["numpy"]) == ["numpy"]


def test_the_commands_that_write_state_load_no_numpy(tmp_path: Path) -> None:
    """Granting consent, recording and re-enrolling a whole state directory run on a device
    without numpy: their random ids come from the pure draws (protocol/randomness.py)."""
    key = tmp_path / "key"
    key.write_bytes(bytes(range(32)))
    key.chmod(0o600)
    config = tmp_path / "agent.toml"
    config.write_text(
        f'[broker]\nhost = "127.0.0.1"\nport = 1\n[registry]\npath = "{ROOT / "deploy" / "usecases.example.toml"}"\n'
        f'[state]\ndirectory = "{tmp_path / "state"}"\nkey_file = "{key}"\n[api]\nsocket = "{tmp_path / "a.sock"}"\n',
        encoding="utf-8",
    )

    def verb(*words: str) -> list[str]:
        argv = ["--config", str(config), *words]
        call = (
            "import contextlib, io, agent.cli\nwith contextlib.redirect_stdout(io.StringIO()):\n"
            f"    rc = agent.cli.main({argv!r})\nassert rc == 0, rc"
        )
        return _loaded_after(call, ["numpy"])

    assert verb("consent", "grant") == []
    assert verb("record", "dark-mode-enabled", "1") == []
    for path in [tmp_path / "state" / "manifest.sealed", *(tmp_path / "state").glob("uc-*.sealed")]:
        path.unlink()
    assert verb("re-enrol") == []
