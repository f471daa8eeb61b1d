"""The dashboard reads the API through the JSON Schema generated from the collector's result
types: the schema it embeds is the types', and a field the types do not define cannot be read."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from collector.dashboard import DASHBOARD_HTML, SCHEMA_CHECK_JS
from collector.results import json_schema

NODE = shutil.which("node")


def test_the_page_embeds_the_schema_of_the_result_types() -> None:
    """The schema in the page is json_schema() of collector/results.py, for each response the page reads."""
    start = DASHBOARD_HTML.index('<script type="application/json" id="schema">') + len(
        '<script type="application/json" id="schema">'
    )
    embedded = json.loads(DASHBOARD_HTML[start : DASHBOARD_HTML.index("</script>", start)])
    assert embedded == json_schema()
    assert set(embedded["responses"]) == {"estimate", "series", "status"}
    for name in embedded["responses"]:
        assert f'"{name}")' in DASHBOARD_HTML  # getJSON(url, name) names it


def _run(script: str) -> list[str]:
    assert NODE is not None
    program = f"const SCHEMA = {json.dumps(json_schema())};\n{SCHEMA_CHECK_JS}\n{script}"
    out = subprocess.run([NODE, "-e", program], capture_output=True, text=True, timeout=60, check=True).stdout
    result: list[str] = json.loads(out)
    return result


@pytest.mark.skipif(NODE is None, reason="node is not installed (deploy/test.sh installs it)")
def test_reading_an_undefined_field_throws_and_a_defined_one_does_not() -> None:
    """Declared fields (optional ones too, through unions, arrays and maps) read; anything else throws."""
    script = """
    const est = checked({released: true, estimate: {form: "frequencies", items: [{value: "a", count: 3}]}},
                        SCHEMA.responses.estimate, "estimate");
    const status = checked({use_cases: {emoji: {periods: [{reports: 4}]}}, live: null},
                           SCHEMA.responses.status, "status");
    const out = [];
    const attempt = f => { try { out.push(String(f())); } catch (e) { out.push("threw: " + e.message); } };
    attempt(() => est.released);
    attempt(() => est.estimate.items[0].count);
    attempt(() => est.estimate.range);            // a field of another form of estimate: declared
    attempt(() => est.estimate.items.length);     // arrays keep their own properties
    attempt(() => status.use_cases.emoji.periods[0].reports);
    attempt(() => status.live);
    attempt(() => est.estimat);
    attempt(() => est.estimate.items[0].cout);
    attempt(() => status.use_cases.emoji.period_count);
    console.log(JSON.stringify(out));
    """
    assert _run(script) == [
        "true",
        "3",
        "undefined",
        "1",
        "4",
        "null",
        "threw: the dashboard reads estimate.estimat, which the API's schema does not define",
        "threw: the dashboard reads estimate.estimate.items[0].cout, which the API's schema does not define",
        "threw: the dashboard reads status.use_cases.emoji.period_count, which the API's schema does not define",
    ]
