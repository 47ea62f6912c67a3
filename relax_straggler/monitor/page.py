"""The monitor's pages for a browser: the status page (GET / with Accept: text/html) and the
API reference (GET /docs). Self-contained HTML: inline CSS and SVG, no script, nothing loaded
from another host (no CDN, no web font), so both work on an air-gapped cluster.

The status page shows the monitor's health, every job of the page (JOBS_PAGE at a time) with
its status and current verdict (verdict.py), the jobs with a confirmed straggler or a hang's
culprit, and for the jobs with a verdict (at most MAX_PICTURES) the step x rank picture of
the newest analysed window (picture.py): each cell the rank's time in the drawn stage over
that step's median, a named straggler's column outlined. Links go to the JSON.
"""

from __future__ import annotations

import html
import math
from typing import Optional
from urllib.parse import quote

MAX_PICTURES = 10
_CELL_H = 16
_PICTURE_W = 512  # px the columns share (each 4 to 24 px wide)

_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.5em;color:#1b1f24;background:#fff}
h1{font-size:1.4em;margin:0 0 .3em}h2{font-size:1.1em;margin:1.4em 0 .4em}
table{border-collapse:collapse;font-size:.9em}th,td{border-bottom:1px solid #d0d7de;padding:.25em .6em;text-align:left}
th{background:#f6f8fa}td.num{text-align:right;font-variant-numeric:tabular-nums}
.s-active,.s-finished{color:#1a7f37}.s-slowdown,.s-predicting{color:#9a6700}
.s-detected,.s-hanging{color:#cf222e;font-weight:600}
.muted{color:#57606a}.bad{color:#cf222e;font-weight:600}.ok{color:#1a7f37;font-weight:600}
code{background:#f6f8fa;padding:0 .25em}figure{margin:.6em 0 1.2em}figcaption{font-size:.85em;color:#57606a}
"""


def _e(x) -> str:
    return html.escape("" if x is None else str(x), quote=True)


def _page(title: str, body: str) -> str:
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
            f'<meta name="viewport" content="width=device-width,initial-scale=1"><style>{_STYLE}</style></head>'
            f"<body>{body}</body></html>")


def status_page(version: str, health: dict, jobs: list[dict], total: int, offset: int, limit: int,
                pictures: dict[str, dict]) -> str:
    """The status page. health: the JSON of GET /; jobs: Monitor.job_numbers() of this page;
    pictures: {job_id: picture.window_picture()} of the jobs to draw."""
    store = health["store"]
    store_line = (f'<span class="ok">store up</span> <code>{_e(store["url"])}</code>' if store["ok"] else
                  f'<span class="bad">store error</span> <code>{_e(store["url"])}</code>: {_e(store["error"])}')
    parts = [f"<h1>relax-straggler monitor</h1>",
             f'<p>version {_e(version)} &middot; {store_line} &middot; {total} job(s) &middot; check every '
             f'{_e(health["check_interval_s"])} s &middot; jobs with problems: {health["job_problems"]["count"]} '
             f'&middot; JSON: <a href="/jobs">/jobs</a>, <a href="/metrics">/metrics</a>, '
             f'<a href="/openapi.json">/openapi.json</a>, <a href="/docs">API reference</a></p>']
    flagged = [j for j in jobs if j["verdict"] is not None]
    parts.append("<h2>Confirmed stragglers and hang culprits</h2>")
    if flagged:
        parts.append('<table id="stragglers"><tr><th>job</th><th>status</th><th>rank</th><th>node</th><th>stage</th>'
                     "<th>cause</th><th>since step</th><th>ratio</th><th>excess / step</th><th>drain plan</th></tr>")
        for j in flagged:
            v = j["verdict"]
            link = f'/jobs/{quote(j["job_id"], safe="")}'
            parts.append(f'<tr data-job="{_e(j["job_id"])}"><td><a href="{link}">{_e(j["job_id"])}</a></td>'
                         f'<td class="s-{_e(v["status"])}">{_e(v["status"])}</td><td class="num">{_e(v["rank"])}</td>'
                         f'<td>{_e(v["node"]) or "<span class=muted>unknown</span>"}</td><td>{_e(v["stage"])}</td>'
                         f'<td>{_e(v["cause"])}</td><td class="num">{_e(v["since_step"])}</td>'
                         f'<td class="num">{_num(v["ratio"], "{:.2f}")}</td>'
                         f'<td class="num">{_num(v["excess_ms"], "{:.1f} ms")}</td>'
                         f'<td><a href="{link}">drain_plan</a></td></tr>')
        parts.append("</table>")
    else:
        parts.append('<p class="muted">none</p>')
    parts.append(f"<h2>Jobs {offset + 1 if jobs else 0}-{offset + len(jobs)} of {total}</h2>")
    parts.append('<table id="jobs"><tr><th>job</th><th>status</th><th>iterations</th><th>slow</th>'
                 "<th>step</th><th>baseline</th><th>slowdown</th><th>JSON</th></tr>")
    for j in jobs:
        link = f'/jobs/{quote(j["job_id"], safe="")}'
        parts.append(f'<tr data-job="{_e(j["job_id"])}"><td>{_e(j["job_id"])}</td>'
                     f'<td class="s-{_e(j["status"])}">{_e(j["status"])}</td>'
                     f'<td class="num">{j["iteration_count"]}</td><td class="num">{j["slow_iterations"]}</td>'
                     f'<td class="num">{_num(j["last_ms"], "{:.1f} ms")}</td>'
                     f'<td class="num">{_num(j["baseline_ms"], "{:.1f} ms")}</td>'
                     f'<td class="num">{_num(j["last_growth"], "{:+.0%}")}</td>'
                     f'<td><a href="{link}">status</a> <a href="{link}/results">results</a></td></tr>')
    parts.append("</table>")
    nav = []
    if offset > 0:
        nav.append(f'<a href="/?offset={max(0, offset - limit)}&amp;limit={limit}">previous</a>')
    if offset + limit < total:
        nav.append(f'<a href="/?offset={offset + limit}&amp;limit={limit}">next</a>')
    if nav:
        parts.append(f"<p>{' &middot; '.join(nav)}</p>")
    if pictures:
        parts.append("<h2>Step x rank, newest analysed window</h2>")
        for j in flagged:
            if j["job_id"] in pictures:
                parts.append(picture_svg(j["job_id"], pictures[j["job_id"]], j["verdict"]["rank"]))
    return _page("relax-straggler monitor", "".join(parts))


def picture_svg(job_id: str, picture: dict, rank: Optional[int]) -> str:
    """A <figure> with the inline SVG of `picture`: one row per step, one column per rank (or
    group of ranks), colour = time over that step's median (white at 1, red at 2 and over),
    the column holding `rank` outlined."""
    cols, rows = picture["columns"], picture["ms"]
    cw = cell_width(len(cols))
    w, h = 40 + cw * len(cols), 20 + _CELL_H * len(rows)
    out = [f'<figure data-job="{_e(job_id)}"><svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
           f'role="img" aria-label="step by rank times of job {_e(job_id)}">']
    for y, (step, values) in enumerate(zip(picture["steps"], rows)):
        finite = sorted(v for v in values if v is not None)
        median = finite[len(finite) // 2] if finite else None
        out.append(f'<text x="0" y="{20 + _CELL_H * y + 12}" font-size="10">{step}</text>')
        for x, v in enumerate(values):
            ratio = v / median if v is not None and median else None
            out.append(f'<rect x="{40 + cw * x}" y="{20 + _CELL_H * y}" width="{cw}" height="{_CELL_H}" '
                       f'fill="{_colour(ratio)}"><title>ranks {cols[x][0]}-{cols[x][1]}, step {step}: '
                       f'{_num(v, "{:.1f} ms")}</title></rect>')
    for x, (first, last) in enumerate(cols):
        if rank is not None and first <= rank <= last:
            out.append(f'<rect class="named" x="{40 + cw * x}" y="20" width="{cw}" '
                       f'height="{_CELL_H * len(rows)}" fill="none" stroke="#000" stroke-width="2"/>')
            out.append(f'<text x="{40 + cw * x}" y="12" font-size="10">rank {rank}</text>')
    out.append("</svg>")
    out.append(f"<figcaption>job {_e(job_id)}: {_e(picture['stage'])} time per rank (columns, rank "
               f"{cols[0][0]} left to {cols[-1][1]} right) and step (rows), over each step's median; white = median, "
               "red = twice or more</figcaption></figure>")
    return "".join(out)


def cell_width(columns: int) -> int:
    """The width of one column of the picture, px."""
    return max(4, min(24, _PICTURE_W // max(columns, 1)))


def docs_page(openapi: dict) -> str:
    """The API reference from the OpenAPI schema, as a plain page (the schema itself is at
    /openapi.json)."""
    parts = [f"<h1>{_e(openapi.get('info', {}).get('title'))} API</h1>",
             f"<p>{_e(openapi.get('info', {}).get('description'))} The schema: "
             '<a href="/openapi.json">/openapi.json</a>; the status page: <a href="/">/</a>.</p>',
             '<table id="routes"><tr><th>method</th><th>path</th><th>what</th><th>parameters</th><th>answers</th></tr>']
    for path, methods in openapi.get("paths", {}).items():
        for method, op in methods.items():
            params = ", ".join(f'{p["name"]} ({p["in"]})' for p in op.get("parameters", ()))
            if "requestBody" in op:
                params = ", ".join(filter(None, (params, "JSON body")))
            answers = ", ".join(f"{code} {r.get('description', '')}" for code, r in op.get("responses", {}).items())
            parts.append(f"<tr><td>{_e(method.upper())}</td><td><code>{_e(path)}</code></td>"
                         f"<td>{_e(op.get('summary'))}</td><td>{_e(params)}</td><td>{_e(answers)}</td></tr>")
    parts.append("</table>")
    return _page("relax-straggler monitor API", "".join(parts))


def _num(x, fmt: str) -> str:
    return fmt.format(x) if isinstance(x, (int, float)) and math.isfinite(x) else "&ndash;"


def _colour(ratio: Optional[float]) -> str:
    if ratio is None or not math.isfinite(ratio):
        return "#d0d7de"
    t = min(max(ratio - 1.0, 0.0), 1.0)  # 1 -> white, 2 and over -> red
    g = round(255 * (1 - 0.85 * t))
    return f"rgb(255,{g},{g})"
