"""The HTTP API and the dashboard, against a populated store; the dashboard in headless Chromium."""

from __future__ import annotations

import asyncio
import html
import json
import os
import re
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from collector.config import CollectorConfig, parse_config
from collector.http import HttpApi
from collector.numbers import format_number
from collector.results import EstimateResult, ServiceStatus, from_json, json_schema
from collector.store import CheckpointStore
from protocol.catalog import Catalog
from protocol.registry import Registry
from protocol.wire import decode_report, encode_report
from tests.collector.support import (
    EMOJI,
    REGISTRY_TEXT,
    current_period,
    load_registry,
    privatized_reports,
    run_async,
    shown_row,
    write_registry,
)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SCREENSHOT_DIR = os.environ.get("LDP_SCREENSHOT_DIR")


def _populate(path: Path, registry: Registry, now: float, *, periods: int = 4, per_period: int = 400) -> None:
    store = CheckpointStore(path, registry, instance="dash")
    try:
        for i, name in enumerate(sorted(registry.use_cases)):
            current = current_period(registry, name, now)
            for back in range(periods if name in ("usage", "flag") else 1):
                reports = privatized_reports(
                    registry, name, per_period, period=current - back, seed=1000 + 10 * i + back
                )
                store.commit([decode_report(encode_report(r), registry) for r in reports], {"messages": per_period})
        # One period below min_reports: the dashboard must say it is withheld.
        small = privatized_reports(registry, "hist", 5, period=current_period(registry, "hist", now) - 1, seed=77)
        store.commit([decode_report(encode_report(r), registry) for r in small], {})
    finally:
        store.close()


def _config(tmp_path: Path, registry_path: Path, *, workers: int = 0) -> CollectorConfig:
    return parse_config(
        {
            "registry": str(registry_path),
            "instance": "dash",
            "store": {"path": str(tmp_path / "dash.sqlite3")},
            "http": {"host": "127.0.0.1", "port": 0},
            "estimation": {"workers": workers},
        }
    )


def _get(port: int, path: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as r:
            return r.status, r.headers["Content-Type"], r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read()


@run_async
async def test_api_routes_answer_with_estimates_and_errors(
    tmp_path: Path, registry: Registry, registry_path: Path
) -> None:
    """Every route answers; estimates carry SE and CI; bad input gives 400/404/405, never a crash."""
    now = time.time()  # one instant for the data and the period asked about (a period may close meanwhile)
    _populate(tmp_path / "dash.sqlite3", registry, now, periods=2, per_period=300)
    api = HttpApi(_config(tmp_path, registry_path, workers=1))
    port = await api.start()
    serving = asyncio.create_task(api.serve())
    try:

        async def get(path: str) -> tuple[int, str, bytes]:
            return await asyncio.to_thread(_get, port, path)

        def ok_json(status: int, ctype: str, body: bytes) -> Any:
            assert status == 200
            assert ctype.startswith("application/json")
            return json.loads(body)

        data = ok_json(*await get("/api/v1/status"))
        assert data["counters"]["reports"] == 300 * (len(registry.use_cases) + 2) + 5
        est = ok_json(*await get("/api/v1/use-cases/usage/estimate"))
        assert est["released"]
        assert est["kind"] == "mean"
        e = est["estimate"]
        assert e["ci"][0] < e["value"] < e["ci"][1]
        assert e["standard_error"] > 0
        assert len(ok_json(*await get("/api/v1/use-cases/usage/series"))["points"]) == 2
        items = ok_json(*await get("/api/v1/use-cases/emoji/estimate"))["estimate"]["items"]
        assert items
        assert {i["value"] for i in items} <= set(EMOJI)
        assert all(i["count"] >= 5 for i in items)  # release_threshold = 5
        assert ok_json(*await get("/api/v1/use-cases/home/estimate"))["estimate"]["correction"] == "bh"
        # withheld=1 lists every other dictionary entry too, flagged and with its reason.
        full = ok_json(*await get("/api/v1/use-cases/emoji/estimate?withheld=1"))["estimate"]
        assert [i["value"] for i in full["items"]] == [i["value"] for i in items]
        assert all(i["released"] for i in full["items"])
        assert len(full["withheld_items"]) == full["withheld"] == len(EMOJI) - len(items)
        assert all(not i["released"] and i["withheld_reason"] for i in full["withheld_items"])
        assert {i["value"] for i in full["items"] + full["withheld_items"]} == set(EMOJI)
        assert (await get("/api/v1/use-cases/emoji/estimate?withheld=yes"))[0] == 400
        hist_period = current_period(registry, "hist", now) - 1
        assert not ok_json(*await get(f"/api/v1/use-cases/hist/estimate?period={hist_period}"))["released"]
        assert (await get("/api/v1/use-cases/nope/estimate"))[0] == 404
        assert (await get("/api/v1/use-cases/usage/estimate?period=x"))[0] == 400
        assert (await get("/nowhere"))[0] == 404
        # The answers' schema is served, and the answers above are what it and the types say.
        assert ok_json(*await get("/api/v1/schema")) == json_schema()
        from_json(json.dumps(data), ServiceStatus)
        from_json(json.dumps(est), EstimateResult)
        status, ctype, body = await get("/metrics")
        assert status == 200
        assert ctype.startswith("text/plain")
        assert b"ldp_collector_messages_total" in body
        status, ctype, body = await get("/")
        assert status == 200
        assert ctype.startswith("text/html")
        assert b"<script>" in body
        assert not re.search(rb"(src|href)=[\"']https?://", body)  # self-contained: nothing fetched from outside
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /api/v1/status HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await reader.read()).startswith(b"HTTP/1.1 405")
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"garbage\r\n\r\n")
        # An unparsable request has no version: the answer speaks HTTP/1.0.
        assert re.match(rb"HTTP/1\.[01] 400 ", await reader.read())
        writer.close()
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)


