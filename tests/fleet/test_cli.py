"""ldp-fleet's command line: help, and input mistakes refused before anything connects."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.errors import TransportError
from fleet.arguments import build_parser
from fleet.cli import main
from fleet.runner import shard_ranges
from fleet.tally import ShardResult, Tally
from runtime.exit_status import ExitStatus

REGISTRY = Path(__file__).resolve().parents[2] / "deploy" / "fleet.usecases.toml"


def test_help_describes_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """--help exits 0 and names the flags, the generators and the population formats."""
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    for needle in (
        "--devices",
        "--days",
        "--registry",
        "--use-case",
        "--population",
        "--seed",
        "--json",
        "--output",
        "--no-tls",
        "--plots",
        "--collector-url",
        "value,weight",
        "device,period,value",
        "exp-strings",
        "drift",
    ):
        assert needle in text


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--use-case", "nope"], "'nope' is not in"),
        (["--generator", "emoji=laplace"], "unknown generator"),
        (["--generator", "emoji=normal:mean=1,sd=1"], "records strings"),
        (["--generator", "nope=zipf"], "'nope' is not a simulated use case"),
        (["--population", "x.csv"], "write USE_CASE="),
        (["--use-case", "emoji", "--population", "/nonexistent/x.csv"], "cannot read population"),
        (["--devices", "0"], "at least 1"),
        (["--broker", "localhost"], "HOST:PORT"),
        (["--start", "yesterday"], "YYYY-MM-DD"),
        (["--registry", "/nonexistent/registry.toml"], "--registry: cannot read /nonexistent/registry.toml"),
    ],
)
def test_input_mistakes_exit_2_with_a_reason(args: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A mistake in the inputs exits with status 2 and says what is wrong."""
    status = main(["--registry", str(REGISTRY), "--quiet", *args])
    assert status == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("tolerance", ["-1", "0", "nan", "inf", "five"])
