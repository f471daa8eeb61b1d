# ruff: noqa: E501  (the page is an embedded HTML/JavaScript asset, formatted for reading as such)
"""The dashboard: one self-contained HTML page (inline CSS, JavaScript and SVG; no CDN).

It reads the JSON API (relative URLs, so it works behind a path prefix) and draws, per use
case (per definition, while a registry change rolls out: each definition that has reports gets
a card of its own, titled with its ref, marked current or earlier, and retired when it is; under
the title its owner and end date, and a mark on a use case past that date, whose data is kept): the
mean or proportion per period over time with its confidence band; the histogram
with error bars (confidence intervals) and the consistent (projected) histogram; the table
of discovered strings with counts, standard errors, intervals and p-values (the first 50
rows, or ``?rows=N``, with how many more are hidden and a button showing them all); reports
per period, labelled by period; and why an estimate is withheld when it is. Every card has a
period picker (kept in the address as ``?period.NAME=P``; default the API's latest releasable
period), a one-line release rule, and under a frequency table the withheld entries with their
reasons (``?withheld=1``). Every number goes through one formatter (``collector.numbers``, the
CLI's too: ``fmt``, :func:`~collector.numbers.format_number`); axes have round ticks that include zero,
titles, and labels spaced so they neither overlap nor leave the chart. The ε on each card is
the one charged per report (``epsilon_report``), with the registry's declared bound if looser;
under the latest period, the period's central (ε, δ) (``central``, in ``.central``). ``body[data-ready]`` turns to ``1``
once everything is drawn (``error`` on failure), for headless checks.

The chart code here is the project's second and last plotter: it runs in the browser, on the
live API, so it cannot be matplotlib. Every plot written to a file (the fleet report, the
benchmarks) is drawn by the first, ``fleet/plots.py``; do not add a third.
"""

from __future__ import annotations

import json

from collector.numbers import FORMAT_JS
from collector.results import json_schema

__all__ = ["DASHBOARD_HTML", "SCHEMA_CHECK_JS"]


SCHEMA_CHECK_JS = r"""
// Every response the page reads is checked against the JSON Schema generated from the
// collector's result types (collector/results.py, embedded below as SCHEMA): reading a field
// the schema does not define throws, so a field renamed there fails this page (and its
// headless test) instead of drawing "undefined".
function schemaOf(s) {
  while (s && s.$ref) s = SCHEMA.$defs[s.$ref.split("/").pop()];
  return s || {};
}
function variantsOf(s) {
  s = schemaOf(s);
  return s.anyOf ? s.anyOf.flatMap(variantsOf) : [s];
}
function checked(value, schema, path) {
  if (value === null || typeof value !== "object") return value;
  const variants = variantsOf(schema);
  if (Array.isArray(value)) {
    const item = i => ({anyOf: variants.flatMap(v => v.prefixItems ? [v.prefixItems[i] || {}] : v.items ? [v.items] : [])});
    return new Proxy(value, {get(t, k, r) {
      const x = Reflect.get(t, k, r);
      return typeof k === "string" && /^[0-9]+$/.test(k) ? checked(x, item(+k), `${path}[${k}]`) : x;
    }});
  }
  const fields = new Map(), values = [];
  let strict = false;
  for (const v of variants) {
    if (v.properties) strict = true;
    for (const [k, p] of Object.entries(v.properties || {})) fields.set(k, (fields.get(k) || []).concat([p]));
    if (v.additionalProperties && typeof v.additionalProperties === "object") values.push(v.additionalProperties);
  }
  if (!strict && values.length === 0) return value;  // a schema that says nothing of its fields
  return new Proxy(value, {get(t, k, r) {
    if (typeof k !== "string" || k === "then" || k in Object.prototype) return Reflect.get(t, k, r);
    if (fields.has(k)) return checked(t[k], {anyOf: fields.get(k)}, `${path}.${k}`);
    if (values.length && !strict) return checked(t[k], {anyOf: values}, `${path}.${k}`);
    throw new Error(`the dashboard reads ${path}.${k}, which the API's schema does not define`);
  }});
}
"""
"""The schema check of every response the page reads (a function of the page's ``SCHEMA``)."""

_SCHEMA_JSON = json.dumps(json_schema(), sort_keys=True).replace("</", "<\\/")

