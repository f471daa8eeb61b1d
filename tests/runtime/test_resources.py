"""A resource that ran out is told apart from a bad setting, counted, and logged once per run of failures."""

from __future__ import annotations

import errno
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.resources import ResourceErrors, ResourceShortageError, resource_shortage
from tests.collector.test_tls import _make_pki

ROOT = Path(__file__).resolve().parents[2]

# Run in a child whose open-file limit is low: every descriptor is taken, then the CA file, the
# password file, a missing file and a socket are opened; then descriptors are given back.
_FULL_TABLE = """
import json, os, resource, socket, sys
from pathlib import Path
from runtime.errors import SettingFileError
from runtime.resources import resource_shortage
from runtime.secret_files import read_password
from runtime.tls import client_context

ca, password = Path(sys.argv[1]), Path(sys.argv[2])
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
held = []
try:
    while True:
        held.append(os.open("/dev/null", os.O_RDONLY))
except OSError as e:
    assert resource_shortage(e) == "EMFILE", e

def attempt(action):
    try:
        action()
    except (SettingFileError, OSError) as e:
        return [type(e).__name__, resource_shortage(e), str(e)]
    return ["ok", None, ""]

out = {
    "ca": attempt(lambda: client_context(ca_file=ca)),
    "password": attempt(lambda: read_password(password, setting="password_file")),
    "socket": attempt(lambda: socket.socket().close()),
    "missing": attempt(lambda: client_context(ca_file=ca.with_name("missing.pem"))),
}
for fd in held[-8:]:
    os.close(fd)
out["freed"] = attempt(lambda: client_context(ca_file=ca))
out["missing, freed"] = attempt(lambda: client_context(ca_file=ca.with_name("missing.pem")))
print(json.dumps(out))
"""


def test_a_full_file_table_is_a_shortage_never_a_bad_setting(tmp_path: Path) -> None:
    """With every descriptor taken, the CA, a password and a socket fail as EMFILE shortages; freed, the CA loads."""
    ca, _, _ = _make_pki(tmp_path)
    password = tmp_path / "password"
    password.write_text("s3cret\n", encoding="utf-8")
    password.chmod(0o600)
    done = subprocess.run(
        [sys.executable, "-c", _FULL_TABLE, str(ca), str(password)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    for what in ("ca", "password"):
        kind, shortage, message = out[what]
        assert (kind, shortage) == ("ResourceShortageError", "EMFILE"), out[what]
        assert "Too many open files" in message
    assert out["ca"][2].startswith(f"[Errno {errno.EMFILE}] reading ca_file {ca}")
    assert out["socket"][:2] == ["OSError", "EMFILE"]
    # The kernel takes a descriptor before it looks the path up: with the table full a missing
    # file fails as a shortage too (retried), and is the operator's to fix once one is free.
    assert out["missing"][:2] == ["ResourceShortageError", "EMFILE"]
    assert out["freed"] == ["ok", None, ""]
    assert out["missing, freed"][:2] == ["SettingFileError", None]
    assert "No such file or directory" in out["missing, freed"][2]


def test_a_shortage_is_found_behind_a_library_error_raised_from_none() -> None:
    """An OSError(EMFILE) kept only as the context of another error is still a shortage; others are not."""

    def wrapping() -> None:
        try:
            raise OSError(errno.EMFILE, "Too many open files")
        except OSError as e:
            raise RuntimeError(str(e)) from None

    with pytest.raises(RuntimeError) as wrapped:
        wrapping()
    assert resource_shortage(wrapped.value) == "EMFILE"
    assert resource_shortage(OSError(errno.ENOENT, "No such file or directory")) is None
    assert resource_shortage(ResourceShortageError("x", OSError(errno.ENFILE, "table full"))) == "ENFILE"
    assert resource_shortage(ValueError("no")) is None


def test_each_run_of_shortages_is_counted_and_logged_once_with_its_end(caplog: pytest.LogCaptureFixture) -> None:
    """Five failures: five counted, one line; the success after them: one line; other errors: not counted."""
    errors = ResourceErrors(logging.getLogger("test.resources"))
    with caplog.at_level(logging.WARNING, logger="test.resources"):
        for _ in range(5):
            assert errors.failed("mqtt-connect", OSError(errno.EMFILE, "Too many open files"))
        assert not errors.failed("mqtt-connect", ConnectionRefusedError(errno.ECONNREFUSED, "refused"))
        assert errors.failing == {"mqtt-connect"}
        errors.succeeded("mqtt-connect")
        errors.succeeded("mqtt-connect")
        errors.shortage("http-accept", "EMFILE")
    assert errors.counts == {("mqtt-connect", "EMFILE"): 5, ("http-accept", "EMFILE"): 1}
    assert errors.failing == frozenset()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("mqtt-connect: a system resource ran out (EMFILE: ")
    assert lines[1] == "mqtt-connect works again after 5 failure(s) for want of a system resource"
