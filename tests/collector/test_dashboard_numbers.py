"""What a reader of the dashboard sees agrees with itself: in headless Chromium, every released
emoji of a frequency table is drawn in colour, not as an empty box, and each row's numbers
agree - the count inside its interval and the interval its count ± z times the SE shown - or,
for an entry that barely crossed the release cutoff, the interval alone, "near cutoff"
(docs/estimation.md, "What is shown")."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from collector.http import HttpApi
from collector.numbers import format_number
from collector.store import CheckpointStore
from protocol.randomness import SeededRandom
from protocol.wire import decode_report, encode_report, make_report
from tests.collector.support import current_period, load_registry, run_async, shown_row, write_registry
from tests.collector.test_dashboard import CHROMIUM, SCREENSHOT_DIR, _config, _get
from tests.collector.test_dashboard_picker import READY_JS
from tests.support.cdp import open_page, start_chromium

# Reports per emoji: two clearly released, one released well above the cutoff, one that barely
# crosses it with this seed (its estimate about 30 against a cutoff near 27), the rest absent.
EMOJI = ("😀", "❤️", "😂", "👍", "🔥", "✨", "🙏", "🤣")
REPORTS = (220, 120, 45, 30, 0, 0, 0, 0)
SEED = 0


def _emoji_font() -> bool:
    """Whether fontconfig knows a colour emoji font (Debian: fonts-noto-color-emoji)."""
    if shutil.which("fc-list") is None:
        return False
    listed = subprocess.run(["fc-list", ":", "family"], capture_output=True, text=True, check=False).stdout
    return "Color Emoji" in listed


# The pixels of one emoji drawn in the table's own font: a colour font paints coloured pixels,
# an empty box (no font has the glyph) only the black of the fill.
COLOURED_JS = """(() => {{
  const cells = [...document.querySelectorAll("#uc-emoji table.strings tbody td")];
  const cell = cells.find(td => td.textContent === {emoji});
  if (!cell) throw new Error("no cell " + {emoji});
  const canvas = document.createElement("canvas");
  canvas.width = canvas.height = 64;
  const g = canvas.getContext("2d");
  const style = getComputedStyle(cell);
  g.font = "40px " + style.fontFamily;
  g.fillStyle = "#000";
  g.textBaseline = "top";
  g.fillText({emoji}, 4, 4);
  const px = g.getImageData(0, 0, 64, 64).data;
  let coloured = 0;
  for (let i = 0; i < px.length; i += 4) {{
    if (px[i + 3] > 0 && Math.max(px[i], px[i + 1], px[i + 2]) - Math.min(px[i], px[i + 1], px[i + 2]) > 60) coloured++;
  }}
  return coloured;
}})()"""

ROWS_JS = """[...document.querySelectorAll("#uc-emoji table.strings tbody tr")].map(
  row => [...row.querySelectorAll("td")].map(td => td.textContent.trim()))"""


def _populate(path: Path, registry: Any, period: int) -> None:
    """The emoji use case's reports of one period: ``REPORTS[i]`` devices report ``EMOJI[i]``."""
    uc = registry.use_cases["emoji"]
    rng = SeededRandom(SEED)
    values = [e for e, n in zip(EMOJI, REPORTS, strict=True) for _ in range(n)]
    reports = [
        make_report(uc, registry, period=period, records=[uc.mechanism.privatize(v, None, rng)[0]], rng=rng)
        for v in values
    ]
    store = CheckpointStore(path, registry, instance="dash")
    try:
        store.commit([decode_report(encode_report(r), registry) for r in reports], {"messages": len(reports)})
    finally:
        store.close()


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
@pytest.mark.skipif(not _emoji_font(), reason="no colour emoji font (apt-get install fonts-noto-color-emoji)")
@run_async
async def test_released_emoji_are_drawn_and_every_row_agrees_with_itself(tmp_path: Path) -> None:
    """A barely released entry shows its interval alone; the others' count, SE and CI agree; the emoji are in colour."""
    registry_path = write_registry(tmp_path / "registry")
    (tmp_path / "registry" / "emoji.txt").write_text("\n".join(EMOJI) + "\n", encoding="utf-8")
    registry = load_registry(registry_path)
    _populate(tmp_path / "dash.sqlite3", registry, current_period(registry, "emoji", time.time()))
    api = HttpApi(_config(tmp_path, registry_path))
    port = await api.start()
    serving = asyncio.create_task(api.serve())
    try:
        status, _, body = await asyncio.to_thread(_get, port, "/api/v1/use-cases/emoji/estimate")
        assert status == 200, body
        estimate = json.loads(body)["estimate"]
        async with (
            asyncio.timeout(240),
            start_chromium(CHROMIUM or "", tmp_path / "profile") as browser,
            open_page(browser) as page,
        ):
            await page.send(
                "Emulation.setDeviceMetricsOverride",
                {"width": 1280, "height": 1600, "deviceScaleFactor": 1, "mobile": False},
            )
            await page.navigate(f"http://127.0.0.1:{port}/?rows=10")
            ready = await page.wait_for(READY_JS)
            assert ready == "1", await page.evaluate('document.getElementById("error").textContent')
            rows = await page.evaluate(ROWS_JS)
            coloured = {
                e["value"]: await page.evaluate(COLOURED_JS.format(emoji=json.dumps(e["value"])))
                for e in estimate["items"]
            }
            legend = await page.evaluate('document.querySelector("#uc-emoji .near-legend").textContent')
            await page.evaluate('document.querySelector("#uc-emoji").scrollIntoView()')
            shot = await page.send("Page.captureScreenshot", {"format": "png"})
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
    png = tmp_path / "dashboard-numbers.png"
    png.write_bytes(base64.b64decode(shot["data"]))
    if SCREENSHOT_DIR:
        os.makedirs(SCREENSHOT_DIR, exist_ok=True)
        shutil.copy(png, Path(SCREENSHOT_DIR) / png.name)
    items = estimate["items"]
    near = [i for i in items if i.get("near_cutoff")]
    assert [i["value"] for i in near] == ["👍"], items  # the seed gives one barely released entry
    assert legend == estimate["near_cutoff"]
    assert rows == [shown_row(i) for i in items]
    assert rows[-1][1:3] == ["near cutoff", ""]
    assert rows[-1][3] == f"{format_number(near[0]['ci'][0])} … {format_number(near[0]['ci'][1])}"
    z = 1.959963984540054
    for item in items:
        if item.get("near_cutoff"):
            continue
        low, high = item["ci"]
        spread = item["selection_standard_error"]
        # The count lies inside its interval, and the interval is count ± z SE to a quarter SE.
        assert low <= item["count"] <= high
        assert abs(low - (item["count"] - z * spread)) <= 0.25 * spread
        assert abs(high - (item["count"] + z * spread)) <= 0.25 * spread
    # Every released emoji is drawn by a colour font (an empty box would have no coloured pixel).
    assert all(n > 50 for n in coloured.values()), coloured
    assert png.stat().st_size > 20_000