DASHBOARD_HTML = (
    r"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>ldp-collector</title>
<style>
  :root { --fg:#1d2433; --muted:#667085; --line:#d0d5dd; --accent:#2f6fde; --band:#2f6fde33; --bar:#5b8def; --warn:#b54708; }
  * { box-sizing: border-box; }
  /* Emoji from a colour emoji font wherever one is installed: first in the stack, but only for the
     emoji code points, so a text face with black-and-white emoticons (DejaVu) or none (an empty
     box) never draws a released emoji, and letters and digits keep the text face. */
  @font-face { font-family: "ldp-emoji"; src: local("Apple Color Emoji"), local("Segoe UI Emoji"), local("Noto Color Emoji"), local("NotoColorEmoji");
               unicode-range: U+1F000-1FAFF, U+2300-23FF, U+2600-27BF, U+2B00-2BFF, U+200D, U+20E3, U+FE0F, U+E0020-E007F; }
  body { font: 14px/1.45 "ldp-emoji", system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg); margin: 0; background: #f5f7fa; }
  td.near { color: var(--muted); font-style: italic; }
  header { background: #101828; color: #fff; padding: 14px 24px; display: flex; gap: 24px; align-items: baseline; flex-wrap: wrap; }
  header h1 { font-size: 18px; margin: 0; font-weight: 600; }
  header .kv { color: #d0d5dd; font-size: 13px; }
  header .kv b { color: #fff; font-weight: 600; }
  main { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 16px; padding: 16px 24px; }
  .card { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 14px 16px; }
  .card h2 { font-size: 15px; margin: 0 0 2px; }
  .card .sub { color: var(--muted); font-size: 12px; margin-bottom: 8px; }
  .headline { font-size: 20px; font-weight: 600; margin: 4px 0 8px; }
  .headline small { font-size: 13px; color: var(--muted); font-weight: 400; }
  .withheld { color: var(--warn); margin: 8px 0; }
  table { border-collapse: collapse; width: 100%; font-size: 13px; }
  th, td { text-align: right; padding: 3px 6px; border-bottom: 1px solid #eaecf0; }
  th:first-child, td:first-child { text-align: left; }
  th { color: var(--muted); font-weight: 500; }
  svg { display: block; }
  svg.reports { margin-top: 10px; }
  svg text { font-size: 11px; fill: var(--muted); }
  svg .title { fill: var(--fg); font-size: 12px; }
  svg .axis-title { fill: var(--fg); }
  .hidden-rows { color: var(--muted); font-size: 12px; margin-top: 6px; }
  .legend { color: var(--muted); font-size: 12px; margin-top: 6px; }
  .picker select { font: inherit; margin-left: 4px; }
  .release-rule cite { font-style: normal; }
  details.withheld-list { margin-top: 8px; font-size: 13px; }
  details.withheld-list summary { color: var(--warn); cursor: pointer; }
  td.reason { text-align: left; color: var(--muted); }
  .hidden-rows button { font: inherit; margin-left: 6px; }
  .error { color: #b42318; padding: 16px 24px; white-space: pre-wrap; }
  .rejects { font-size: 12px; color: #d0d5dd; }
  .role { display: inline-block; font-size: 11px; font-weight: 600; border-radius: 4px; padding: 1px 6px; margin-left: 8px; vertical-align: 2px; }
  .role.current { background: #d1fadf; color: #05603a; }
  .role.earlier { background: #fef0c7; color: #93370d; }
  .role.expired { background: #fee4e2; color: #b42318; }
  .expired-note { color: #b42318; }
</style>
</head>
<body data-ready="0">
<header>
  <h1>ldp-collector</h1>
  <span class="kv" id="summary">loading…</span>
</header>
<div class="error" id="error" hidden></div>
<main id="cards"></main>
<script type="application/json" id="schema">"""
    + _SCHEMA_JSON
    + r"""</script>
<script>
"use strict";
const NS = "http://www.w3.org/2000/svg";
const SCHEMA = JSON.parse(document.getElementById("schema").textContent);
"""
    + SCHEMA_CHECK_JS
    + FORMAT_JS
    + r"""

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const c of children) node.append(c);
  return node;
}

function sv(tag, attrs, ...children) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const c of children) node.append(c);
  return node;
}

async function getJSON(url, kind) {
  const r = await fetch(url, {cache: "no-store"});
  if (!r.ok) throw new Error(url + ": HTTP " + r.status + " " + (await r.text()));
  return checked(await r.json(), SCHEMA.responses[kind], kind);
}

function scale(d0, d1, r0, r1) {
  const span = d1 - d0 || 1;
  return v => r0 + (v - d0) / span * (r1 - r0);
}

// Approximate width of an 11px label: enough to keep labels apart and inside the chart.
const textWidth = s => 6.6 * String(s).length;

// Ticks at multiples of a 1-2-2.5-5 step covering [lo, hi]: round labels, and zero among them
// whenever the range spans it.
function ticks(lo, hi, count) {
  if (!(isFinite(lo) && isFinite(hi))) { lo = 0; hi = 1; }
  if (lo === hi) { const d = Math.abs(lo) * 0.1 || 1; lo -= d; hi += d; }
  const raw = (hi - lo) / Math.max(count, 1), mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 2.5, 5, 10].map(f => f * mag).find(v => v >= raw * (1 - 1e-9));
  const first = Math.floor(lo / step + 1e-9), last = Math.ceil(hi / step - 1e-9);
  const out = [];
  for (let i = first; i <= last; i++) out.push(i === 0 ? 0 : i * step);
  return out;
}

// A left axis: grid lines, labels that fit the margin, the zero line, and the axis title.
function yAxis(g, y, values, x0, x1, title, top, bottom) {
  for (const v of values) {
    g.append(sv("line", {x1: x0, x2: x1, y1: y(v), y2: y(v), stroke: v === 0 ? "#98a2b3" : "#eaecf0"}));
    g.append(sv("text", {x: x0 - 6, y: y(v) + 4, "text-anchor": "end", class: "tick"}, fmt(v)));
  }
  const mid = (top + bottom) / 2;
  g.append(sv("text", {x: 12, y: mid, transform: `rotate(-90 12 ${mid})`, "text-anchor": "middle", class: "axis-title", "data-axis": "y"}, title));
}

// The left margin that holds the widest tick label and the rotated axis title.
const leftMargin = values => Math.max(48, 30 + Math.max(...values.map(v => textWidth(fmt(v)))));

// Indices of labels of width `width` placed every `slot` pixels that do not overlap.
function spaced(count, slot, width) {
  const every = Math.max(1, Math.ceil((width + 8) / Math.max(slot, 1e-9)));
  const out = [];
  for (let i = 0; i < count; i += every) out.push(i);
  if (out[out.length - 1] !== count - 1 && (count - 1 - out[out.length - 1]) * slot >= width + 8) out.push(count - 1);
  return out;
}

// Mean or proportion per period: line, points, confidence band.
function seriesChart(series, label) {
  const pts = series.points.filter(p => p.value !== undefined && p.value !== null);
  const W = 540, H = 240, R = 40, T = 22, B = 44;
  const svg = sv("svg", {width: W, height: H, viewBox: `0 0 ${W} ${H}`, class: "chart series", "data-points": pts.length});
  if (pts.length === 0) {
    svg.append(sv("text", {x: W / 2, y: H / 2, "text-anchor": "middle"}, "no released periods yet"));
    return svg;
  }
  const ys = ticks(Math.min(...pts.map(p => p.ci[0])), Math.max(...pts.map(p => p.ci[1])), 4);
  const L = leftMargin(ys);
  svg.append(legendTitle(L, 14, `${label} per period: `, [["point", "var(--accent)", "●", "estimate"], ["ci-band", "var(--band)", "■", `${fmt(series.confidence * 100)}% CI`]]));
  const x = scale(0, Math.max(pts.length - 1, 1), L + 10, W - R), y = scale(ys[0], ys[ys.length - 1], H - B, T);
  const g = sv("g");
  yAxis(g, y, ys, L, W - R + 10, label, T, H - B);
  const upper = pts.map((p, i) => `${x(i)},${y(p.ci[1])}`);
  const lower = pts.map((p, i) => `${x(i)},${y(p.ci[0])}`).reverse();
  if (pts.length > 1) g.append(sv("polygon", {points: upper.concat(lower).join(" "), fill: "var(--band)", class: "ci-band"}));
  pts.forEach((p, i) => {
    if (pts.length === 1) g.append(sv("line", {x1: x(i), x2: x(i), y1: y(p.ci[0]), y2: y(p.ci[1]), stroke: "var(--accent)", "stroke-width": 2, class: "ci-band"}));
  });
  g.append(sv("polyline", {points: pts.map((p, i) => `${x(i)},${y(p.value)}`).join(" "), fill: "none", stroke: "var(--accent)", "stroke-width": 2}));
  pts.forEach((p, i) => {
    const c = sv("circle", {cx: x(i), cy: y(p.value), r: 3.5, fill: "var(--accent)", class: "point"});
    c.append(sv("title", {}, `${p.period_start}: ${fmt(p.value)} ± ${fmt(p.standard_error)} (SE), ${fmt(p.reports)} reports`));
    g.append(c);
  });
  const slot = pts.length > 1 ? x(1) - x(0) : W;
  for (const i of spaced(pts.length, slot, textWidth("00-00 00:00")))
    g.append(sv("text", {x: x(i), y: H - B + 16, "text-anchor": "middle", class: "tick"}, stamp(pts[i])));
  g.append(sv("text", {x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle", class: "axis-title", "data-axis": "x"}, "period start (UTC, month-day hour:minute)"));
  svg.append(g);
  return svg;
}

// Histogram: bars (estimate), error bars (CI), diamonds (consistent histogram).
function histogramChart(est, confidence) {
  const b = est.buckets;
  const W = 540, H = 260, R = 28, T = 22, B = 46;
  const svg = sv("svg", {width: W, height: H, viewBox: `0 0 ${W} ${H}`, class: "chart histogram", "data-bars": b.length});
  const vals = b.flatMap(v => [v.ci[0], v.ci[1], v.consistent, 0]).filter(v => v !== null);
  const ys = ticks(Math.min(...vals), Math.max(...vals), 4);
  const L = leftMargin(ys);
  svg.append(legendTitle(L, 14, "per bucket: ", [["bar", "var(--bar)", "■", "estimate"], ["error-bar", "#101828", "┃", `${fmt(confidence * 100)}% CI`], ["consistent", "#f79009", "◆", "consistent"]]));
  const y = scale(ys[0], ys[ys.length - 1], H - B, T);
  const slot = (W - L - R) / b.length;
  const g = sv("g");
  yAxis(g, y, ys, L, W - R, "share of devices", T, H - B);
  b.forEach((v, i) => {
    const x0 = L + i * slot + slot * 0.15, w = slot * 0.7, cx = x0 + w / 2;
    const top = y(Math.max(v.value, 0)), base = y(Math.min(v.value, 0));
    const bar = sv("rect", {x: x0, y: Math.min(top, base), width: w, height: Math.max(Math.abs(base - top), 0.5), fill: "var(--bar)", class: "bar"});
    bar.append(sv("title", {}, `[${edge(v.low)}, ${edge(v.high)}): ${fmt(v.value)} ± ${fmt(v.standard_error)} (SE)`));
    g.append(bar);
    if (v.ci[0] !== null && v.ci[1] !== null) {
      g.append(sv("line", {x1: cx, x2: cx, y1: y(v.ci[0]), y2: y(v.ci[1]), stroke: "#101828", "stroke-width": 1.3, class: "error-bar"}));
      for (const end of v.ci) g.append(sv("line", {x1: cx - w * 0.2, x2: cx + w * 0.2, y1: y(end), y2: y(end), stroke: "#101828", "stroke-width": 1.3}));
    }
    if (v.consistent !== null) g.append(sv("path", {d: `M${cx},${y(v.consistent) - 4} l4,4 l-4,4 l-4,-4 z`, fill: "#f79009", class: "consistent"}));
  });
  // Labels on the bucket edges (every one that fits), the last edge included when it fits.
  const edges = b.map(v => v.low).concat([b[b.length - 1].high]);
  const widest = Math.max(...edges.map(e => textWidth(edge(e))));
  for (const i of spaced(edges.length, slot, widest)) {
    g.append(sv("line", {x1: L + i * slot, x2: L + i * slot, y1: H - B, y2: H - B + 4, stroke: "#98a2b3"}));
    g.append(sv("text", {x: L + i * slot, y: H - B + 16, "text-anchor": "middle", class: "tick"}, edge(edges[i])));
  }
  // The registry declares no unit for a histogram's values, so the axis names what it shows.
  g.append(sv("text", {x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle", class: "axis-title", "data-axis": "x"}, "bucket (value range: low edge … high edge)"));
  svg.append(g);
  return svg;
}

const edge = v => v === null ? "∞" : fmt(v, 6);

// A chart title followed by legend entries, each marker filled with the colour the chart draws
// its element in (data-mark names that element's class, for the headless check).
function legendTitle(x, y, text, entries) {
  const t = sv("text", {x, y, class: "title"}, text);
  entries.forEach(([mark, colour, glyph, label], i) => {
    t.append(sv("tspan", {class: "legend-marker", "data-mark": mark, fill: colour}, glyph));
    t.append(` ${label}${i < entries.length - 1 ? " · " : ""}`);
  });
  return t;
}

const stamp = p => p.period_start.slice(5, 16).replace("T", " ");

function reportsChart(series) {
  const pts = series.points;
  const max = Math.max(1, ...pts.map(p => p.reports));
  const W = 540, H = 124, R = 12, T = 22, B = 38, L = leftMargin([0, max]);
  const svg = sv("svg", {width: W, height: H, viewBox: `0 0 ${W} ${H}`, class: "chart reports"});
  svg.append(legendTitle(L, 12, "reports per period: ", [["released", "#98a2b3", "■", "released"], ["unreleased", "#fdb022", "■", "below min_reports, not released"]]));
  const slot = (W - L - R) / Math.max(pts.length, 1);
  pts.forEach((p, i) => {
    const h = (H - T - B) * p.reports / max;
    const r = sv("rect", {x: L + i * slot + 1, y: H - B - h, width: Math.max(slot - 2, 1), height: h, fill: p.released ? "#98a2b3" : "#fdb022", class: p.released ? "released" : "unreleased"});
    r.append(sv("title", {}, `${p.period_start}: ${fmt(p.reports)} reports${p.released ? "" : " (below min_reports)"}`));
    svg.append(r);
  });
  svg.append(sv("line", {x1: L, x2: W - R, y1: H - B, y2: H - B, stroke: "#98a2b3"}));
  svg.append(sv("text", {x: L - 6, y: T + 8, "text-anchor": "end", class: "tick"}, fmt(max)));
  svg.append(sv("text", {x: L - 6, y: H - B, "text-anchor": "end", class: "tick"}, "0"));
  for (const i of spaced(pts.length, slot, textWidth("00-00 00:00")))
    svg.append(sv("text", {x: L + (i + 0.5) * slot, y: H - B + 14, "text-anchor": "middle", class: "tick period-label"}, stamp(pts[i])));
  const mid = (T + H - B) / 2;
  svg.append(sv("text", {x: 12, y: mid, transform: `rotate(-90 12 ${mid})`, "text-anchor": "middle", class: "axis-title", "data-axis": "y"}, "reports"));
  svg.append(sv("text", {x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle", class: "axis-title", "data-axis": "x"}, "period start (UTC)"));
  return svg;
}

function correctionText(e) {
  // pfer's level counts false strings; the other corrections' is a rate (stats.py).
  if (!e.correction) return "";
  if (e.correction === "pfer") return ` · pfer: at most ${fmt(e.alpha)} false strings expected`;
  return ` · ${e.correction} at α = ${fmt(e.alpha)}`;
}

// The release rule in one line, in words, with where it is explained (docs/estimation.md;
// wire-format.md's collector.correction).
const CORRECTIONS = {bh: "Benjamini–Hochberg", bonferroni: "Bonferroni", storey: "Storey's adaptive Benjamini–Hochberg"};
function releaseRule(est) {
  const e = est.estimate;
  let rule;
  if (est.kind !== "frequencies" || !e || e.tested === undefined) {
    rule = `released: at least ${fmt(est.min_reports)} reports in the period`;
  } else {
    const test = e.correction === "pfer" ? `with at most ${fmt(e.alpha)} false releases expected`
      : `significant after ${CORRECTIONS[e.correction] || e.correction} at α = ${fmt(e.alpha)}`;
    rule = `released: estimate ≥ ${fmt(e.threshold)} and ${test} over ${fmt(e.tested)} entries tested, with at least ${fmt(est.min_reports)} reports`;
  }
  const line = el("div", {class: "sub release-rule"}, rule + " — ");
  line.append(el("cite", {class: "doc-ref", title: "in the collector's documentation"}, "docs/estimation.md"));
  return line;
}

// How much of the period's reports the fitted entries leave unexplained (RAPPOR's candidates:
// collector/results.py FitFigures, docs/estimation.md "RAPPOR: what the candidates do not
// explain"); the same figures as the CLI's line (collector/rendering.py fit_text).
function fitLine(fit) {
  let share = fit.unexplained_share === null ? "unknown" : `${fmt(100 * fit.unexplained_share, 2)} %`;
  if (fit.unexplained_share !== null && fit.unexplained_share_standard_error !== null)
    share += ` ± ${fmt(100 * fit.unexplained_share_standard_error, 2)} %`;
  let text = `unexplained: ${share} of the reports, by the ${fmt(fit.fitted)} fitted entries`;
  if (fit.dispersion !== undefined && fit.dispersion !== null) text += ` · dispersion ${fmt(fit.dispersion, 3)}`;
  if (fit.widened) text += ` · ${fmt(fit.widened)} standard errors widened by the residuals`;
  const line = el("div", {class: "sub fit", title: fit.standard_errors || "",
                          "data-unexplained-share": fit.unexplained_share === null ? "" : String(fit.unexplained_share)}, text);
  return line;
}

// Rows shown before "show all" (?rows=N changes it).
const ROW_LIMIT = Math.max(1, parseInt(new URLSearchParams(location.search).get("rows"), 10) || 50);

function stringsTable(est, confidence) {
  const items = est.items;
  const hasP = items.some(i => i.p_value !== undefined);
  const head = el("tr", {}, el("th", {}, "value"), el("th", {}, "count"), el("th", {}, "SE"),
                  el("th", {title: est.interval || ""}, `${fmt(confidence * 100)}% CI`));
  if (hasP) head.append(el("th", {}, "p-value"));
  const table = el("table", {class: "strings"}, el("thead", {}, head));
  const body = el("tbody");
  const fill = rows => {
    body.textContent = "";
    for (const it of rows) {
      // A released entry's SE is the spread of its interval conditional on release; one that
      // barely crossed the cutoff is shown by that interval alone, which no count ± spread
      // describes (docs/estimation.md, "What is shown").
      const se = it.selection_standard_error !== undefined ? it.selection_standard_error : it.standard_error;
      const near = it.near_cutoff === true;
      const row = el("tr", near ? {class: "near-cutoff"} : {}, el("td", {}, it.value),
                     el("td", near ? {class: "near", title: est.near_cutoff || ""} : {}, near ? "near cutoff" : fmt(it.count)),
                     el("td", {}, near ? "" : fmt(se)), el("td", {}, `${fmt(it.ci[0])} … ${fmt(it.ci[1])}`));
      if (hasP) row.append(el("td", {}, fmt(it.p_value, 2)));
      body.append(row);
    }
  };
  fill(items.slice(0, ROW_LIMIT));
  table.append(body);
  const box = el("div", {}, table);
  // What the interval column means: a released entry's interval holds among released entries
  // (docs/estimation.md, "Intervals after selection").
  if (est.interval) box.append(el("div", {class: "legend interval-legend"}, `SE and CI: ${est.interval}`));
  if (est.near_cutoff) box.append(el("div", {class: "legend near-legend"}, est.near_cutoff));
  if (items.length > ROW_LIMIT) {
    const note = el("div", {class: "hidden-rows"},
                    `${fmt(items.length - ROW_LIMIT)} more rows hidden (showing the ${fmt(ROW_LIMIT)} largest of ${fmt(items.length)}) `);
    const button = el("button", {type: "button", class: "show-all"}, `show all ${fmt(items.length)}`);
    button.addEventListener("click", () => { fill(items); note.remove(); });
    note.append(button);
    box.append(note);
  }
  return box;
}

// While a registry change rolls out, a use case has several definitions with reports: each gets
// its own card, titled with its ref (name@hash) and marked current or earlier (and retired).
function roleText(uc) {
  if (uc.current) return "current definition";
  const from = uc.registries && uc.registries.length ? ` (${uc.registries.join(", ")})` : "";
  return "earlier definition" + from + (uc.retired_from ? ` · retired from ${uc.retired_from}` : "");
}

// The period's central guarantee (collector/amplification.py, docs/privacy-accounting.md): what
// the shuffled batch reveals of one record to whoever sees only what the collector keeps,
// next to the ε the record costs on the device.
function centralLine(g) {
  const line = el("div", {class: "sub central", "data-epsilon": g.epsilon === null ? "" : String(g.epsilon),
                          "data-delta": String(g.delta)});
  const amplified = g.epsilon === null ? "no amplified ε stated" : `(ε ${fmt(g.epsilon)}, δ ${fmt(g.delta)})`;
  line.append("central guarantee of the period: ", el("b", {}, amplified),
              ` for ${g.unit} among ${fmt(g.n)} shuffled reports · ε ${fmt(g.epsilon_local)} per record on the device · ${g.bound}` +
              (g.note ? ` · ${g.note}` : ""));
  return line;
}

// Who answers for a use case and until when (its registry's owner and expires, protocol/metadata.py).
// Past its end date agents record nothing more; what was collected is kept and drawn as before.
function ownership(uc) {
  const line = el("div", {class: "sub ownership"});
  line.append(uc.owner ? `owner ${uc.owner}` : "no owner named in the registry");
  if (!uc.expires) line.append(" · no end date");
  else if (uc.expired) line.append(" · ", el("b", {class: "expired-note"}, `expired on ${uc.expires}`), ": agents record nothing more; the data below is kept");
  else line.append(` · collects until ${uc.expires}`);
  if (uc.data_review) line.append(" · ", el("a", {href: uc.data_review}, "data review"));
  return line;
}

function card(name, uc, several) {
  const c = el("section", {class: "card", id: "uc-" + name, "data-kind": uc.kind, "data-expired": uc.expired ? "1" : "0"});
  const title = el("h2", {}, name);
  if (several) title.append(el("span", {class: "role " + (uc.current ? "current" : "earlier")}, roleText(uc)));
  if (uc.expired) title.append(el("span", {class: "role expired"}, "expired"));
  c.append(title);
  c.append(ownership(uc));
  // The ε a device is charged per report (the mechanism's exact figure), and the registry's
  // declared bound when that is looser.
  const declared = uc.epsilon > uc.epsilon_report * (1 + 1e-9) ? ` (declared ≤ ${fmt(uc.epsilon)})` : "";
  c.append(el("div", {class: "sub"}, `${uc.mechanism} · ε ${fmt(uc.epsilon_report)} per report${declared} · period ${uc.period} · min ${fmt(uc.min_reports)} reports` +
                                       (uc.release_threshold ? ` · threshold ${fmt(uc.release_threshold)}` : "") +
                                       (uc.description ? ` — ${uc.description}` : "")));
  return c;
}

// The entries a period did not release, with why: the API's ?withheld=1, in a list that opens
// on demand (the first ROW_LIMIT, largest first).
function withheldList(items) {
  const box = el("details", {class: "withheld-list"});
  box.append(el("summary", {}, `${fmt(items.length)} withheld ${items.length === 1 ? "entry" : "entries"} and why`));
  const table = el("table", {class: "withheld-entries"},
                   el("thead", {}, el("tr", {}, el("th", {}, "value"), el("th", {}, "count"), el("th", {}, "SE"),
                                      el("th", {}, "p-value"), el("th", {}, "why withheld"))));
  const body = el("tbody");
  for (const it of items.slice(0, ROW_LIMIT))
    body.append(el("tr", {}, el("td", {}, it.value), el("td", {}, fmt(it.count)), el("td", {}, fmt(it.standard_error)),
                   el("td", {}, fmt(it.p_value, 2)), el("td", {class: "reason"}, it.withheld_reason || "")));
  table.append(body);
  box.append(table);
  if (items.length > ROW_LIMIT) box.append(el("div", {class: "hidden-rows"}, `${fmt(items.length - ROW_LIMIT)} more not shown`));
  return box;
}

// The period a card shows: ?period.NAME=P (the picker writes it, so a reload or a shared link
// keeps the choice); without it, the API's default (the latest releasable period).
const PICKED = new URLSearchParams(location.search);

function periodPicker(name, periods, onPick) {
  const select = el("select", {class: "period-picker", "aria-label": `period of ${name}`});
  for (const p of periods.slice().reverse())
    select.append(el("option", {value: String(p.period)}, `${p.period_start.slice(0, 16).replace("T", " ")} UTC · ${fmt(p.reports)} reports`));
  select.addEventListener("change", () => {
    PICKED.set("period." + name, select.value);
    history.replaceState(null, "", "?" + PICKED.toString());
    onPick(select.value);
  });
  return el("label", {class: "sub picker"}, "period ", select);
}

// One period of a card: its summary, its estimate (headline, histogram or table), the release
// rule and the withheld entries. Nothing is drawn (false) when `latest()` says a later pick
// superseded this one while its answer was on its way: answers may arrive out of order.
async function renderPeriod(body, select, base, period, series, latest) {
  const query = (period === null ? "?" : `?period=${encodeURIComponent(period)}&`) + "withheld=1";
  const est = await getJSON(base + "/estimate" + query, "estimate");
  if (!latest()) return false;
  if (![...select.options].some(o => o.value === String(est.period)))
    select.append(el("option", {value: String(est.period)}, `${est.period_start.slice(0, 16).replace("T", " ")} UTC · ${fmt(est.reports)} reports`));
  select.value = String(est.period);
  body.textContent = "";
  body.dataset.period = String(est.period);
  body.append(el("div", {class: "sub"}, `period ${est.period_start} … ${est.period_end}: ${fmt(est.reports)} reports, ${fmt(est.records)} records`));
  if (est.central) body.append(centralLine(est.central));
  body.append(releaseRule(est));
  if (!est.released) {
    body.append(el("div", {class: "withheld"}, "not released: " + est.withheld_reason));
  } else if (est.kind === "proportion" || est.kind === "mean") {
    const e = est.estimate;
    const h = el("div", {class: "headline"}, `${fmt(e.value)} `);
    h.append(el("small", {}, `± ${fmt(e.standard_error)} (SE) · ${fmt(est.confidence * 100)}% CI ${fmt(e.ci[0])} … ${fmt(e.ci[1])}` +
                             (e.range ? ` · range ${fmt(e.range[0])} … ${fmt(e.range[1])}` : "")));
    body.append(h);
    body.append(seriesChart(series, est.kind === "mean" ? "mean per device" : "share of devices"));
  } else if (est.kind === "histogram") {
    body.append(histogramChart(est.estimate, est.confidence));
  } else {
    const e = est.estimate;
    const what = e.discovered ? `${fmt(e.items.length)} discovered strings` : `${fmt(e.items.length)} of ${fmt(e.tested)} dictionary entries released`;
    body.append(el("div", {class: "sub"}, `${what}` + (e.withheld ? ` · ${fmt(e.withheld)} withheld (below the release threshold, or not significantly above it)` : "") +
                                         correctionText(e)));
    body.append(stringsTable(e, est.confidence));
    if (e.fit !== undefined) body.append(fitLine(e.fit));
    if (e.withheld_items && e.withheld_items.length) body.append(withheldList(e.withheld_items));
  }
  return true;
}

async function renderUseCase(name, uc, several) {
  const c = card(name, uc, several);
  document.getElementById("cards").append(c);
  if (uc.periods.length === 0) { c.append(el("div", {class: "withheld"}, "no reports yet")); return; }
  const base = `api/v1/use-cases/${encodeURIComponent(name)}`;
  const series = await getJSON(base + "/series", "series");
  const body = el("div", {class: "period-body"});
  // Each draw counts; only the last one asked for may draw (the one the picker and address show).
  let asked = 0;
  const show = p => {
    const turn = ++asked;
    return renderPeriod(body, picker.querySelector("select"), base, p, series, () => turn === asked);
  };
  const picker = periodPicker(name, uc.periods, async p => {
    document.body.dataset.ready = "0";
    try { if (await show(p)) document.body.dataset.ready = "1"; }
    catch (err) { showError(err); }
  });
  c.append(picker, body, reportsChart(series));
  await show(PICKED.get("period." + name));
}

async function render() {
  const status = await getJSON("api/v1/status", "status");
  const counters = (status.live || {});
  const rejected = Object.entries(counters.rejected || {}).map(([k, v]) => `${k} ${fmt(v)}`).join(", ");
  const s = document.getElementById("summary");
  s.textContent = "";
  const kv = (k, v) => {
    if (s.childNodes.length) s.append("  ·  ");
    const span = el("span", {class: "kv-" + k.replace(/ /g, "-")}, k + " ");
    span.append(el("b", {}, String(v)));
    s.append(span);
  };
  kv("instance", status.instance);
  kv("registry", status.registry_hash.slice(0, 12) +
     ((status.registries || []).length > 1 ? ` (+ ${status.registries.length - 1} earlier)` : ""));
  // In a group the reports folded are every member's (one shared store); the live figures
  // after them are this member's own, and say so.
  const members = Object.keys(status.instances || {}).length;
  kv("reports folded", fmt(status.counters.reports || 0) + (members > 1 ? ` by ${members} collectors` : ""));
  if (status.live) {
    kv(members > 1 ? "messages to this one" : "messages", fmt(counters.messages));
    kv("duplicates", fmt(counters.duplicates));
    kv("lag", fmt(counters.aggregation_lag_seconds, 3) + " s");
    kv("checkpoint age", fmt(counters.checkpoint_age_seconds, 3) + " s");
    kv("buffer", fmt(100 * counters.buffer_fill, 3) + " %");
  }
  if (status.transport) kv("broker", status.transport.connected ? "connected" : "disconnected");
  if (rejected) s.append("  ·  ", el("span", {class: "rejects"}, "rejected: " + rejected));
  for (const [name, uc] of Object.entries(status.use_cases)) {
    // The current definition always; an earlier one while it has reports (devices still on it).
    const live = (uc.definitions || [uc]).filter(d => d.current || d.periods.length > 0);
    const several = live.length > 1 || !uc.in_current_registry;
    for (const d of live) await renderUseCase(several ? d.definition : name, d, several);
  }
}

// Fresh numbers once a minute (the server recomputes an estimate only when a commit changed it).
setTimeout(() => location.reload(), 60000);

// Labels that overlap one another or reach outside their chart, measured as drawn: the
// headless test reads the count from body[data-layout-problems] (0 when every label is clear).
function layoutProblems() {
  const problems = [];
  for (const svg of document.querySelectorAll("svg.chart")) {
    const frame = svg.getBoundingClientRect();
    const boxes = [...svg.querySelectorAll("text")].map(t => [t.textContent, t.getBoundingClientRect()]);
    boxes.forEach(([label, b], i) => {
      if (b.left < frame.left - 0.5 || b.right > frame.right + 0.5 || b.top < frame.top - 0.5 || b.bottom > frame.bottom + 0.5)
        problems.push(`clipped: ${label}`);
      for (const [other, c] of boxes.slice(i + 1))
        if (b.left < c.right - 1 && c.left < b.right - 1 && b.top < c.bottom - 1 && c.top < b.bottom - 1)
          problems.push(`overlap: ${label} / ${other}`);
    });
  }
  // The page's own text (titles, lines, tables, the picker) too: the box of every text node as
  // laid out, against every other of its card (hidden ones have no box and are skipped).
  for (const c of document.querySelectorAll("section.card")) {
    const walker = document.createTreeWalker(c, NodeFilter.SHOW_TEXT);
    const boxes = [];
    for (let n = walker.nextNode(); n; n = walker.nextNode()) {
      if (!n.textContent.trim() || n.parentElement.closest("svg, option")) continue;
      const range = document.createRange();
      range.selectNodeContents(n);
      for (const b of range.getClientRects()) if (b.width > 0 && b.height > 0) boxes.push([n.textContent.trim(), b]);
    }
    boxes.forEach(([label, b], i) => {
      for (const [other, d] of boxes.slice(i + 1))
        if (b.left < d.right - 1 && d.left < b.right - 1 && b.top < d.bottom - 1 && d.top < b.bottom - 1)
          problems.push(`overlap: ${label} / ${other}`);
    });
  }
  return problems;
}

function showError(err) {
  const box = document.getElementById("error");
  box.hidden = false;
  box.textContent = String(err && err.stack || err);
  document.body.dataset.ready = "error";
}

render().then(() => {
  const problems = layoutProblems();
  document.body.dataset.layoutProblems = String(problems.length);
  if (problems.length) console.warn("dashboard layout:", problems.join("; "));
  document.body.dataset.ready = "1";
}, showError);
</script>
</body>
</html>
"""
)