async def _chromium(args: list[str], profile: Path) -> bytes:
    assert CHROMIUM is not None
    proc = await asyncio.create_subprocess_exec(
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=15000",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    return out


def _text(fragment: str) -> str:
    """The text of an HTML fragment as a browser shows it (tags dropped, entities read, spaces collapsed)."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def _card(dom: str, name: str) -> str:
    match = re.search(rf'<section class="card" id="uc-{re.escape(name)}".*?</section>', dom, re.S)
    assert match, f"no card for {name}"
    return match.group(0)


def _rows(card: str) -> list[list[str]]:
    body = re.search(r"<tbody>(.*?)</tbody>", card, re.S)
    assert body
    return [
        [_text(c) for c in re.findall(r"<td\b[^>]*>(.*?)</td>", row, re.S)]
        for row in re.findall(r"<tr\b[^>]*>(.*?)</tr>", body[1], re.S)
    ]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
@run_async
async def test_dashboard_renders_plots_in_headless_chromium(
    tmp_path: Path, registry: Registry, registry_path: Path
) -> None:
    """The dashboard in Chromium draws every chart; the numbers it shows are the API's, written by format_number."""
    _populate(tmp_path / "dash.sqlite3", registry, time.time())
    api = HttpApi(_config(tmp_path, registry_path))
    port = await api.start()
    serving = asyncio.create_task(api.serve())
    url = f"http://127.0.0.1:{port}/"
    try:
        # Three rows per table, so the cut (and what it says) shows in the small test registry.
        dom = (await _chromium(["--dump-dom", url + "?rows=3"], tmp_path / "profile-dom")).decode()
        screenshot = tmp_path / "dashboard.png"
        await _chromium([f"--screenshot={screenshot}", "--window-size=1280,3000", url], tmp_path / "profile-shot")
        status = json.loads((await asyncio.to_thread(_get, port, "/api/v1/status"))[2])
        emoji = json.loads((await asyncio.to_thread(_get, port, "/api/v1/use-cases/emoji/estimate"))[2])
        home = json.loads((await asyncio.to_thread(_get, port, "/api/v1/use-cases/home/estimate"))[2])
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
    assert 'data-ready="1"' in dom, dom[:3000]
    # Measured in the page as drawn: no axis or tick label overlaps another or leaves its chart.
    assert 'data-layout-problems="0"' in dom
    cards = dict(re.findall(r'<section class="card" id="uc-([\w.-]+)" data-kind="(\w+)"', dom))
    assert cards == {
        "domains": "frequencies",
        "emoji": "frequencies",
        "flag": "proportion",
        "hist": "histogram",
        "home": "frequencies",
        "usage": "mean",
        "words": "frequencies",
    }
    # The header, as rendered, against the status the API serves.
    header = re.search(r'id="summary">(.*?)</span>\s*</header>', dom, re.S)
    assert header
    assert _text(header[1]) == (
        f"instance dash · registry {status['registry_hash'][:12]} · "
        f"reports folded {format_number(status['counters']['reports'])}"
    )
    assert status["counters"]["reports"] >= 1000  # so a formatter that drops whole-number zeros would show
    # One table's rendered numbers against the API's estimate: the first rows, then the cut.
    items = emoji["estimate"]["items"]
    assert len(items) > 3
    card = _card(dom, "emoji")
    # The release test's p-value (against the release threshold) has two significant digits.
    assert _rows(card) == [shown_row(i) for i in items[:3]]
    assert f"{len(items) - 3} more rows hidden (showing the 3 largest of {len(items)}) show all {len(items)}" in _text(
        card
    )
    assert f"{len(items)} of {emoji['estimate']['tested']} dictionary entries released" in _text(card)
    # The ε on every card is the one charged per report.
    for name, uc in registry.use_cases.items():
        assert f"ε {format_number(uc.cost)} per report" in _text(_card(dom, name))
        assert status["use_cases"][name]["epsilon_report"] == uc.cost
    # Mean over time: one point per period, with a confidence band.
    assert re.search(r'class="chart series" data-points="4"', dom)
    assert dom.count('class="point"') >= 8  # usage and flag, 4 periods each
    assert 'class="ci-band"' in dom
    # Histogram: 8 buckets, each with an error bar and a consistent marker; zero labelled on
    # the value axis; the bucket edges labelled from the low edge to the high one.
    assert 'class="chart histogram" data-bars="8"' in dom
    assert dom.count('class="error-bar"') == 8
    assert dom.count('class="consistent"') == 8
    hist = _card(dom, "hist")
    ticks = [_text(t) for t in re.findall(r'<text[^>]*class="tick"[^>]*>(.*?)</text>', hist)]
    assert "0" in ticks
    assert "100" in ticks  # the high edge of the last bucket
    assert "share of devices" in _text(hist)
    # Strings: tables with counts and SE; the most common emoji is found.
    assert dom.count('class="strings"') == 4
    assert ">heart<" in dom
    # Under each table, what the released entries' SE and interval mean (docs/estimation.md).
    assert dom.count('class="legend interval-legend"') == 4
    assert "SE and CI: 95 % interval conditional on release" in dom
    assert "bh at α = 0.05" in dom  # the default correction, under the frequency cards
    assert 'class="withheld"' not in dom.split('id="uc-hist"')[0]  # nothing above hist is withheld
    # RAPPOR's card says how much of the reports its fitted candidates leave unexplained, with
    # the API's figures (docs/estimation.md, "RAPPOR: what the candidates do not explain").
    fit = home["estimate"]["fit"]
    spread = format_number(100 * fit["unexplained_share_standard_error"], 2)
    share = f"{format_number(100 * fit['unexplained_share'], 2)} % ± {spread} %"
    assert f"unexplained: {share} of the reports, by the {format_number(fit['fitted'])} fitted entries" in _text(
        _card(dom, "home")
    )
    assert dom.count('class="sub fit"') == 1  # only the card whose entries are fitted jointly
    assert screenshot.stat().st_size > 20_000
    if SCREENSHOT_DIR:
        shutil.copy(screenshot, Path(SCREENSHOT_DIR) / "dashboard.png")


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
@run_async
async def test_dashboard_shows_each_live_definition_during_a_rollout(tmp_path: Path, registry: Registry) -> None:
    """Two registries: a card per definition with reports, the current one marked; the API serves each by ref."""
    v1_dir = tmp_path / "v1"
    v1_path = write_registry(v1_dir)
    v2_path = write_registry(tmp_path / "v2", REGISTRY_TEXT.replace('"cms"\nepsilon = 4\n', '"cms"\nepsilon = 3\n'))
    v1, v2 = load_registry(v1_path), load_registry(v2_path)
    assert v1["emoji"].ref != v2["emoji"].ref
    assert v1["flag"].ref == v2["flag"].ref
    catalog = Catalog.build(v2, [v1])
    now = time.time()
    store = CheckpointStore(tmp_path / "dash.sqlite3", catalog, instance="dash")
    try:
        for registry_, seed in ((v1, 1), (v2, 2)):
            period = current_period(registry_, "emoji", now)
            made = privatized_reports(registry_, "emoji", 200, period=period, seed=seed)
            store.commit([decode_report(encode_report(r), catalog) for r in made], {})
        made = privatized_reports(v2, "flag", 50, period=current_period(v2, "flag", now), seed=3)
        store.commit([decode_report(encode_report(r), catalog) for r in made], {})
    finally:
        store.close()
    config = parse_config(
        {
            "registry": str(v2_path),
            "earlier_registries": [str(v1_path)],
            "instance": "dash",
            "store": {"path": str(tmp_path / "dash.sqlite3")},
            "http": {"host": "127.0.0.1", "port": 0},
        }
    )
    api = HttpApi(config)
    port = await api.start()
    serving = asyncio.create_task(api.serve())
    try:
        dom = (await _chromium(["--dump-dom", f"http://127.0.0.1:{port}/"], tmp_path / "profile")).decode()
        old = json.loads((await asyncio.to_thread(_get, port, f"/api/v1/use-cases/{v1['emoji'].ref}/estimate"))[2])
        new = json.loads((await asyncio.to_thread(_get, port, "/api/v1/use-cases/emoji/estimate"))[2])
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
    assert 'data-ready="1"' in dom, dom[:3000]
    assert 'data-layout-problems="0"' in dom
    assert (old["definition"], old["reports"], old["epsilon_report"]) == (v1["emoji"].ref, 200, 4.0)
    assert (new["definition"], new["reports"], new["epsilon_report"]) == (v2["emoji"].ref, 200, 3.0)
    current = _text(_card(dom, v2["emoji"].ref))
    earlier = _text(_card(dom, v1["emoji"].ref))
    assert current.startswith(f"{v2['emoji'].ref} current definition")
    assert earlier.startswith(f"{v1['emoji'].ref} earlier definition ({v1_path})")
    assert "ε 3 per report" in current
    assert "ε 4 per report" in earlier
    assert "200 reports" in current
    assert "200 reports" in earlier
    # A use case with one definition keeps a card under its name, with no marker.
    flag = _text(_card(dom, "flag"))
    assert "definition" not in flag.split("ε")[0]
    header = re.search(r'id="summary">(.*?)</span>\s*</header>', dom, re.S)
    assert header
    assert "(+ 1 earlier)" in _text(header[1])


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
@run_async
async def test_dashboard_shows_the_central_guarantee_next_to_the_per_report_epsilon(
    tmp_path: Path, registry: Registry, registry_path: Path
) -> None:
    """Every card with reports shows its latest period's central (ε, δ), the API's figures as
    drawn in Chromium, under the ε a record costs on the device (docs/privacy-accounting.md)."""
    _populate(tmp_path / "dash.sqlite3", registry, time.time())
    api = HttpApi(_config(tmp_path, registry_path))
    port = await api.start()
    serving = asyncio.create_task(api.serve())
    try:
        dom = (await _chromium(["--dump-dom", f"http://127.0.0.1:{port}/"], tmp_path / "profile")).decode()
        estimates = {
            name: json.loads((await asyncio.to_thread(_get, port, f"/api/v1/use-cases/{name}/estimate"))[2])
            for name in registry.use_cases
        }
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
    assert 'data-ready="1"' in dom, dom[:3000]
    for name, uc in registry.use_cases.items():
        central = estimates[name]["central"]
        card = _card(dom, name)
        line = re.search(
            r'<div class="sub central" data-epsilon="([^"]*)" data-delta="([^"]*)">(.*?)</div>', card, re.S
        )
        assert line, name
        text = _text(line[3])
        assert float(line[1]) == central["epsilon"]
        assert float(line[2]) == central["delta"]
        assert text.startswith(
            f"central guarantee of the period: (ε {format_number(central['epsilon'])}, "
            f"δ {format_number(central['delta'])}) for one record of the period among "
            f"{format_number(central['n'])} shuffled reports · "
            f"ε {format_number(uc.cost)} per record on the device"
        ), text
        # Amplified: 400 shuffled reports give less than the per-record ε, never more.
        assert central["epsilon"] < uc.cost
        # The card's ε per report comes first, then the period's guarantee.
        assert _text(card).index(f"ε {format_number(uc.cost)} per report") < _text(card).index("central guarantee")
