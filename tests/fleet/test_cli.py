"""ldp-fleet's command line: help, and input mistakes refused before anything connects."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.fleet import main, shard_ranges

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
        (["--registry", "/nonexistent/registry.toml"], "cannot read the registry"),
    ],
)
def test_input_mistakes_exit_2_with_a_reason(args: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A mistake in the inputs exits with status 2 and says what is wrong."""
    status = main(["--registry", str(REGISTRY), "--quiet", *args])
    assert status == 2
    assert needle in capsys.readouterr().err


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
