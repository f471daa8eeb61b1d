"""The ``ldp-agent`` command: help, clear refusals, offline verbs, and the daemon under a fake systemd."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent import cli, verbs
from agent.cli import main
from agent.config import AgentConfig, load_config
from agent.daemon import load_registry, open_agent, run_daemon
from protocol.randomness import SeededRandom
from runtime.exit_status import ExitStatus
from tests.agent.conftest import KEY, REGISTRY
from tests.collector.test_tls import _make_pki
from tests.support.clocks import FakeClock
from tests.support.notify import NotifyListener

ROOT = Path(__file__).resolve().parents[2]


def _setup(tmp: Path, *, registry: str = REGISTRY, extra: str = "") -> Path:
    (tmp / "usecases.toml").write_text(registry)
    key = tmp / "state.key"
    key.write_bytes(KEY)
    key.chmod(0o600)
    cfg = tmp / "agent.toml"
    cfg.write_text(
        f"""
[broker]
host = "127.0.0.1"
port = 1
tls = false
[registry]
path = "usecases.toml"
[state]
directory = "state"
key_file = "state.key"
[api]
socket = "agent.sock"
{extra}
"""
    )
    return cfg


def _cli(cfg: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent", "--config", str(cfg), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
        check=False,
    )


def test_help_explains_the_verbs() -> None:
    """--help names every verb, the opt-in and the exit codes."""
    out = subprocess.run(
        [sys.executable, "-m", "agent", "--help"], capture_output=True, text=True, cwd=ROOT, check=True
    ).stdout
    for word in (
        "run",
        "record USE_CASE VALUE",
        "consent grant|revoke|show",
        "ledger",
        "status",
        "opt in",
        "exit status",
    ):
        assert word in out


def test_bad_config_names_file_and_field(tmp_path: Path) -> None:
    """A config mistake exits with status 2 and a message naming the file and the field."""
    cfg = _setup(tmp_path, extra="[schedule]\ninterval_hour = 6\n")
    r = _cli(cfg, "status")
    assert r.returncode == 2
    assert f"bad config {cfg}: schedule.interval_hour: unknown key" in r.stderr


def test_bad_registry_and_policy_refusal(tmp_path: Path) -> None:
    """An invalid registry and a registry over the local caps each stop the agent with their own message."""
    cfg = _setup(tmp_path, registry=REGISTRY.replace('period = "1d"', 'period = "2d"', 1))
    r = _cli(cfg, "run")
    assert r.returncode == 2
    assert "usecases.toml: use_cases.flag.period: must be" in r.stderr  # the registry file and the dotted field
    cfg = _setup(tmp_path, registry=REGISTRY, extra="[policy]\nmax_epsilon_report = 2.0\n")
    r = _cli(cfg, "run")
    assert r.returncode == 2
    assert "use case 'words' refused by local policy: epsilon = 4 per report exceeds the local cap 2" in r.stderr


def test_key_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    """A state key with a loose mode stops the agent and says how to fix it."""
    cfg = _setup(tmp_path)
    (tmp_path / "state.key").chmod(0o644)
    r = _cli(cfg, "consent", "grant")
    assert r.returncode == 6
    assert "chmod 600" in r.stderr


def test_offline_verbs(tmp_path: Path) -> None:
    """Without a daemon: consent, record (good and bad values), status, ledger and revoke work on the state."""
    cfg = _setup(tmp_path)
    r = _cli(cfg, "record", "flag", "1")
    assert r.returncode == 4
    assert "not opted in" in r.stderr
    assert _cli(cfg, "consent", "show").stdout.strip() == "consent: not granted"
    assert _cli(cfg, "consent", "grant").returncode == 0
    assert _cli(cfg, "record", "flag", "true").returncode == 0
    assert _cli(cfg, "record", "seconds", "120", "--key", "editor").returncode == 0
    r = _cli(cfg, "record", "seconds", "lots")
    assert r.returncode == 3
    assert "use case 'seconds' (one-bit-mean) counts numbers; got 'lots'" in r.stderr
    r = _cli(cfg, "record", "seconds", "1e30")
    assert r.returncode == 3
    assert "1e+30 is out of range [0, 2**53]" in r.stderr
    status = json.loads(_cli(cfg, "status", "--json").stdout)
    assert status["consent"] is True
    rows = {row["use_case"]: row for row in status["use_cases"]}
    assert rows["seconds"]["open_counters"] == 1
    assert rows["flag"]["pending_records"] == 1
    assert _cli(cfg, "ledger").stdout.strip() == "nothing has left this device"
    r = _cli(cfg, "consent", "revoke")
    assert r.returncode == 0
    assert "state files deleted" in r.stdout
    assert list((tmp_path / "state").glob("*.sealed")) == []


def test_daemon_under_systemd_serves_and_stops_cleanly(tmp_path: Path) -> None:
    """READY=1 and WATCHDOG=1 reach $NOTIFY_SOCKET, the socket API serves, SIGTERM exits 0 with STOPPING=1."""
    cfg = _setup(tmp_path)
    notify = NotifyListener(str(tmp_path / "notify"))  # read continuously, as systemd does
    env = dict(os.environ, NOTIFY_SOCKET=notify.address, WATCHDOG_USEC="200000")
    assert _cli(cfg, "consent", "grant").returncode == 0
    log = (tmp_path / "agent.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent", "--config", str(cfg), "run"], cwd=ROOT, env=env, stdout=log, stderr=log
    )
    try:
        alive = lambda: proc.poll() is None  # noqa: E731
        notify.wait_for("READY=1", timeout=120, alive=alive, what="the agent")
        notify.wait_for("WATCHDOG=1", timeout=120, alive=alive, what="the agent")
        no_notify = {k: v for k, v in env.items() if k != "NOTIFY_SOCKET"}
        assert _cli(cfg, "record", "words", "hello", env=no_notify).returncode == 0
        r = _cli(cfg, "record", "flag", "maybe", env=no_notify)
        assert r.returncode == 3
        assert "(rr) takes 0/1 or true/false" in r.stderr
        r = _cli(cfg, "status", "--json", env=no_notify)
        assert r.returncode == 0, r.stderr
        status = json.loads(r.stdout)
        assert status["pid"] == proc.pid  # answered by the daemon, over the socket
        assert status["next_cycle"] is not None
        assert 0 <= status["next_cycle"] % 21_600 < 1_800
        proc.send_signal(signal.SIGTERM)
        notify.wait_for("STOPPING=1", timeout=120, what="the agent")
        assert proc.wait(timeout=60) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
        log.close()
        notify.close()
    assert not (tmp_path / "agent.sock").exists()


class _Boom:
    """A transport with a bug: connecting raises something unexpected."""

    def connect(self) -> contextlib.AbstractAsyncContextManager[object]:
        raise RuntimeError("a bug in the transport")

    def connect_receipts(self) -> contextlib.AbstractAsyncContextManager[object]:
        raise RuntimeError("a bug in the transport")


def test_an_unexpected_failure_ends_the_daemon_non_zero(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An unexpected exception in a task stops every task and propagates; the CLI exits with status 1."""
    cfg = load_config(_setup(tmp_path))
    clock = FakeClock(1_700_000_000.0)
    agent = open_agent(cfg, load_registry(cfg), clock=clock, rng=SeededRandom(1))
    agent.grant_consent()
    agent.record("flag", 1)
    clock.set(clock.time() + 86_400.0)
    agent.collect()  # a report waits, so the publisher connects at start
    with pytest.raises(ExceptionGroup) as info:
        asyncio.run(asyncio.wait_for(run_daemon(cfg, clock=clock, transport=_Boom()), timeout=60))  # type: ignore[arg-type]
    assert info.group_contains(RuntimeError, match="a bug in the transport")

    async def failing(*args: object, **kwargs: object) -> None:
        raise ExceptionGroup("tasks failed", [RuntimeError("boom")])

    monkeypatch.setattr("agent.daemon.run_daemon", failing)
    assert cli.main(["--config", str(tmp_path / "agent.toml"), "run"]) == 1


