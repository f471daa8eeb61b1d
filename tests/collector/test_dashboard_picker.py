"""The period picker as a user works it: the live page in headless Chromium, driven over the
DevTools protocol (tests/support/cdp.py), an older period chosen in a histogram card's and a
frequency card's picker, and the redrawn cards read from the DOM against the API's figures."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from collector.http import HttpApi
from protocol.registry import Registry
from tests.collector.support import run_async, shown_row
from tests.collector.test_dashboard import CHROMIUM, _config, _get
from tests.collector.test_dashboard_periods import _expected_bars, _populate_two_periods
from tests.support.cdp import CdpPage, open_page, start_chromium

# What a user does: choose the option, which fires the select's `change` (it bubbles).
PICK_JS = """(() => {{
  const select = document.querySelector({card} + " select.period-picker");
  select.value = {period};
  if (select.value !== {period}) throw new Error("no option " + {period} + " in " + {card});
  select.dispatchEvent(new Event("change", {{bubbles: true}}));
  return true;
}})()"""

# The card has redrawn the picked period, and the page says it is done (or failed).
DRAWN_JS = """(() => {{
  const ready = document.body.dataset.ready;
  if (ready === "error") return "error: " + document.getElementById("error").textContent;
  const body = document.querySelector({card} + " .period-body");
  return ready === "1" && body && body.dataset.period === {period};
}})()"""

# The page's ready marker once it is final: "1" drawn, "error" failed (collector/dashboard.py).
READY_JS = """(() => {
  const ready = document.body && document.body.dataset.ready;
  return (ready === "1" || ready === "error") && ready;
})()"""

READ_JS = """(() => {{
  const card = document.querySelector({card});
  const cells = row => [...row.querySelectorAll("td")].map(td => td.textContent.trim());
  return {{
    period: card.querySelector(".period-body").dataset.period,
    selected: card.querySelector("select.period-picker").value,
    text: card.textContent,
    bars: [...card.querySelectorAll("rect.bar > title")].map(t => t.textContent),
    rows: [...card.querySelectorAll("table.strings tbody tr")].map(cells),
    withheld: [...card.querySelectorAll("table.withheld-entries tbody tr")].map(cells),
    search: location.search,
  }};
}})()"""


async def _pick(page: CdpPage, name: str, period: int) -> dict[str, Any]:
    """Choose ``period`` in ``name``'s picker, wait for the card to redraw it, and read the card."""
    card, value = json.dumps(f"#uc-{name}"), json.dumps(str(period))
    await page.evaluate(PICK_JS.format(card=card, period=value))
    drawn = await page.wait_for(DRAWN_JS.format(card=card, period=value), timeout=60)
    assert drawn is True, drawn
    shown: dict[str, Any] = await page.evaluate(READ_JS.format(card=card))
    return shown


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
@run_async
async def test_picking_an_older_period_redraws_the_card_with_that_periods_figures(
    tmp_path: Path, registry: Registry, registry_path: Path
) -> None:
    """The picker's change handler fetches and draws the picked period (histogram bars; the
    frequency table and its withheld entries with why) and writes ?period.NAME=P."""
    assert CHROMIUM is not None
    older = _populate_two_periods(tmp_path / "dash.sqlite3", registry, time.time())
    api = HttpApi(_config(tmp_path, registry_path))
    port = await api.start()
    serving = asyncio.create_task(api.serve())

    async def api_json(path: str) -> Any:
        status, _, body = await asyncio.to_thread(_get, port, path)
        assert status == 200, body
        return json.loads(body)

    try:
        frequencies = {
            name: await api_json(f"/api/v1/use-cases/{name}/estimate?period={older[name]}&withheld=1")
            for name in ("domains", "emoji", "home", "words")
        }
        name, freq_old = next((n, r) for n, r in frequencies.items() if r["estimate"]["withheld_items"])
        hist_old = await api_json(f"/api/v1/use-cases/hist/estimate?period={older['hist']}&withheld=1")
        async with (
            asyncio.timeout(240),
            start_chromium(CHROMIUM, tmp_path / "profile") as browser,
            open_page(browser) as page,
        ):
            await page.navigate(f"http://127.0.0.1:{port}/")
            ready = await page.wait_for(READY_JS)
            assert ready == "1", await page.evaluate('document.getElementById("error").textContent')
            # Before the pick, each card shows the API's default period, not the older one.
            for uc in ("hist", name):
                shown = await page.evaluate(f'document.querySelector("#uc-{uc} .period-body").dataset.period')
                assert shown != str(older[uc])
            hist = await _pick(page, "hist", older["hist"])
            freq = await _pick(page, name, older[name])
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)

    # The histogram card: the older period's bars, its report count, the picker on it.
    assert hist_old["reports"] == 1200
    assert (hist["period"], hist["selected"]) == (str(older["hist"]), str(older["hist"]))
    assert "1,200 reports" in hist["text"]
    assert hist["bars"] == _expected_bars(hist_old)
    # The frequency card: the older period's released entries, and the withheld ones with why.
    assert (freq["period"], freq["selected"]) == (str(older[name]), str(older[name]))
    items, withheld = freq_old["estimate"]["items"], freq_old["estimate"]["withheld_items"]
    assert freq["rows"] == [shown_row(i) for i in items[:50]]
    assert [[r[0], r[-1]] for r in freq["withheld"]] == [[w["value"], w["withheld_reason"]] for w in withheld[:50]]
    # The address keeps both choices (a reload or a shared link shows the same periods).
    assert f"period.hist={older['hist']}" in freq["search"]
    assert f"period.{name}={older[name]}" in freq["search"]


