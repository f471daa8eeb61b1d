"""``ldp-collector estimate``: ``--period`` takes a date or a timestamp as well as an index; an
unknown use case is answered with the known ones; frequency output carries the p-value."""

from __future__ import annotations

import datetime as dt
import io
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from collector.cli import EXIT_CONFIG, main
from collector.estimation import period_bounds
from collector.rendering import _release_lines
from collector.results import FrequencyEntry, ReleaseDecision
from protocol.registry import Registry
from tests.collector.corruption import NOW, prepare
from tests.collector.support import current_period


def _cli(config: Path, *words: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(["--config", str(config), *words])
        except SystemExit as exc:  # argparse's usage errors
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def config(tmp_path: Path, registry: Registry, registry_path: Path) -> Path:
    store, _ = prepare(tmp_path / "store", registry)
    path = tmp_path / "collector.toml"
    path.write_text(f'registry = "{registry_path}"\n[store]\npath = "{store}"\n', encoding="utf-8")
    return path


@pytest.mark.parametrize("name", ["usage", "hist"])
def test_a_date_or_a_timestamp_names_the_period_that_contains_it(config: Path, registry: Registry, name: str) -> None:
    """The period's start, a moment inside it written in another zone, and a date all read as the index."""
    uc = registry[name]
    period = current_period(registry, name, NOW) - 1
    start, _ = period_bounds(uc, period)
    by_index = _cli(config, "estimate", name, "--period", str(period), "--json")
    assert by_index[0] == 0, by_index[2]
    assert f'"period": {period}' in by_index[1]
    middle = dt.datetime.fromisoformat(start) + dt.timedelta(seconds=uc.period.seconds // 2)
    elsewhere = middle.astimezone(dt.timezone(dt.timedelta(hours=-5))).isoformat()  # the same instant
    for moment in (start, start.replace("Z", "+00:00"), elsewhere):
        assert _cli(config, "estimate", name, "--period", moment, "--json") == by_index, moment
    # A date is its midnight, UTC: the period that holds it (for a 6-hour period, the day's first).
    day = start[:10]
    midnight = int(dt.datetime.fromisoformat(day).replace(tzinfo=dt.UTC).timestamp()) // uc.period.seconds
    code, out, err = _cli(config, "estimate", name, "--period", day, "--json")
    assert "Traceback" not in err
    assert f'"period": {midnight}' in out, (code, err)


def test_a_period_that_is_neither_an_index_nor_a_moment_is_a_usage_error(config: Path) -> None:
    """Exit 2 with what --period takes, no traceback."""
    code, out, err = _cli(config, "estimate", "usage", "--period", "last-tuesday")
    assert code == EXIT_CONFIG
    assert not out
    assert "2026-11-24" in err
    assert "Traceback" not in err


def test_an_unknown_use_case_lists_the_known_ones(config: Path) -> None:
    """The message names the use case given and the ones the registry has."""
    code, out, err = _cli(config, "estimate", "nope")
    assert code == EXIT_CONFIG
    assert not out
    assert "unknown use case or definition 'nope'" in err
    for name in ("usage", "hist", "flag", "home"):
        assert name in err.split("the use cases are")[1]


def test_frequency_rows_show_the_p_value_the_dashboard_shows() -> None:
    """Released and withheld rows carry the p-value with two significant digits, under a p-value heading."""
    entry = FrequencyEntry(
        value="🙂", count=10_956.0, standard_error=70.2, ci=(10_000.0, 11_093.6), z=5.0, p_value=1.234e-6, released=True
    )
    withheld = FrequencyEntry(
        value="🙃",
        count=120.0,
        standard_error=70.2,
        ci=(-20.0, 260.0),
        z=0.3,
        p_value=0.3817,
        released=False,
        withheld_reason="not significant",
    )
    decision = ReleaseDecision(
        items=(entry,),
        withheld=1,
        threshold=1000,
        tested=2,
        withheld_items=(withheld,),
        correction="bh",
        alpha=0.05,
        test="t",
    )
    lines = _release_lines(decision)
    assert lines[0].rstrip().endswith("p-value")
    assert next(line for line in lines if "🙂" in line).rstrip().endswith("1.2e-6")
    assert "0.38" in next(line for line in lines if "🙃" in line)
    assert any(line.rstrip().endswith("p-value  reason") for line in lines)