def test_record_says_what_happened(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """record: kept for the period (counters); n of the limit; over the limit with how many; duplicates; clamping."""
    cfg = str(_setup(tmp_path))
    assert main(["--config", cfg, "consent", "grant"]) == 0
    capsys.readouterr()
    assert main(["--config", cfg, "record", "seconds", "120"]) == 0
    assert "seconds: recorded: added to this period's total" in capsys.readouterr().out
    # flag: daily_limit = 3; the fourth and fifth values are over it.
    for i in range(1, 6):
        assert main(["--config", cfg, "record", "flag", "1"]) == 0
        out = capsys.readouterr().out
        if i <= 3:
            assert f"flag: recorded: {i} of at most 3 values this period (the daily limit)" in out
        else:
            assert f"flag: recorded, over the daily limit: {i} values this period, at most 3 will be sent" in out
            assert f"{i - 3} dropped" in out
    assert main(["--config", cfg, "record", "procs", "bash"]) == 0
    assert "procs: recorded: 1 of at most 5" in capsys.readouterr().out
    assert main(["--config", cfg, "record", "procs", "bash"]) == 0
    assert "procs: not added: this string is already recorded this period" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("use_case", "value", "note"),
    [
        ("seconds", "99999", "99999 is above the range [0, 21600]: the period's total is clamped to 21600"),
        ("hist", "99999999", "99999999 is beyond the last bucket [20925, 21600): the period's total is counted in"),
    ],
)
def test_a_counter_value_beyond_its_range_is_clamped_and_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], use_case: str, value: str, note: str
) -> None:
    """One rule for every counter use case: recorded, the period's total clamped into the range, and record says so."""
    cfg = str(_setup(tmp_path))
    assert main(["--config", cfg, "consent", "grant"]) == 0
    assert main(["--config", cfg, "record", use_case, value]) == 0
    out = capsys.readouterr().out
    assert f"{use_case}: recorded: added to this period's total" in out
    assert note in out


