"""What operators plug in (deploy/, docs/MONITOR.md): the monitor's Prometheus series as
promtool and a real Prometheus (Debian's `prometheus` package, `make test` installs it) read
them, the shipped alert rules (promtool check / test rules), and every panel query of the
shipped Grafana dashboard and every alert expression evaluated by that Prometheus scraping a
real monitor fed by `relax-straggler feed --inject-delay`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from conftest import free_port, wait_for
from relax_straggler.common.topology import Topology
from relax_straggler.monitor.service import Monitor, MonitorConfig
from relax_straggler.stores.opener import open_store

sys.path.insert(0, str(Path(__file__).parent))
from test_monitor_api import Server, feed, servers  # noqa: E402,F401 (servers: the fixture)
from test_monitor_service import write_job  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy/prometheus/relax-straggler-rules.yml"
RULE_TESTS = REPO / "deploy/prometheus/relax-straggler-rules.test.yml"
DASHBOARD = REPO / "deploy/grafana/relax-straggler-dashboard.json"


def need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} is not installed (Debian's prometheus package: `make apt` installs it)")
    return path


def our_series(text: str) -> list[str]:
    """The sample lines of the monitor's own series (straggler_*)."""
    return [line for line in text.splitlines() if line.startswith("straggler_")]


def panel_queries() -> list[tuple[str, str]]:
    """(panel title, expr) of every target of the shipped dashboard, $job_id as every job."""
    dashboard = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"].replace("$job_id", ".*")) for p in dashboard["panels"] for t in p["targets"]]


def test_the_straggler_series_names_rank_node_stage_and_passes_promtool(tmp_path, file_url):
    promtool = need("promtool")
    m = Monitor(MonitorConfig(file_url, check_interval_s=0.1, state_path=str(tmp_path / "state.json")))
    try:
        m.register("job-a", Topology(dp=16, pp=1, ranks_per_node=4))
        write_job(file_url, "job-a", 50)  # 16 ranks, rank 5 +80 ms in forward from iteration 40
        m.poll_once()
        wait_for(lambda: m.view("job-a")["status"] == "detected", what="detected")
        text = m.metrics.text().decode()
    finally:
        m.stop()
    verdict = [line for line in our_series(text) if line.startswith("straggler_job_verdict_info{")]
    assert len(verdict) == 1, verdict
    # The store's node column names rank 5's node: node-1 (ranks 4-7 with 4 ranks per node).
    for label in ('job_id="job-a"', 'rank="5"', 'node="node-1"', 'stage="forward"', 'cause="compute"',
                  'status="confirmed"'):
        assert label in verdict[0], verdict[0]
    assert not [line for line in our_series(text) if re.search(r'[{,]job="', line)]
    assert re.search(r'^straggler_job_straggler_excess_seconds\{job_id="job-a"\} 0\.0[5-9]', text, re.M), \
        "the +80 ms of rank 5 (its excess over its group, s)"
    assert re.search(r'^straggler_job_slowdown_ratio\{job_id="job-a"\} 0\.[5-9]', text, re.M)
    assert "_ms" not in "".join(line.split("{")[0] for line in our_series(text))
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert (check.returncode, check.stdout, check.stderr) == (0, "", "")


def test_the_shipped_rules_pass_promtool_check_and_their_unit_tests():
    promtool = need("promtool")
    check = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and "SUCCESS: 4 rules found" in check.stdout, check.stdout + check.stderr
    unit = subprocess.run([promtool, "test", "rules", RULE_TESTS.name], cwd=RULE_TESTS.parent, capture_output=True,
                          text=True, timeout=60)
    assert unit.returncode == 0 and "SUCCESS" in unit.stdout, unit.stdout + unit.stderr


def test_the_dashboard_queries_only_series_the_monitor_exports():
    names = set(re.findall(r"\b(straggler_[a-z_]+)", " ".join(e for _, e in panel_queries())))
    exported = {"straggler_job_status", "straggler_job_iterations", "straggler_job_slowdown_ratio",
                "straggler_job_last_step_seconds", "straggler_job_baseline_step_seconds", "straggler_job_verdict_info",
                "straggler_job_straggler_excess_seconds", "straggler_monitor_store_up",
                "straggler_monitor_store_errors_total", "straggler_monitor_jobs_with_problems",
                "straggler_monitor_analyses_total", "straggler_monitor_poll_seconds_sum",
                "straggler_monitor_poll_seconds_count"}
    assert names <= exported, names - exported
    titles = {t for t, _ in panel_queries()}
    for wanted in ("Jobs by status", "Slowdown over time", "Stragglers by rank", "Stragglers by node",
                   "Stragglers by stage", "Hang state", "Monitor health"):
        assert wanted in titles