# Hold the page's fetches of one period until released (window.releaseHeld()); window.heldDone
# turns true once the held answer has been read and every task it queued has run.
HOLD_JS = """(() => {{
  const real = window.fetch.bind(window);
  let release;
  const gate = new Promise(resolve => {{ release = resolve; }});
  window.releaseHeld = () => release();
  window.heldDone = false;
  window.fetch = async (url, opts) => {{
    if (!String(url).includes("period=" + {period} + "&")) return real(url, opts);
    const response = await real(url, opts);
    await gate;
    const read = response.json.bind(response);
    response.json = async () => {{
      const value = await read();
      setTimeout(() => {{ window.heldDone = true; }}, 0);
      return value;
    }};
    return response;
  }};
  return true;
}})()"""


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
@run_async
async def test_a_late_answer_to_an_earlier_pick_does_not_replace_the_later_one(
    tmp_path: Path, registry: Registry, registry_path: Path
) -> None:
    """Two picks in a row whose answers arrive in the other order: the card keeps the period
    picked last (the one the picker and the address show)."""
    assert CHROMIUM is not None
    older = _populate_two_periods(tmp_path / "dash.sqlite3", registry, time.time())
    api = HttpApi(_config(tmp_path, registry_path))
    port = await api.start()
    serving = asyncio.create_task(api.serve())
    try:
        async with (
            asyncio.timeout(240),
            start_chromium(CHROMIUM, tmp_path / "profile") as browser,
            open_page(browser) as page,
        ):
            await page.navigate(f"http://127.0.0.1:{port}/")
            assert await page.wait_for(READY_JS) == "1"
            card = json.dumps("#uc-hist")
            latest = await page.evaluate(f"document.querySelector({card} + ' .period-body').dataset.period")
            assert latest != str(older["hist"])
            await page.evaluate(HOLD_JS.format(period=json.dumps(str(older["hist"]))))
            await page.evaluate(PICK_JS.format(card=card, period=json.dumps(str(older["hist"]))))
            # The user changes their mind before the older period's answer arrives.
            await page.evaluate(PICK_JS.format(card=card, period=json.dumps(latest)))
            assert await page.wait_for(DRAWN_JS.format(card=card, period=json.dumps(latest))) is True
            await page.evaluate("window.releaseHeld()")
            assert await page.wait_for("window.heldDone") is True
            shown = await page.evaluate(READ_JS.format(card=card))
            ready = await page.evaluate("document.body.dataset.ready")
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
    assert (shown["period"], shown["selected"], ready) == (latest, latest, "1")
    assert f"period.hist={latest}" in shown["search"]
