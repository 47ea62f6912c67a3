"""The monitor's pages for a browser (relax_straggler/monitor/page.py): the status page at
GET / for Accept: text/html, the offline API reference at /docs, read by headless Chromium
(Debian's `chromium` package, which `make test` installs)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conftest import wait_for
from relax_straggler.monitor import page
from relax_straggler.monitor.api import _wants_html

sys.path.insert(0, str(Path(__file__).parent))
from test_monitor_api import Server, servers  # noqa: E402,F401 (servers: the fixture)
from test_monitor_service import write_job  # noqa: E402

BROWSER = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


class Outline(HTMLParser):
    """Every tag with its attributes, and the text of each table row, of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.rows: dict[str, list[list[str]]] = {}
        self._table: str = ""
        self._row: list[str] = []
        self._cell: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        if tag == "table":
            self._table = attrs.get("id", "")
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self._row.append("".join(self._cell).strip())
        elif tag == "tr":
            self.rows.setdefault(self._table, []).append(self._row)

    def handle_data(self, data):
        self._cell.append(data)


def outline(html: str) -> Outline:
    parsed = Outline()
    parsed.feed(html)
    return parsed


def assert_self_contained(html: str) -> None:
    """Nothing the page would load: no script, stylesheet link, image, frame, font or URL of
    another host (the SVG namespace is a name, not a load)."""
    parsed = outline(html)
    assert not [t for t, _ in parsed.tags if t in ("script", "link", "img", "iframe", "object", "embed")]
    for tag, attrs in parsed.tags:
        for name, value in attrs.items():
            if name == "xmlns":
                continue
            assert not re.match(r"\s*(https?:)?//", value or ""), (tag, name, value)
    assert "@import" not in html and "url(" not in html and "@font-face" not in html


def test_a_browser_gets_html_and_a_client_json():
    assert _wants_html(BROWSER)
    assert not _wants_html("*/*") and not _wants_html("") and not _wants_html("application/json")
    assert not _wants_html("text/html;q=0.5,application/json")
    assert not _wants_html("text/html;q=0")


def test_names_from_the_store_are_escaped():
    verdict = {"job_id": "j", "rank": 5, "node": '<script>alert("x")</script>', "stage": "forward", "cause": "compute",
               "status": "confirmed", "since_step": 40, "ratio": 1.8, "excess_ms": 80.0}
    jobs = [{"job_id": "j", "status": "detected", "iteration_count": 50, "slow_iterations": 10, "last_ms": 180.0,
             "baseline_ms": 100.0, "last_growth": 0.8, "verdict": verdict}]
    picture = {"stage": "forward", "steps": [40, 41], "columns": [[0, 0], [1, 1]], "ms": [[30.0, 110.0], [30.0, None]]}
    health = {"store": {"ok": True, "url": "file:///s", "error": None}, "check_interval_s": 30.0,
              "job_problems": {"count": 0, "jobs": []}}
    html = page.status_page("1.0", health, jobs, 1, 0, 100, {"j": picture})
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert_self_contained(html)


@pytest.fixture
def straggler_monitor(servers, file_url, tmp_path):
    """A monitor whose job train-1 (16 ranks, 4 per node) has rank 5 detected slow in forward,
    every one of its 50 iterations read and analysed."""
    server = Server(file_url, tmp_path / "state.json")
    servers.append(server)
    assert server.client.post("/jobs/train-1", json={"dp": 16, "ranks_per_node": 4}).status_code == 201
    assert server.client.post("/jobs/quiet-1").status_code == 201
    write_job(file_url, "train-1", 50)

    def settled() -> bool:  # every iteration read and analysed: the views stay as they are
        view = server.client.get("/train-1").json()
        return view["status"] == "detected" and view["last_iteration"] == 49 and view["analysing"] is None

    wait_for(settled, what="detected, every iteration read and analysed")
    return server


def test_the_status_page_and_docs_need_nothing_from_outside(straggler_monitor):
    c = straggler_monitor.client
    assert c.get("/").json()["jobs"] == 2  # no Accept: JSON, as before
    r = c.get("/", headers={"accept": BROWSER})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert_self_contained(r.text)
    rows = outline(r.text).rows
    assert [row[:5] for row in rows["stragglers"][1:]] == [["train-1", "confirmed", "5", "node-1", "forward"]]
    assert {row[0]: row[1] for row in rows["jobs"][1:]} == {"train-1": "detected", "quiet-1": "active"}
    docs = c.get("/docs")
    assert docs.status_code == 200 and "/jobs/{job_id}" in docs.text
    assert_self_contained(docs.text)
    assert c.get("/redoc", follow_redirects=False).headers["location"] == "/docs"


def test_the_status_page_in_headless_chromium(straggler_monitor, tmp_path):
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("chromium is not installed (Debian's chromium package: `make apt` installs it)")
    url = f"http://127.0.0.1:{straggler_monitor.port}/"
    dom = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                          f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", url],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    parsed = outline(dom.stdout)
    assert [row[:5] for row in parsed.rows["stragglers"][1:]] == [["train-1", "confirmed", "5", "node-1", "forward"]]
    figures = [a for t, a in parsed.tags if t == "figure"]
    assert [f.get("data-job") for f in figures] == ["train-1"]
    cells = [a for t, a in parsed.tags if t == "rect" and "fill" in a and a.get("class") != "named"]
    assert len(cells) == 5 * 16  # the analysed window's 5 steps x 16 ranks
    named = [a for t, a in parsed.tags if t == "rect" and a.get("class") == "named"]
    rank_5 = str(40 + page.cell_width(16) * 5)
    assert len(named) == 1 and named[0]["x"] == rank_5  # rank 5's column outlined
    reddest = min(cells, key=lambda a: int(a["fill"].split(",")[1]))
    assert reddest["x"] == rank_5