@pytest.mark.parametrize(
    ("use_case", "value"), [("seconds", "-1"), ("hist", "-0.5"), ("hist", "1e300"), ("seconds", "inf")]
)
def test_a_counter_value_out_of_range_is_refused_with_the_range(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], use_case: str, value: str
) -> None:
    """Negative, infinite or beyond-2**53 increments: exit 3 and "out of range [0, 2**53]"."""
    cfg = str(_setup(tmp_path))
    assert main(["--config", cfg, "consent", "grant"]) == 0
    assert main(["--config", cfg, "record", use_case, value]) == ExitStatus.REFUSED
    assert "is out of range [0, 2**53]" in capsys.readouterr().err


def _with_files(tmp_path: Path) -> tuple[Path, dict[str, Path]]:
    ca, cert, key = _make_pki(tmp_path / "pki")
    password = tmp_path / "password"
    password.write_text("s3cret\n", encoding="utf-8")
    password.chmod(0o600)  # a password file is readable by its owner only
    cfg = _setup(tmp_path)
    text = cfg.read_text().replace(
        "tls = false\n",
        f'tls = true\nca_file = "{ca}"\ncert_file = "{cert}"\nkey_file = "{key}"\n'
        f'username = "device"\npassword_file = "{password}"\n',
    )
    cfg.write_text(text)
    files = {
        "broker.ca_file": ca,
        "broker.cert_file": cert,
        "broker.key_file": key,
        "broker.password_file": password,
        "registry.path": tmp_path / "usecases.toml",
        "state.key_file": tmp_path / "state.key",
    }
    return cfg, files


