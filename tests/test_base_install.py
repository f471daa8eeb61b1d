"""The base install is a device's: ``pip install ldp-telemetry`` (no extras) in a fresh virtual
environment runs the agent and imports none of the server's, simulator's or tests' libraries."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SERVER_ONLY = ["scipy", "aiohttp", "starlette", "uvicorn", "prometheus_client", "psycopg", "matplotlib", "sklearn"]

_PROBE = f"""
import json, sys
import agent.daemon, agent.cli, agent.core, runtime.sd_notify
print(json.dumps(sorted(m for m in {SERVER_ONLY!r} if m in sys.modules)))
"""


def test_the_base_install_runs_the_agent_without_server_libraries(tmp_path: Path) -> None:
    """A fresh venv with the base install: ``ldp-agent --help`` works; no server-only module is loaded."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    # A copy of the source, so the build leaves nothing in the checkout (setuptools writes build/).
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    for package in ("protocol", "runtime", "agent", "collector"):
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    # A non-editable install, as a device would get it; dependencies from the index.
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(source)],
        check=True,
        timeout=900,
        cwd=tmp_path,
    )
    installed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=json"], check=True, capture_output=True, text=True, timeout=120
    )
    names = {p["name"].lower().replace("_", "-") for p in json.loads(installed.stdout)}
    server_only = {"scipy", "psycopg", "psycopg-binary", "aiohttp", "prometheus-client", "matplotlib", "pytest"}
    assert not names & server_only, sorted(names)
    helped = subprocess.run(
        [str(env_dir / "bin" / "ldp-agent"), "--help"], check=True, capture_output=True, text=True, timeout=120
    )
    assert "usage" in helped.stdout.lower()
    # The collector's command on a device's install names the extra it needs, without a traceback.
    refused = subprocess.run(
        [str(env_dir / "bin" / "ldp-collector"), "--help"], check=False, capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 2, refused
    assert "pip install 'ldp-telemetry[collector]'" in refused.stderr
    assert "Traceback" not in refused.stderr
    # Run from a directory outside the checkout, so the installed packages are imported.
    probe = subprocess.run(
        [str(python), "-c", _PROBE], check=True, capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert json.loads(probe.stdout) == []
    assert sys.executable != str(python)