def test_a_tolerance_that_is_not_a_positive_number_is_refused(
    tolerance: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """No error is within a negative tolerance: such a run could only fail, so it is refused at once."""
    with pytest.raises(SystemExit) as info:
        main(["--registry", str(REGISTRY), "--quiet", "--tolerance", tolerance])
    assert info.value.code == ExitStatus.CONFIG
    err = capsys.readouterr().err
    assert "--tolerance" in err
    assert "standard errors" in err


def test_the_first_help_example_uses_a_user_the_documented_acl_accepts(capsys: pytest.CaptureFixture[str]) -> None:
    """Copied as it stands, the first example authenticates as a user the shipped ACL lets publish
    under sub-identities (deploy/mosquitto/acl.fleet-sim), not as a device the ACL confines."""
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    example = text[text.index("examples:") :]
    words = example.split()
    user = words[words.index("--username") + 1]
    acl = REGISTRY.parent / "mosquitto" / "acl.fleet-sim"
    rules = acl.read_text(encoding="utf-8").splitlines()
    assert f"user {user}" in rules
    assert f"topic write ldp/v1/reports/{user}/+/+" in rules


def test_bad_population_header_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A population file with an unknown header is refused, naming the file and the line."""
    bad = tmp_path / "bad.csv"
    bad.write_text("who,when,what\n", encoding="utf-8")
    status = main(["--registry", str(REGISTRY), "--use-case", "emoji", "--population", str(bad)])
    assert status == 2
    err = capsys.readouterr().err
    assert str(bad) in err
    assert "line 1" in err


def test_shard_ranges_cover_every_device_once() -> None:
    """Workers get contiguous, nearly equal, disjoint ranges covering every device."""
    for devices, workers in ((10, 3), (1, 4), (10_000, 2), (7, 7)):
        ranges = shard_ranges(devices, workers)
        assert [d for r in ranges for d in r] == list(range(devices))
        assert max(len(r) for r in ranges) - min(len(r) for r in ranges) <= 1


def _simulated(result: ShardResult) -> object:
    """A stand-in for the simulation (no broker needed): the run's result is given."""
    return lambda plan, **kwargs: result


def test_nothing_sent_because_every_value_was_refused_is_not_success(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every value refused: exit 3 (refused) with sentences saying so, not status 0 and a raw dict."""
    monkeypatch.setattr("fleet.cli.simulate", _simulated(ShardResult(refused={"emoji": 40})))
    status = main(["--registry", str(REGISTRY), "--use-case", "emoji", "--devices", "2", "--days", "1", "--quiet"])
    assert status == ExitStatus.REFUSED
    captured = capsys.readouterr()
    assert "ldp-fleet: 40 values refused by the agents" in captured.err
    assert "not sent: emoji 40" in captured.err
    assert "ldp-fleet: nothing was sent: every value was refused (40)" in captured.err
    assert "{" not in captured.out + captured.err


def test_counts_are_said_in_the_singular_and_the_plural(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """'1 device, 1 day', not '1 devices, 1 days'."""
    truth = {"emoji": {0: Tally(n=1, total=1.0)}}
    monkeypatch.setattr("fleet.cli.simulate", _simulated(ShardResult(messages=1, truth=truth)))
    main(["--registry", str(REGISTRY), "--use-case", "emoji", "--devices", "1", "--days", "1"])
    err = capsys.readouterr().err
    assert "ldp-fleet: 1 device, 1 day from " in err
    assert "simulated 1 device x 1 day in " in err
    main(["--registry", str(REGISTRY), "--use-case", "emoji", "--devices", "1200", "--days", "2"])
    err = capsys.readouterr().err
    assert "ldp-fleet: 1,200 devices, 2 days from " in err
    assert "simulated 1,200 devices x 2 days in " in err


def test_time_series_rows_past_the_days_are_said_and_json_goes_to_stdout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A series longer than --days (and with more devices than --devices) is said; --json prints one document."""
    series = tmp_path / "usage.csv"
    rows = [f"d{d},{p},{1000 + p}" for d in range(3) for p in range(8)]  # 8 six-hour periods = 2 days
    series.write_text("device,period,value\n" + "\n".join(rows) + "\n", encoding="utf-8")
    truth = {"app-usage-seconds": {0: Tally(n=2, total=2000.0)}}
    monkeypatch.setattr("fleet.cli.simulate", _simulated(ShardResult(messages=2, truth=truth)))
    args = ["--registry", str(REGISTRY), "--use-case", "app-usage-seconds", "--population", str(series)]
    status = main([*args, "--devices", "2", "--days", "1", "--quiet", "--json", "--output", str(tmp_path / "r.json")])
    assert status == ExitStatus.OK
    captured = capsys.readouterr()
    doc = json.loads(captured.out)  # stdout is the document, and only it
    assert doc == json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))
    assert doc["unused_population_rows"] == {"app-usage-seconds": {"past_days": 8, "past_devices": 8}}
    assert "8 rows past the simulated days (--days) and 8 rows of devices beyond --devices" in captured.err


def test_default_broker_is_the_shipped_tls_listener() -> None:
    """The default --broker is the TLS port of deploy/mosquitto/mosquitto.conf, and TLS is on by default."""
    conf = (REGISTRY.parent / "mosquitto" / "mosquitto.conf").read_text(encoding="utf-8")
    args = build_parser().parse_args([])
    assert args.broker == "127.0.0.1:8883"
    assert args.tls is True
    assert "listener 8883" in conf
    assert "\nlistener 1883" not in conf


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    """`ldp-fleet --version` prints the package version."""
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("ldp-fleet 0.")


def test_devices_failing_together_are_one_delivery_failure_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A broker gone mid-run fails every device's task at once: exit 8 with one sentence."""

    def broken(plan: object, **kwargs: object) -> ShardResult:
        raise ExceptionGroup(
            "devices",
            [TransportError(f"device {i}: reports not acknowledged after 8 attempts") for i in (104, 105, 106)],
        )

    monkeypatch.setattr("fleet.cli.simulate", broken)
    status = main(["--registry", str(REGISTRY), "--use-case", "emoji", "--devices", "3", "--days", "1", "--quiet"])
    assert status == ExitStatus.UNAVAILABLE
    err = capsys.readouterr().err
    assert "ldp-fleet: device 104: reports not acknowledged after 8 attempts (and 2 more like it)" in err
    assert "Traceback" not in err
