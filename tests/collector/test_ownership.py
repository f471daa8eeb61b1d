"""Owners and end dates on the collector: check-config warns (and strict refuses), `ldp-collector status`
and the dashboard (headless Chromium) show each use case's owner and expiry and mark expired ones,
whose data is kept and drawn."""

from __future__ import annotations

import asyncio
import datetime
import json
import re
import shutil
import time
from pathlib import Path

import pytest

from collector.cli import main
from collector.http import HttpApi
from collector.rendering import format_status
from collector.status import store_status
from protocol.registry import Registry
from runtime.exit_status import ExitStatus
from tests.collector.support import REGISTRY_TEXT, load_registry, run_async, write_registry
from tests.collector.test_dashboard import CHROMIUM, SCREENSHOT_DIR, _card, _chromium, _config, _get, _populate, _text

TODAY = datetime.datetime.now(datetime.UTC).date()
PAST = TODAY - datetime.timedelta(days=3)
FUTURE = TODAY + datetime.timedelta(days=400)


def _owned(text: str = REGISTRY_TEXT) -> str:
    """The collector tests' registry with flag expired three days ago and usage running for 400 more."""
    text = text.replace(
        "[use_cases.flag]\n",
        f'[use_cases.flag]\nowner = "design-systems@example.org"\nexpires = {PAST.isoformat()}\n'
        'data_review = "https://example.org/reviews/flag"\n',
    )
    return text.replace(
        "[use_cases.usage]\n",
        f'[use_cases.usage]\nowner = "usage-insights@example.org"\nexpires = {FUTURE.isoformat()}\n',
    )


@pytest.fixture
def owned_path(tmp_path: Path) -> Path:
    """The registry with owners and end dates, and its dictionaries."""
    return write_registry(tmp_path / "registry", _owned())


@pytest.fixture
def owned(owned_path: Path) -> Registry:
    """The parsed registry with owners and end dates."""
    return load_registry(owned_path)


def test_status_shows_owner_and_expiry_and_marks_the_expired(tmp_path: Path, owned: Registry, owned_path: Path) -> None:
    """The typed status has each definition's owner, end date and whether it passed; the text says it."""
    _populate(tmp_path / "dash.sqlite3", owned, time.time(), periods=2, per_period=60)
    status = store_status(_config(tmp_path, owned_path))
    flag, usage, emoji = (status.use_cases[n] for n in ("flag", "usage", "emoji"))
    assert (flag.owner, flag.expires, flag.expired) == ("design-systems@example.org", PAST.isoformat(), True)
    assert flag.data_review == "https://example.org/reviews/flag"
    assert flag.periods  # its data is kept
    assert (usage.owner, usage.expires, usage.expired) == ("usage-insights@example.org", FUTURE.isoformat(), False)
    assert (emoji.owner, emoji.expires, emoji.expired) == (None, None, False)
    text = format_status(status)
    line = {m[1]: m[0] for m in re.findall(r"^( +(\w+)@.*)$", text, re.M)}
    assert (
        f"EXPIRED on {PAST.isoformat()}, agents record nothing more; owner design-systems@example.org" in line["flag"]
    )
    assert f"owner usage-insights@example.org, expires {FUTURE.isoformat()}" in line["usage"]
    assert "no owner, no end date" in line["emoji"]


def test_check_config_warns_of_missing_metadata_and_strict_refuses(
    tmp_path: Path, owned_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Warnings name each use case without owner or end date, and the expired one; strict exits 2 naming each."""
    config = tmp_path / "collector.toml"
    config.write_text(f'registry = "{owned_path}"\n[store]\npath = "store.sqlite3"\n', encoding="utf-8")
    assert main(["--config", str(config), "check-config"]) == 0
    out = capsys.readouterr().out
    warnings = [line.strip() for line in out.splitlines() if line.strip().startswith("warning: use case")]
    lacking = {"hist", "home", "domains", "emoji", "words"}
    named = {m[1] for w in warnings if (m := re.search(r"'([\w.-]+)' has no owner and no expires", w))}
    assert named == lacking
    assert any(f"'flag' expired on {PAST.isoformat()}" in w for w in warnings)
    strict = owned_path.with_name("strict.toml")
    strict.write_text(_owned().replace("format = 1\n", "format = 1\nstrict = true\n", 1), encoding="utf-8")
    config.write_text(f'registry = "{strict}"\n[store]\npath = "store.sqlite3"\n', encoding="utf-8")
    assert main(["--config", str(config), "check-config"]) == ExitStatus.CONFIG
    err = capsys.readouterr().err
    assert "strict = true" in err
    for name in lacking:
        assert f"{name} (no owner and no expires)" in err


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
@run_async
async def test_the_dashboard_shows_owner_and_end_date_and_marks_an_expired_use_case(
    tmp_path: Path, owned: Registry, owned_path: Path
) -> None:
    """Each card says who owns the use case until when; the expired one is marked and still drawn."""
    _populate(tmp_path / "dash.sqlite3", owned, time.time())
    api = HttpApi(_config(tmp_path, owned_path))
    port = await api.start()
    serving = asyncio.create_task(api.serve())
    url = f"http://127.0.0.1:{port}/"
    try:
        dom = (await _chromium(["--dump-dom", url], tmp_path / "profile-dom")).decode()
        screenshot = tmp_path / "ownership.png"
        await _chromium([f"--screenshot={screenshot}", "--window-size=1280,1400", url], tmp_path / "profile-shot")
        status = json.loads((await asyncio.to_thread(_get, port, "/api/v1/status"))[2])
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
    assert 'data-ready="1"' in dom, dom[:3000]
    assert 'data-layout-problems="0"' in dom
    assert status["use_cases"]["flag"]["expired"] is True
    flag = _card(dom, "flag")
    assert 'data-expired="1"' in flag
    assert re.search(r'<span class="role expired">expired</span>', flag)
    # (_text puts a space where a tag ends: the date is in bold.)
    assert (
        f"owner design-systems@example.org · expired on {PAST.isoformat()} : agents record nothing more; "
        "the data below is kept · data review"
    ) in _text(flag)
    assert 'class="chart series" data-points="4"' in flag  # its data is drawn as before
    usage = _card(dom, "usage")
    assert 'data-expired="0"' in usage
    assert f"owner usage-insights@example.org · collects until {FUTURE.isoformat()}" in _text(usage)
    assert "no owner named in the registry · no end date" in _text(_card(dom, "emoji"))
    assert dom.count('class="role expired"') == 1
    if SCREENSHOT_DIR:
        shutil.copy(screenshot, Path(SCREENSHOT_DIR) / "ownership.png")


def test_the_planner_shows_owner_and_end_date(owned_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`plan use-case` says who owns the use case and until when, or that the registry names neither."""
    assert main(["plan", "use-case", "--registry", str(owned_path), "usage", "--n", "1e4"]) == 0
    out = capsys.readouterr().out
    assert "  owner: usage-insights@example.org\n" in out
    assert f"  expires: {FUTURE.isoformat()}\n" in out
    assert main(["plan", "use-case", "--registry", str(owned_path), "emoji", "--n", "1e4", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert (plan["owner"], plan["expires"]) == ("none named", "no end date")
