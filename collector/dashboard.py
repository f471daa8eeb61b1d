# ruff: noqa: E501  (the page is an embedded HTML/JavaScript asset, formatted for reading as such)
"""The dashboard: one self-contained HTML page (inline CSS, JavaScript and SVG; no CDN).

It reads the JSON API (relative URLs, so it works behind a path prefix) and draws, per use
case: the mean or proportion per period over time with its confidence band; the histogram
with error bars (confidence intervals) and the consistent (projected) histogram; the table
of discovered strings with counts, standard errors, intervals and p-values; reports per
period; and why an estimate is withheld when it is. ``body[data-ready]`` turns to ``1``
once everything is drawn (``error`` on failure), for headless checks.
"""

from __future__ import annotations

__all__ = ["DASHBOARD_HTML"]

DASHBOARD_HTML = r"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>ldp-collector</title>
<style>
  :root { --fg:#1d2433; --muted:#667085; --line:#d0d5dd; --accent:#2f6fde; --band:#2f6fde33; --bar:#5b8def; --warn:#b54708; }
  * { box-sizing: border-box; }
  body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg); margin: 0; background: #f5f7fa; }
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
  .error { color: #b42318; padding: 16px 24px; white-space: pre-wrap; }
  .rejects { font-size: 12px; color: #d0d5dd; }
</style>
</head>
<body data-ready="0">
<header>
  <h1>ldp-collector</h1>
  <span class="kv" id="summary">loading…</span>
</header>
<div class="error" id="error" hidden></div>
<main id="cards"></main>
<script>
"use strict";
const NS = "http://www.w3.org/2000/svg";

function fmt(x, digits) {
  if (x === null || x === undefined || Number.isNaN(x)) return "n/a";
  const a = Math.abs(x);
  if (a !== 0 && (a >= 1e6 || a < 1e-3)) return x.toExponential(2);
  return Number(x).toPrecision(digits || 4).replace(/\.?0+$/, "");
}

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

async function getJSON(url) {
  const r = await fetch(url, {cache: "no-store"});
  if (!r.ok) throw new Error(url + ": HTTP " + r.status + " " + (await r.text()));
  return r.json();
}

function scale(d0, d1, r0, r1) {
  const span = d1 - d0 || 1;
  return v => r0 + (v - d0) / span * (r1 - r0);
}

function niceRange(lo, hi) {
  if (!(isFinite(lo) && isFinite(hi))) return [0, 1];
  if (lo === hi) { lo -= Math.abs(lo) * 0.1 + 1e-9; hi += Math.abs(hi) * 0.1 + 1e-9; }
  const pad = (hi - lo) * 0.08;
  return [lo - pad, hi + pad];
}

function yAxis(g, y, lo, hi, x0, x1) {
  for (let i = 0; i <= 4; i++) {
    const v = lo + (hi - lo) * i / 4;
    g.append(sv("line", {x1: x0, x2: x1, y1: y(v), y2: y(v), stroke: "#eaecf0"}));
    g.append(sv("text", {x: x0 - 6, y: y(v) + 4, "text-anchor": "end"}, fmt(v, 3)));
  }
}

// Mean or proportion per period: line, points, confidence band.
function seriesChart(series, label) {
  const pts = series.points.filter(p => p.value !== undefined && p.value !== null);
  const W = 540, H = 220, L = 60, R = 12, T = 22, B = 34;
  const svg = sv("svg", {width: W, height: H, viewBox: `0 0 ${W} ${H}`, class: "chart series", "data-points": pts.length});
  svg.append(sv("text", {x: L, y: 14, class: "title"}, `${label} per period (band: ${Math.round(series.confidence * 100)}% CI)`));
  if (pts.length === 0) {
    svg.append(sv("text", {x: W / 2, y: H / 2, "text-anchor": "middle"}, "no released periods yet"));
    return svg;
  }
  const los = pts.map(p => p.ci[0]), his = pts.map(p => p.ci[1]);
  const [lo, hi] = niceRange(Math.min(...los), Math.max(...his));
  const x = scale(0, Math.max(pts.length - 1, 1), L + 10, W - R - 10), y = scale(lo, hi, H - B, T);
  const g = sv("g");
  yAxis(g, y, lo, hi, L, W - R);
  const upper = pts.map((p, i) => `${x(i)},${y(p.ci[1])}`);
  const lower = pts.map((p, i) => `${x(i)},${y(p.ci[0])}`).reverse();
  if (pts.length > 1) g.append(sv("polygon", {points: upper.concat(lower).join(" "), fill: "var(--band)", class: "ci-band"}));
  pts.forEach((p, i) => {
    if (pts.length === 1) g.append(sv("line", {x1: x(i), x2: x(i), y1: y(p.ci[0]), y2: y(p.ci[1]), stroke: "var(--accent)", "stroke-width": 2, class: "ci-band"}));
  });
  g.append(sv("polyline", {points: pts.map((p, i) => `${x(i)},${y(p.value)}`).join(" "), fill: "none", stroke: "var(--accent)", "stroke-width": 2}));
  pts.forEach((p, i) => {
    const c = sv("circle", {cx: x(i), cy: y(p.value), r: 3.5, fill: "var(--accent)", class: "point"});
    c.append(sv("title", {}, `${p.period_start}: ${fmt(p.value)} ± ${fmt(p.standard_error)} (SE), ${p.reports} reports`));
    g.append(c);
  });
  const every = Math.max(1, Math.ceil(pts.length / 6));
  pts.forEach((p, i) => {
    if (i % every === 0 || i === pts.length - 1)
      g.append(sv("text", {x: x(i), y: H - B + 16, "text-anchor": "middle"}, p.period_start.slice(5, 16).replace("T", " ")));
  });
  svg.append(g);
  return svg;
}

// Histogram: bars (estimate), error bars (CI), diamonds (consistent histogram).
function histogramChart(est, confidence) {
  const b = est.buckets;
  const W = 540, H = 240, L = 60, R = 12, T = 22, B = 46;
  const svg = sv("svg", {width: W, height: H, viewBox: `0 0 ${W} ${H}`, class: "chart histogram", "data-bars": b.length});
  svg.append(sv("text", {x: L, y: 14, class: "title"}, `share of devices per bucket (error bars: ${Math.round(confidence * 100)}% CI; ◆ consistent)`));
  const vals = b.flatMap(v => [v.ci[0], v.ci[1], v.consistent, 0]).filter(v => v !== null);
  const [lo, hi] = niceRange(Math.min(...vals), Math.max(...vals));
  const y = scale(lo, hi, H - B, T);
  const slot = (W - L - R) / b.length;
  const g = sv("g");
  yAxis(g, y, lo, hi, L, W - R);
  b.forEach((v, i) => {
    const x0 = L + i * slot + slot * 0.15, w = slot * 0.7, cx = x0 + w / 2;
    const top = y(Math.max(v.value, 0)), base = y(Math.min(v.value, 0));
    const bar = sv("rect", {x: x0, y: Math.min(top, base), width: w, height: Math.max(Math.abs(base - top), 0.5), fill: "var(--bar)", class: "bar"});
    bar.append(sv("title", {}, `[${fmt(v.low)}, ${fmt(v.high)}): ${fmt(v.value)} ± ${fmt(v.standard_error)} (SE)`));
    g.append(bar);
    if (v.ci[0] !== null && v.ci[1] !== null) {
      g.append(sv("line", {x1: cx, x2: cx, y1: y(v.ci[0]), y2: y(v.ci[1]), stroke: "#101828", "stroke-width": 1.3, class: "error-bar"}));
      for (const end of v.ci) g.append(sv("line", {x1: cx - w * 0.2, x2: cx + w * 0.2, y1: y(end), y2: y(end), stroke: "#101828", "stroke-width": 1.3}));
    }
    if (v.consistent !== null) g.append(sv("path", {d: `M${cx},${y(v.consistent) - 4} l4,4 l-4,4 l-4,-4 z`, fill: "#f79009", class: "consistent"}));
    if (b.length <= 16 || i % Math.ceil(b.length / 16) === 0)
      g.append(sv("text", {x: cx, y: H - B + 14, "text-anchor": "middle"}, fmt(v.low, 3)));
  });
  g.append(sv("line", {x1: L, x2: W - R, y1: y(0), y2: y(0), stroke: "#98a2b3"}));
  g.append(sv("text", {x: (L + W - R) / 2, y: H - 8, "text-anchor": "middle"}, "bucket (lower edge)"));
  svg.append(g);
  return svg;
}

function reportsChart(series) {
  const pts = series.points;
  const W = 540, H = 70, L = 60, R = 12, T = 16, B = 8;
  const svg = sv("svg", {width: W, height: H, viewBox: `0 0 ${W} ${H}`, class: "chart reports"});
  svg.append(sv("text", {x: L, y: 11, class: "title"}, "reports per period"));
  const max = Math.max(1, ...pts.map(p => p.reports));
  const slot = (W - L - R) / Math.max(pts.length, 1);
  pts.forEach((p, i) => {
    const h = (H - T - B) * p.reports / max;
    const r = sv("rect", {x: L + i * slot + 1, y: H - B - h, width: Math.max(slot - 2, 1), height: h, fill: p.released ? "#98a2b3" : "#fdb022"});
    r.append(sv("title", {}, `${p.period_start}: ${p.reports} reports${p.released ? "" : " (below min_reports)"}`));
    svg.append(r);
  });
  svg.append(sv("text", {x: L - 6, y: T + 8, "text-anchor": "end"}, String(max)));
  return svg;
}

function correctionText(e) {
  // pfer's level counts false strings; the other corrections' is a rate (stats.py).
  if (!e.correction) return "";
  if (e.correction === "pfer") return ` · pfer: at most ${e.alpha} false strings expected`;
  return ` · ${e.correction} at α = ${e.alpha}`;
}

function stringsTable(est, confidence) {
  const hasP = est.items.some(i => i.p_value !== undefined);
  const head = el("tr", {}, el("th", {}, "value"), el("th", {}, "count"), el("th", {}, "SE"),
                  el("th", {}, `${Math.round(confidence * 100)}% CI`));
  if (hasP) head.append(el("th", {}, "p-value"));
  const table = el("table", {class: "strings"}, el("thead", {}, head));
  const body = el("tbody");
  for (const it of est.items.slice(0, 50)) {
    const row = el("tr", {}, el("td", {}, it.value), el("td", {}, fmt(it.count)), el("td", {}, fmt(it.standard_error)),
                   el("td", {}, `${fmt(it.ci[0])} … ${fmt(it.ci[1])}`));
    if (hasP) row.append(el("td", {}, fmt(it.p_value, 2)));
    body.append(row);
  }
  table.append(body);
  return table;
}

function card(name, uc) {
  const c = el("section", {class: "card", id: "uc-" + name, "data-kind": uc.kind});
  c.append(el("h2", {}, name));
  c.append(el("div", {class: "sub"}, `${uc.mechanism} · ε ${uc.epsilon} · period ${uc.period} · min ${uc.min_reports} reports` +
                                       (uc.release_threshold ? ` · threshold ${uc.release_threshold}` : "") +
                                       (uc.description ? ` — ${uc.description}` : "")));
  return c;
}

async function renderUseCase(name, uc) {
  const c = card(name, uc);
  document.getElementById("cards").append(c);
  if (uc.periods.length === 0) { c.append(el("div", {class: "withheld"}, "no reports yet")); return; }
  const base = `api/v1/use-cases/${encodeURIComponent(name)}`;
  const [est, series] = await Promise.all([getJSON(base + "/estimate"), getJSON(base + "/series")]);
  c.append(el("div", {class: "sub"}, `latest period ${est.period_start} … ${est.period_end}: ${est.reports} reports, ${est.records} records`));
  if (!est.released) {
    c.append(el("div", {class: "withheld"}, "not released: " + est.withheld_reason));
  } else if (est.kind === "proportion" || est.kind === "mean") {
    const e = est.estimate;
    const h = el("div", {class: "headline"}, `${fmt(e.value)} `);
    h.append(el("small", {}, `± ${fmt(e.standard_error)} (SE) · ${Math.round(est.confidence * 100)}% CI ${fmt(e.ci[0])} … ${fmt(e.ci[1])}`));
    c.append(h);
    c.append(seriesChart(series, est.kind === "mean" ? "mean" : "proportion"));
  } else if (est.kind === "histogram") {
    c.append(histogramChart(est.estimate, est.confidence));
  } else {
    const e = est.estimate;
    const what = e.discovered ? "discovered strings" : `${e.items.length} of ${e.tested} dictionary entries`;
    c.append(el("div", {class: "sub"}, `${what}` + (e.withheld ? ` · ${e.withheld} below the release threshold withheld` : "") +
                                         correctionText(e)));
    c.append(stringsTable(e, est.confidence));
  }
  c.append(reportsChart(series));
}

async function render() {
  const status = await getJSON("api/v1/status");
  const counters = (status.live || {});
  const rejected = Object.entries(counters.rejected || {}).map(([k, v]) => `${k} ${v}`).join(", ");
  const s = document.getElementById("summary");
  s.textContent = "";
  const kv = (k, v) => { const span = el("span", {}, k + " "); span.append(el("b", {}, String(v))); s.append(span, "  ·  "); };
  kv("instance", status.instance);
  kv("registry", status.registry_hash.slice(0, 12));
  kv("reports folded", status.counters.reports || 0);
  if (status.live) {
    kv("messages", counters.messages);
    kv("duplicates", counters.duplicates);
    kv("lag", fmt(counters.aggregation_lag_seconds, 2) + " s");
    kv("checkpoint age", counters.checkpoint_age_seconds === null ? "n/a" : fmt(counters.checkpoint_age_seconds, 2) + " s");
    kv("buffer", fmt(100 * counters.buffer_fill, 3) + " %");
  }
  if (status.transport) kv("broker", status.transport.connected ? "connected" : "disconnected");
  if (rejected) s.append(el("span", {class: "rejects"}, "rejected: " + rejected));
  for (const [name, uc] of Object.entries(status.use_cases)) await renderUseCase(name, uc);
}

// Fresh numbers once a minute (estimates are cached server-side for a few seconds only).
setTimeout(() => location.reload(), 60000);

render().then(() => { document.body.dataset.ready = "1"; }, err => {
  const box = document.getElementById("error");
  box.hidden = false;
  box.textContent = String(err && err.stack || err);
  document.body.dataset.ready = "error";
});
</script>
</body>
</html>
"""
