"""The README's first command, ``deploy/run-demo.sh``, end to end at a small size.

Once as the README runs it (one collector on a SQLite file) and once as "Outgrowing one
machine" shows a group on one machine (``--collectors 2 --postgres``): a broker, the
collectors and a simulated fleet, every estimate within 5 standard errors of the truth
(the script's exit status is ldp-fleet's, which says so), and the working files removed.
A fleet too small to release anything says there is nothing to compare, not that an error is
beyond the tolerance; Ctrl-C while the demo serves stops it calmly and removes its files.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}


@pytest.mark.parametrize(
    "options",
    [
        pytest.param([], id="one-collector-sqlite"),
        pytest.param(["--collectors", "2", "--postgres"], id="group-postgres"),
        pytest.param(["--brokers", "2"], id="two-brokers"),
        pytest.param(["--scale"], id="scale-mode"),
    ],
)
def test_the_demo_runs_and_every_estimate_is_within_5_se(tmp_path: Path, options: list[str]) -> None:
    out = tmp_path / "results"
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "TMPDIR": str(tmp_path)}
    run = subprocess.run(
        ["deploy/run-demo.sh", "--devices", "150", "--days", "1", "--no-wait", "--out", str(out), *options],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,  # a hang guard only
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "every error within 5 SE" in run.stdout
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert results
    if "--collectors" in options:
        assert "Every collector of the group serves the same estimates" in run.stdout
        assert "starting PostgreSQL" in run.stderr
    if "--scale" in options:
        assert "in scale mode (devices simulated in bulk" in run.stderr
        assert results["mode"].startswith("scale mode")
    if "--brokers" in options:
        # Each device publishes through its own primary: both brokers carried part of the fleet.
        line = re.search(r"Reports received per broker: (.*)", run.stdout)
        assert line is not None, run.stdout[-2000:]
        counts = [int(n.replace(",", "")) for n in re.findall(r"127\.0\.0\.1:\d+ ([\d,]+)", line.group(1))]
        assert len(counts) == 2, line.group(0)
        assert all(n > 0 for n in counts), line.group(0)
        counted = sum(said.get("counted", 0) for said in results["receipts"]["by_definition"].values())
        assert sum(counts) == counted  # every report received once, through one broker or the other
    # Only the results stay: the broker's, collectors' and database's files are removed.
    leftovers = [p.name for p in tmp_path.glob("ldp-demo.*/*")]
    assert leftovers == [], leftovers


def test_the_demo_with_a_registry_change_counts_every_report_under_its_own_definition(tmp_path: Path) -> None:
    """`run-demo.sh --registry-change`: half the fleet moves mid-run; exit 0 means counted and within 5 SE."""
    out = tmp_path / "results"
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "TMPDIR": str(tmp_path)}
    run = subprocess.run(
        ["deploy/run-demo.sh", "--registry-change", "--devices", "100", "--days", "3", "--no-wait", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,  # a hang guard only
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "registry change: half the fleet moves to deploy/fleet.usecases.v2.toml on day 2" in run.stderr
    assert "ldp-fleet: receipts: " in run.stderr
    assert "safari-energy-domains: " in run.stderr
    assert "refused: retired" in run.stderr
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert results["receipts"]["missing"] == 0
    definitions = {info["definition"] for info in results["use_cases"].values()}
    assert len([d for d in definitions if d.startswith("emoji@")]) == 2
    assert any(d.startswith("crash-reported@") for d in definitions)
    assert "(current definition, cms" in run.stdout
    assert "(earlier definition, cms" in run.stdout


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--scale", "--registry-change", "--days", "3"], "--registry-change needs complete agents"),
        (["--scale", "--workers", "2"], "--workers is for complete agents"),
    ],
)
def test_the_demo_refuses_what_the_scale_mode_cannot_do(tmp_path: Path, options: list[str], said: str) -> None:
    run = subprocess.run(
        ["deploy/run-demo.sh", "--no-wait", *options],
        cwd=ROOT,
        env={**ENV, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,  # a hang guard only
        check=False,
    )
    assert run.returncode == 2, run.stderr
    assert said in run.stderr


def test_the_demo_refuses_a_registry_change_shorter_than_three_days(tmp_path: Path) -> None:
    """Before, during and after the change take three days: fewer is a usage error that says so."""
    run = subprocess.run(
        ["deploy/run-demo.sh", "--registry-change", "--days", "2", "--no-wait"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 2
    assert "--registry-change needs --days 3 or more" in run.stderr


def test_a_demo_too_small_to_release_anything_says_so_and_claims_no_error(tmp_path: Path) -> None:
    """20 devices for a day never reach the release rule's 50 reports: nothing was compared, so
    nothing was beyond the tolerance; the run says so and exits 7 ("nothing to show yet"), not 9."""
    run = subprocess.run(
        ["deploy/run-demo.sh", "--devices", "20", "--days", "1", "--no-wait", "--out", str(tmp_path / "results")],
        cwd=ROOT,
        env={**ENV, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=600,  # a hang guard only
        check=False,
    )
    assert run.returncode == 7, run.stdout[-3000:] + run.stderr[-3000:]
    assert (
        "ldp-fleet: nothing to compare: with 20 devices nothing reaches the release threshold; try --devices 1000"
        in run.stdout
    )
    assert "beyond" not in run.stdout


def _wait_for_line(path: Path, pattern: str, proc: subprocess.Popen[bytes], deadline: float) -> re.Match[str]:
    """Poll ``path`` until a line matches ``pattern`` (``proc`` must still run; the deadline is a hang guard)."""
    while True:
        text = path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
        found = re.search(pattern, text, flags=re.MULTILINE)
        if found:
            return found
        assert proc.poll() is None, f"the demo ended with {proc.returncode} before {pattern!r}:\n{text[-3000:]}"
        assert time.monotonic() < deadline, f"no {pattern!r} yet:\n{text[-3000:]}"
        time.sleep(0.2)


def _processes_naming(path: str) -> list[str]:
    """The command lines of running processes that name ``path`` (the demo's broker, collectors, database)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if path in cmdline:
            found.append(cmdline)
    return found


# Started from a terminal, the demo has SIGINT's default disposition; started in the background
# by a non-interactive shell (`run-demo.sh &`), SIGINT is ignored on entry and bash cannot trap
# it, while the collectors, which set their own handler, still stop on it.
FROM_A_TERMINAL: list[str] = []
FROM_A_BACKGROUND_SHELL = ["bash", "-c", 'trap "" INT; exec "$0" "$@"']


@pytest.mark.parametrize("launcher", [FROM_A_TERMINAL, FROM_A_BACKGROUND_SHELL], ids=["terminal", "background"])
@pytest.mark.parametrize(
    "options",
    [
        pytest.param([], id="one-collector-sqlite"),
        pytest.param(["--collectors", "3", "--postgres"], id="group-postgres"),
    ],
)
def test_ctrl_c_while_the_demo_serves_stops_it_calmly_and_removes_its_files(
    tmp_path: Path, options: list[str], launcher: list[str]
) -> None:
    """SIGINT to the demo's process group, as Ctrl-C sends it: exit 130, a calm last line, no
    working directory (PKI, secrets, broker, collectors, PostgreSQL data) and no process left."""
    stdout, stderr = tmp_path / "stdout", tmp_path / "stderr"
    demo = ["deploy/run-demo.sh", "--devices", "100", "--days", "1", "--out", str(tmp_path / "results"), *options]
    with stdout.open("wb") as out, stderr.open("wb") as err:
        proc = subprocess.Popen(
            [*launcher, *demo],
            cwd=ROOT,
            env={**ENV, "TMPDIR": str(tmp_path)},
            stdout=out,
            stderr=err,
            start_new_session=True,  # its own process group, as a terminal gives a command
        )
    try:
        deadline = time.monotonic() + 600  # a hang guard only
        work = Path(_wait_for_line(stderr, r"making a test CA and broker users in (\S+)$", proc, deadline)[1])
        _wait_for_line(stdout, r"^Keeping the broker and the collector up until Ctrl-C\.$", proc, deadline)
        pg_dirs = re.findall(r"on a socket in (\S+)$", stderr.read_text(encoding="utf-8"), flags=re.MULTILINE)
        assert work.is_dir()
        os.killpg(proc.pid, signal.SIGINT)
        status = proc.wait(timeout=300)  # a hang guard only
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    errors = stderr.read_text(encoding="utf-8")
    assert status in (130, 0), errors[-3000:]
    assert "a collector stopped" not in errors
    assert errors.rstrip().endswith("run-demo: stopped; the broker and the collectors are down and their files removed")
    assert not work.exists(), sorted(p.name for p in work.iterdir())
    assert ("--postgres" in options) == bool(pg_dirs)
    for pg_dir in pg_dirs:
        assert not Path(pg_dir).exists()
    assert _processes_naming(str(work)) == []
    assert all(_processes_naming(pg_dir) == [] for pg_dir in pg_dirs)
    assert (tmp_path / "results" / "results.json").is_file()  # the results stay