def has_iterations(url: str, job: str) -> bool:
    store = open_store(url, create=False) if Path(url[len("file://"):]).exists() else None
    if store is None:
        return False
    try:
        return bool(store.iterations(job))
    finally:
        store.close()


class Prometheus:
    """A real Prometheus scraping `target` every second, evaluating `rules` every second."""

    def __init__(self, tmp_path: Path, target: str, rules: Path) -> None:
        self.port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": "relax-straggler", "static_configs": [{"targets": [target]}]}]}))
        self.log = open(tmp_path / "prometheus.log", "w")
        self.proc = subprocess.Popen([need("prometheus"), f"--config.file={config}",
                                      f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                      f"--web.listen-address=127.0.0.1:{self.port}"],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=10.0)
        wait_for(self._ready, what="prometheus ready")

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited: {Path(self.log.name).read_text()[-2000:]}")
        try:
            return self.client.get("/-/ready").status_code == 200
        except httpx.TransportError:
            return False

    def query(self, expr: str) -> list[dict]:
        answer = self.client.get("/api/v1/query", params={"query": expr}).json()
        assert answer["status"] == "success", (expr, answer)
        return answer["data"]["result"]

    def query_range(self, expr: str, start: float, end: float) -> list[dict]:
        answer = self.client.get("/api/v1/query_range",
                                 params={"query": expr, "start": start, "end": end, "step": "1s"}).json()
        assert answer["status"] == "success", (expr, answer)
        return answer["data"]["result"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.client.close()
        self.log.close()


def test_a_real_prometheus_evaluates_every_panel_and_alert_on_a_straggler_job(servers, file_url, tmp_path):
    need("prometheus")
    # The shipped rules, with each `for` shortened to 3 s: the test lasts seconds, not minutes.
    rules = yaml.safe_load(RULES.read_text())
    for rule in rules["groups"][0]["rules"]:
        rule["for"] = "3s"
    fast_rules = tmp_path / "rules.yml"
    fast_rules.write_text(yaml.safe_dump(rules))
    server = Server(file_url, tmp_path / "state.json", 3.0)
    servers.append(server)
    prom = Prometheus(tmp_path, f"127.0.0.1:{server.port}", fast_rules)
    try:
        wait_for(lambda: prom.query('up{job="relax-straggler"} == 1'), what="the first scrape")
        start = time.time()
        # 16 ranks, rank 5 +80 ms in forward from iteration 60; ~16 s at twice the recorded pace. The
        # job is registered once its iterations flow (the 3 s hang clock starts at registration).
        proc = feed(file_url, "train-1", "--synthetic", "ranks=16,iterations=200,step_ms=100,seed=1",
                      "--inject-delay", "5:forward:80:60", "--speed", "2")
        wait_for(lambda: has_iterations(file_url, "train-1"), what="the feed's first iteration")
        assert server.client.post("/jobs/train-1", json={"dp": 16, "ranks_per_node": 4}).status_code == 201
        wait_for(lambda: server.client.get("/train-1").json()["status"] == "detected", what="detected")
        wait_for(lambda: prom.query('ALERTS{alertname="StragglerConfirmed",alertstate="firing"}'),
                 what="the straggler alert firing")
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        view = wait_for(lambda: (v := server.client.get("/train-1").json())["status"] == "finished" and v,
                        what="finished")
        time.sleep(5.0)  # past the 3 s hang threshold, and the hang alert's 3 s `for`
        view = server.client.get("/train-1").json()
        assert view["status"] == "finished" and not view["hang_check"]["is_hanging"]
        assert view["hang_check"]["seconds_since_last_iteration"] > 3.0
        end = time.time()
        for title, expr in panel_queries():
            assert prom.query_range(expr, start, end), f"panel {title!r}: {expr} returned no data"
        fired = prom.query_range('ALERTS{alertname="StragglerConfirmed",alertstate="firing"}', start, end)
        assert [(a["metric"]["job_id"], a["metric"]["rank"], a["metric"]["node"], a["metric"]["stage"])
                for a in fired] == [("train-1", "5", "node-1", "forward")]
        assert not prom.query_range('ALERTS{alertname="StragglerJobHanging"}', start, end)
        exprs = {r["alert"]: r["expr"] for r in rules["groups"][0]["rules"]}
        assert prom.query_range(exprs["StragglerConfirmed"], start, end)
        for quiet in ("StragglerJobHanging", "StragglerMonitorDown", "StragglerMonitorStoreErrors"):
            assert not prom.query_range(exprs[quiet], start, end), quiet
        assert not prom.query("straggler_job_verdict_info")  # finished: nothing left to page about
        server.stop()
        wait_for(lambda: prom.query(exprs["StragglerMonitorDown"]), what="the monitor-down expression")
    finally:
        prom.stop()