@pytest.mark.parametrize(
    "field",
    [
        "broker.ca_file",
        "broker.cert_file",
        "broker.key_file",
        "broker.password_file",
        "registry.path",
        "state.key_file",
    ],
)
def test_check_config_names_each_missing_file_and_its_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str
) -> None:
    """ldp-agent check-config: ok with every file; with each missing in turn, exit 2 naming the field and the file."""
    cfg, files = _with_files(tmp_path)
    assert main(["--config", str(cfg), "check-config"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert all(f"{name}: {path}" in out for name, path in files.items())
    files[field].unlink()
    assert main(["--config", str(cfg), "check-config"]) == ExitStatus.CONFIG
    err = capsys.readouterr().err
    assert f"{cfg}: {field}: " in err
    assert str(files[field]) in err
    assert "No such file or directory" in err
    assert main(["--config", str(cfg), "run"]) == ExitStatus.CONFIG  # the same checks before it starts
    assert f"{field}: " in capsys.readouterr().err


def test_version_and_a_closed_pipe(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--version prints the version; `status | head -1` with the reader gone ends quietly with status 0."""
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("ldp-agent 0.")
    cfg = _setup(tmp_path)
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "agent", "--config", str(cfg), "status"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)
    assert done.stderr == b""
    assert done.returncode == 0


def test_a_ca_file_gone_at_run_time_ends_the_daemon_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CA file deleted after start-up: the next connection ends `run` with status 2 naming the field and file."""
    cfg_path, files = _with_files(tmp_path)
    cfg = load_config(cfg_path)
    clock = FakeClock(1_700_000_000.0)
    agent = open_agent(cfg, load_registry(cfg), clock=clock, rng=SeededRandom(1))
    agent.grant_consent()
    agent.record("flag", 1)
    clock.set(clock.time() + 86_400.0)
    agent.collect()  # a report waits, so the publisher connects at start
    real = run_daemon

    async def after_start_up(config: AgentConfig, **kwargs: object) -> None:
        files["broker.ca_file"].unlink()  # gone after check-config passed at start-up
        await real(config, clock=clock)

    monkeypatch.setattr("agent.daemon.run_daemon", after_start_up)
    assert cli.main(["--config", str(cfg_path), "run"]) == ExitStatus.CONFIG
    err = capsys.readouterr().err
    assert f"{cfg_path}: broker.ca_file: cannot read {files['broker.ca_file']}: No such file or directory" in err


def test_a_wrong_state_key_says_the_key_does_not_open_the_state(tmp_path: Path) -> None:
    """With another key, record names the state directory and the key, not a missing opt-in."""
    cfg = _setup(tmp_path)
    assert _cli(cfg, "consent", "grant").returncode == 0
    assert _cli(cfg, "record", "flag", "true").returncode == 0
    (tmp_path / "state.key").write_bytes(bytes(32))
    r = _cli(cfg, "record", "flag", "true")
    # The state is unreadable (6), not "not opted in" (4): runtime/exit_status.py.
    assert r.returncode == cli.EXIT_CODES["state-unreadable"] == ExitStatus.STATE_UNREADABLE
    assert "the state key does not open the state in" in r.stderr
    assert str(tmp_path / "state") in r.stderr
    assert "has not opted in" not in r.stderr
    assert "Traceback" not in r.stderr


def test_a_wrong_state_key_makes_status_and_check_config_fail_with_status_6(tmp_path: Path) -> None:
    """status does not show "consent: not granted", and check-config does not say "ok"."""
    cfg = _setup(tmp_path)
    assert _cli(cfg, "consent", "grant").returncode == 0
    ok = _cli(cfg, "check-config")
    assert ok.returncode == 0, ok.stderr
    assert "the state key opens its consent record" in ok.stdout
    (tmp_path / "state.key").write_bytes(bytes(32))
    for args in (("status",), ("status", "--json"), ("check-config",)):
        r = _cli(cfg, *args)
        assert r.returncode == ExitStatus.STATE_UNREADABLE, (args, r.stdout, r.stderr)
        assert "does not open the state in" in r.stderr, args
        assert str(tmp_path / "state") in r.stderr, args
        assert "not granted" not in r.stdout, args
        assert "ok" not in r.stdout.split(), args
        assert "Traceback" not in r.stderr, args


def test_an_unknown_use_case_is_a_wrong_command_line_and_the_known_ones_are_listed(tmp_path: Path) -> None:
    """Exit status 2, as ldp-collector estimate gives for the same mistake."""
    cfg = _setup(tmp_path)
    assert _cli(cfg, "consent", "grant").returncode == 0
    r = _cli(cfg, "record", "nope", "1")
    assert r.returncode == ExitStatus.CONFIG, r.stderr
    assert "unknown use case 'nope'; the registry has: " in r.stderr
    for name in ("flag", "seconds"):
        assert name in r.stderr


def test_status_text_shows_what_was_recorded_and_not_sent_yet(tmp_path: Path) -> None:
    """The text says what --json says as pending_records and open_counters."""
    cfg = _setup(tmp_path)
    assert _cli(cfg, "consent", "grant").returncode == 0
    assert _cli(cfg, "record", "flag", "true").returncode == 0
    assert _cli(cfg, "record", "seconds", "120", "--key", "editor").returncode == 0
    rows = {row["use_case"]: row for row in json.loads(_cli(cfg, "status", "--json").stdout)["use_cases"]}
    assert rows["flag"]["pending_records"] == 1
    assert rows["seconds"]["open_counters"] == 1
    text = _cli(cfg, "status").stdout.splitlines()
    lines = {line.split()[0].split("@")[0]: line for line in text if line[:2] == "  "}
    assert "; recorded, not sent yet: 1 record (sent when the period ends)" in lines["flag"]
    assert "; recorded, not sent yet: 1 running total (sent when the period ends)" in lines["seconds"]


def test_a_full_disk_names_the_state_directory(tmp_path: Path) -> None:
    """With the state on a full tmpfs, record fails with a message naming the directory and the cause."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    cfg = _setup(tmp_path)
    state = tmp_path / "state"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(state)], check=True)
    try:
        assert _cli(cfg, "consent", "grant").returncode == 0
        filler = state / "filler"
        with filler.open("wb", buffering=0) as f, contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 4096)
        r = _cli(cfg, "record", "flag", "true")
        assert r.returncode == cli.EXIT_CODES["error"]
        assert "no space left on the device" in r.stderr
        assert f"state directory {state}" in r.stderr
        assert "Traceback" not in r.stderr
        filler.unlink()
        assert _cli(cfg, "record", "flag", "true").returncode == 0  # space freed: it works again
    finally:
        subprocess.run(["umount", "-l", str(state)], check=False)


def test_the_daemon_keeps_running_on_a_full_disk_refuses_values_and_resumes_by_itself(tmp_path: Path) -> None:
    """`run` with the state on a full tmpfs stays up: status says recording is paused, record is refused
    with status 1 naming the cause, and once space returns both work again without a restart."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    cfg = _setup(tmp_path)
    state = tmp_path / "state"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(state)], check=True)
    daemon = None
    log = (tmp_path / "agent.log").open("w")
    try:
        assert _cli(cfg, "consent", "grant").returncode == 0
        assert _cli(cfg, "record", "flag", "true").returncode == 0  # acknowledged before the disk fills
        filler = state / "filler"
        with filler.open("wb", buffering=0) as f, contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 4096)
        daemon = subprocess.Popen(
            [sys.executable, "-m", "tests.support.agent_launcher", "--rate=432000", "--", "--config", str(cfg), "run"],
            stdout=subprocess.DEVNULL,
            stderr=log,  # a file: a pipe nobody reads would fill and block the daemon's logging
            cwd=ROOT,
        )
        deadline = time.monotonic() + 60
        status: dict[str, object] = {}
        while time.monotonic() < deadline and daemon.poll() is None:
            r = _cli(cfg, "status", "--json")
            status = json.loads(r.stdout) if r.returncode == 0 else {}
            if status.get("pid") == daemon.pid and str(status.get("recording")).startswith("paused since"):
                break
            time.sleep(0.1)
        assert daemon.poll() is None, "the daemon ended on a full disk"
        assert str(status.get("recording", "")).startswith("paused since"), status
        assert "no space left on the device" in str(status["recording"])
        r = _cli(cfg, "record", "flag", "true")
        assert r.returncode == cli.EXIT_CODES["state-unwritable"] == ExitStatus.ERROR
        assert "no space left on the device" in r.stderr
        assert "Recording is paused" in r.stderr
        assert daemon.poll() is None
        filler.unlink()
        assert _cli(cfg, "record", "flag", "false").returncode == 0  # space returned: it records again
        assert json.loads(_cli(cfg, "status", "--json").stdout)["recording"] == "ok"
        assert daemon.poll() is None
    finally:
        if daemon is not None and daemon.poll() is None:
            daemon.terminate()
            daemon.wait(timeout=60)
        log.close()
        subprocess.run(["umount", "-l", str(state)], check=False)


def test_the_ledger_shows_each_reports_state(capsys: pytest.CaptureFixture[str]) -> None:
    """`ldp-agent ledger` tells a report only sent from one counted or refused (and reads old entries as sent)."""
    base = {"sent": 1_700_000_000.0, "use_case": "flag", "period": 3, "records": [1], "epsilon": 1.0}
    base |= {"epsilon_today": 1.0, "epsilon_total": 2.0}
    entries = [
        base | {"status": "sent"},
        base | {"status": "counted"},
        base | {"status": "refused: period-expired"},
        dict(base),  # written before receipts
    ]
    notices = [{"at": 1_700_000_000.0, "use_case": "flag", "text": "removed from the registry: its state was wiped"}]
    verbs._print_ledger(entries, notices)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if not ln.startswith("    ")]
    assert lines[0].endswith("flag  registry change: removed from the registry: its state was wiped")
    assert [ln.rsplit("  ", 1)[1] for ln in lines[1:]] == ["sent", "counted", "refused: period-expired", "sent"]


def test_the_agent_has_no_clock_switch_but_the_tests_launcher_injects_one(tmp_path: Path) -> None:
    """The environment cannot move the agent's clock (the old LDP_AGENT_TEST_CLOCK is nothing to it);
    the tests' launcher can, through the library entry point ``agent.cli.main(argv, clock=...)``."""
    cfg = _setup(tmp_path)
    before = time.time()
    ten_years = 10 * 365 * 86_400
    env = dict(os.environ, LDP_AGENT_TEST_CLOCK=f"start={before + ten_years},anchor={before},rate=1000")
    assert _cli(cfg, "consent", "grant", env=env).returncode == 0
    granted = json.loads(_cli(cfg, "status", "--json", env=env).stdout)["consent_granted_at"]
    assert before <= granted <= time.time()  # the host's clock, not ten years ahead
    assert _cli(cfg, "consent", "revoke").returncode == 0
    launcher = [sys.executable, "-m", "tests.support.agent_launcher", f"--start={before + ten_years}"]
    launched = subprocess.run(
        [*launcher, f"--anchor={before}", "--rate=1", "--", "--config", str(cfg), "consent", "grant"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert launched.returncode == 0, launched.stderr
    granted = json.loads(_cli(cfg, "status", "--json").stdout)["consent_granted_at"]
    assert granted >= before + ten_years
