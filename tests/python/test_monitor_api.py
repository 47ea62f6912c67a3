"""End to end: `relax-straggler monitor` as a real uvicorn server on 127.0.0.1,
`relax-straggler feed` writing into the store, httpx as the client."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import httpx
import pytest

from conftest import free_port, wait_for
from relax_straggler.monitor.state import read_state

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-c", "import sys; from relax_straggler.cli import main; sys.exit(main())"]


class Server:
    """A `relax-straggler monitor` process; .client talks to it."""

    def __init__(self, store: str, state: Path, hang_s: float = 30.0, *flags: str, env: Optional[dict] = None) -> None:
        self.port = free_port()
        self.log = open(state.with_suffix(f".{self.port}.log"), "w")
        self.proc = subprocess.Popen(
            CLI + ["monitor", "--store", store, "--port", str(self.port), "--check-interval", "0.2",
                   "--hang-threshold", str(hang_s), "--state", str(state), *flags],
            cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=10.0)
        wait_for(self._up, what=f"monitor on port {self.port}")

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"monitor exited with {self.proc.returncode}: {self.logs()}")
        try:
            return self.client.get("/").status_code == 200
        except httpx.TransportError:
            return False

    def logs(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()[-3000:]

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)
        self.client.close()
        self.log.close()


@pytest.fixture
def servers():
    started: list[Server] = []
    yield started
    for s in started:
        s.stop(signal.SIGKILL)


def feed(store: str, job: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(CLI + ["feed", "--store", store, "--job", job, "--ranks-per-node", "4", *args],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def statuses(server: Server, job: str) -> list[str]:
    return [t["status"] for t in server.client.get(f"/{job}").json()["transitions"]]


def test_injected_straggler_goes_active_slowdown_predicting_detected(servers, store_url, tmp_path):
    server = Server(store_url, tmp_path / "state.json")
    servers.append(server)
    r = server.client.post("/jobs/train-1", json={"dp": 16, "ranks_per_node": 4})
    assert r.status_code == 201 and r.json()["status"] == "active"
    # 100 ms iterations, slow ones 400 ms: two 0.2 s polls per slow iteration, so slowdown is seen before the
    # trigger even when a loaded machine delays a poll by a second
    proc = feed(store_url, "train-1", "--synthetic", "ranks=16,iterations=46,step_ms=100,seed=1", "--speed", "1",
                  "--inject-delay", "5:forward:300:40")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    # the feed ends with its end-of-run row: finished once every iteration is seen
    view = wait_for(lambda: (v := server.client.get("/train-1").json())["status"] == "finished"
                    and v["iteration_count"] == 46 and v, what="finished, every iteration seen")
    seen = [t["status"] for t in view["transitions"]]
    assert seen[:4] == ["active", "slowdown", "predicting", "detected"] and seen[-1] == "finished", seen
    assert view["slowdown_check"]["straggler_prediction"] == {"straggler_rank": 5, "straggler_node": "node-1"}
    assert view["evidence"]["window"]["first_iteration"] == 40
    assert (view["evidence"]["kind"], view["evidence"]["stage"]) == ("individual", "forward")
    assert view["evidence"]["votes"] >= 4
    assert server.client.get("/jobs/train-1").json()["job_id"] == "train-1"
    results = server.client.get("/jobs/train-1/results").json()["results"]
    assert len(results) == 1 and results[0]["analysis_s"] < 5.0
    metrics = server.client.get("/metrics").text
    assert 'straggler_job_status{job_id="train-1",status="finished"} 1.0' in metrics
    assert 'straggler_job_stragglers_total{job_id="train-1"} 1.0' in metrics
    assert 'straggler_job_slow_iterations_total{job_id="train-1"} 6.0' in metrics
    assert 'straggler_monitor_analyses_total{outcome="straggler"} 1.0' in metrics
    assert "straggler_monitor_poll_seconds_count" in metrics


def test_job_that_stops_writing_is_hanging(servers, file_url, tmp_path):
    server = Server(file_url, tmp_path / "state.json", 1.5, "--allow-get-registration")
    servers.append(server)
    assert server.client.get("/detect/stops").json()["created"] is True
    proc = feed(file_url, "stops", "--synthetic", "ranks=4,iterations=5,step_ms=50", "--speed", "10",
                  "--no-end")
    assert proc.wait(timeout=60) == 0
    wait_for(lambda: server.client.get("/stops").json()["iteration_count"] == 5, what="5 iterations")
    view = wait_for(lambda: (v := server.client.get("/stops").json())["status"] == "hanging" and v, what="hanging")
    assert view["hang_check"]["is_hanging"] and view["hang_check"]["seconds_since_last_iteration"] > 1.5
    assert 'straggler_job_status{job_id="stops",status="hanging"} 1.0' in server.client.get("/metrics").text


def test_monitor_and_store_restarts_lose_nothing(servers, file_url, tmp_path):
    state = tmp_path / "state.json"
    server = Server(file_url, state)
    servers.append(server)
    server.client.post("/jobs/a", json={"dp": 16, "ranks_per_node": 4})
    server.client.post("/jobs/b")
    proc = feed(file_url, "a", "--synthetic", "ranks=16,iterations=50,step_ms=100", "--speed", "1000",
                  "--inject-delay", "5:forward:80:40", "--no-end")  # still running when the monitor restarts
    assert proc.wait(timeout=60) == 0
    wait_for(lambda: server.client.get("/a").json()["status"] == "detected", what="detected")
    server.stop(signal.SIGKILL)  # no chance to save on the way out
    again = Server(file_url, state)
    servers.append(again)
    assert [j["job_id"] for j in again.client.get("/jobs").json()["jobs"]] == ["a", "b"]
    view = again.client.get("/a").json()
    assert view["status"] == "detected" and view["slowdown_check"]["straggler_prediction"]["straggler_rank"] == 5
    # the store goes away and comes back: reported, then reconnected, no job lost
    store_dir = Path(file_url[len("file://"):])
    store_dir.rename(tmp_path / "away")
    health = wait_for(lambda: (h := again.client.get("/").json())["status"] == "degraded" and h, what="degraded")
    assert health["store"]["error"] and health["store"]["errors"] >= 1
    assert "straggler_monitor_store_up 0.0" in again.client.get("/metrics").text
    (tmp_path / "away").rename(store_dir)
    wait_for(lambda: again.client.get("/").json()["status"] == "ok", what="store back")
    assert [j["job_id"] for j in again.client.get("/jobs").json()["jobs"]] == ["a", "b"]
    assert again.client.get("/a").json()["analyses"] == 1


def test_errors_are_clear_4xx(servers, file_url, tmp_path):
    server = Server(file_url, tmp_path / "state.json", 30.0, "--allow-get-registration")
    servers.append(server)
    c = server.client
    for method, path in (("GET", "/nope"), ("GET", "/jobs/nope"), ("DELETE", "/jobs/nope"),
                         ("GET", "/undetect/nope"), ("GET", "/jobs/nope/results")):
        r = c.request(method, path)
        assert r.status_code == 404 and "'nope' is not registered" in r.json()["detail"], (method, path)
    r = c.post("/jobs/bad%20id")
    assert r.status_code == 422 and "job_id" in r.json()["detail"]
    r = c.post("/jobs/x", json={"dp": 0})
    assert r.status_code == 422 and "body.dp" in r.json()["detail"]
    r = c.post("/jobs/x", json={"dp": 2, "workers": 3})
    assert r.status_code == 422 and "body.workers" in r.json()["detail"]
    r = c.post("/jobs/x", content=b"{dp: 2", headers={"content-type": "application/json"})
    assert r.status_code == 422 and "JSON" in r.json()["detail"]
    assert c.get("/jobs").json()["jobs"] == []
    schema = c.get("/openapi.json").json()
    assert {"/", "/jobs", "/jobs/{job_id}", "/detect/{job_id}", "/undetect/{job_id}", "/metrics",
            "/{job_id}"} <= set(schema["paths"])
    assert c.get("/docs").status_code == 200


def test_layout_without_dp_or_too_large_is_refused(servers, file_url, tmp_path):
    server = Server(file_url, tmp_path / "state.json")
    servers.append(server)
    c = server.client
    # a default dp of 1 would put ranks 1.. "outside the topology" and fail every analysis
    for body in ({"ranks_per_node": 4}, {"pp": 4, "tp": 2}):
        r = c.post("/jobs/partial", json=body)
        assert r.status_code == 422 and "body.dp: required" in r.json()["detail"], (body, r.text)
    r = c.post("/jobs/huge", json={"dp": 100_000, "pp": 100_000, "tp": 100_000})
    assert r.status_code == 400 and "beyond the 1,048,576 ranks" in r.json()["detail"], r.text
    r = c.post("/jobs/huge", json={"dp": 99999999999999999999999})
    assert r.status_code == 400, r.text
    assert c.get("/jobs").json()["jobs"] == []
    r = c.post("/jobs/flat", json={})  # an empty body is no layout, as no body
    assert r.status_code == 201 and r.json()["topology"] is None
    r = c.post("/jobs/flat", json={"dp": 16, "ranks_per_node": 4})
    assert r.status_code == 200 and r.json()["topology"] == {"dp": 16, "pp": 1, "tp": 1, "ranks_per_node": 4}


def test_concurrent_register_unregister(servers, file_url, tmp_path):
    server = Server(file_url, tmp_path / "state.json")
    servers.append(server)
    codes: list[int] = []
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=30.0) as c:
                for i in range(40):
                    job = f"job-{(seed + i) % 3}"
                    r = c.post(f"/jobs/{job}") if (seed + i) % 2 else c.delete(f"/jobs/{job}")
                    codes.append(r.status_code)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and len(codes) == 240
    assert set(codes) <= {200, 201, 404} and 201 in codes and 404 in codes
    listed = {j["job_id"] for j in server.client.get("/jobs").json()["jobs"]}
    for job in ("job-0", "job-1", "job-2"):
        r = server.client.get(f"/{job}")
        assert r.status_code == (200 if job in listed else 404)
    assert server.client.get("/").json()["status"] == "ok"
    server.stop(signal.SIGTERM)  # a clean stop saves; the state file agrees with the API
    assert set(read_state(str(tmp_path / "state.json"))["jobs"]) == listed


def test_sizes_are_json_integers(servers, file_url, tmp_path):
    server = Server(file_url, tmp_path / "state.json")
    servers.append(server)
    c = server.client
    for body in ({"dp": True}, {"dp": "4"}, {"dp": 4.0}, {"dp": 4, "pp": False}, {"dp": 4, "ranks_per_node": "2"}):
        r = c.post("/jobs/strict", json=body)
        assert r.status_code == 422 and "valid integer" in r.json()["detail"], (body, r.text)
    assert c.get("/jobs").json()["jobs"] == []
    assert c.post("/jobs/strict", json={"dp": 4}).json()["topology"]["dp"] == 4


def test_get_registration_is_off_unless_the_operator_allows_it(servers, file_url, tmp_path):
    server = Server(file_url, tmp_path / "state.json")
    servers.append(server)
    c = server.client
    c.post("/jobs/kept")
    for path in ("/detect/x", "/undetect/kept"):
        r = c.get(path)
        assert r.status_code == 403 and "--allow-get-registration" in r.json()["detail"], r.text
    assert [j["job_id"] for j in c.get("/jobs").json()["jobs"]] == ["kept"]
    assert not {"/detect/{job_id}", "/undetect/{job_id}"} & set(c.get("/openapi.json").json()["paths"])


def test_only_allowed_host_names_are_served(servers, file_url, tmp_path):
    server = Server(file_url, tmp_path / "state.json", 30.0, "--allowed-host", "monitor.internal")
    servers.append(server)
    c = server.client
    for host in ("evil.example", "127.0.0.1.evil.example", "localhost.evil.example:80", ""):
        r = c.get("/", headers={"host": host})
        assert r.status_code == 400 and "is not allowed" in r.json()["detail"], (host, r.text)
        r = c.post("/jobs/rebound", headers={"host": host})
        assert r.status_code == 400, host
    for host in (f"localhost:{server.port}", f"127.0.0.1:{server.port}", "[::1]", "MONITOR.internal:8000"):
        assert c.get("/", headers={"host": host}).status_code == 200, host
    assert c.get("/jobs").json()["jobs"] == []


def test_a_token_guards_register_and_unregister(servers, file_url, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    server = Server(file_url, tmp_path / "state.json", 30.0, "--token-file", str(token_file),
                    "--allow-get-registration", "--max-jobs", "2")
    servers.append(server)
    c = server.client
    good = {"authorization": "Bearer s3cret-token"}
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "s3cret-token"},
                    {"authorization": "Basic s3cret-token"}):
        r = c.post("/jobs/t1", headers=headers)
        assert r.status_code == 401 and "Bearer" in r.headers["www-authenticate"], (headers, r.text)
        assert c.get("/detect/t1", headers=headers).status_code == 401
    assert c.get("/jobs").json()["jobs"] == []
    assert c.post("/jobs/t1", headers=good).status_code == 201
    assert c.get("/detect/t2", headers=good).json()["created"] is True
    r = c.post("/jobs/t3", headers=good)  # --max-jobs 2
    assert r.status_code == 409 and "limit" in r.json()["detail"], r.text
    assert c.get("/t1").status_code == 200 and c.get("/jobs/t1/results").status_code == 200  # reads: no token
    assert c.delete("/jobs/t1").status_code == 401 and c.get("/undetect/t1").status_code == 401
    assert c.delete("/jobs/t1", headers=good).status_code == 200
    schema = c.get("/openapi.json").json()
    assert schema["paths"]["/jobs/{job_id}"]["post"]["security"] == [{"HTTPBearer": []}]
    assert "security" not in schema["paths"]["/jobs/{job_id}"]["get"]


def test_token_from_the_environment_and_bad_token_files(servers, file_url, tmp_path):
    import os

    env = dict(os.environ, RELAX_STRAGGLER_MONITOR_TOKEN="from-env")
    server = Server(file_url, tmp_path / "state.json", 30.0, env=env)
    servers.append(server)
    assert server.client.post("/jobs/e").status_code == 401
    assert server.client.post("/jobs/e", headers={"authorization": "Bearer from-env"}).status_code == 201
    (tmp_path / "empty").write_text("\n")
    for path in (tmp_path / "empty", tmp_path / "missing"):
        proc = subprocess.run(CLI + ["monitor", "--store", file_url, "--port", str(free_port()), "--state",
                                     str(tmp_path / "other.json"), "--token-file", str(path)],
                              cwd=REPO, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 1 and f"--token-file {path}" in proc.stderr, proc.stderr


def test_bodies_over_the_limit_are_refused(servers, file_url, tmp_path):
    server = Server(file_url, tmp_path / "state.json")
    servers.append(server)
    c = server.client
    huge = b'{"dp": 2, "pad": "' + b"x" * 200_000 + b'"}'
    r = c.post("/jobs/big", content=huge, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "at most 65,536" in r.json()["detail"], r.text

    def chunks():
        for _ in range(100):
            yield b"x" * 1000

    r = c.post("/jobs/big", content=chunks(), headers={"content-type": "application/json"})  # no Content-Length
    assert r.status_code == 413, r.text
    assert c.get("/jobs").json()["jobs"] == []


def test_a_job_id_too_long_for_a_file_name_does_not_stop_the_others(servers, file_url, tmp_path):
    server = Server(file_url, tmp_path / "state.json")
    servers.append(server)
    c = server.client
    long_id = "a" + ":" * 127
    assert c.post(f"/jobs/{long_id}").status_code == 201
    assert c.post("/jobs/j1").status_code == 201
    for job in (long_id, "j1"):
        proc = feed(file_url, job, "--synthetic", "ranks=4,iterations=20,step_ms=50", "--speed", "100")
        assert proc.wait(timeout=60) == 0, proc.stdout.read()
    for job in (long_id, "j1"):
        view = wait_for(lambda: (v := c.get(f"/{job}").json())["status"] == "finished" and v,
                        what=f"{job} polled to its end-of-run row")
        assert view["poll_error"] is None and view["iteration_count"] == 20
    assert c.get("/").json()["status"] == "ok"


def test_a_client_that_sends_its_request_too_slowly_is_disconnected(servers, file_url, tmp_path):
    server = Server(file_url, tmp_path / "state.json", 30.0, "--request-timeout", "1")
    servers.append(server)
    slow = socket.create_connection(("127.0.0.1", server.port))
    stop = threading.Event()

    def trickle() -> None:  # one more header byte every 0.2 s: never a whole request
        with contextlib.suppress(OSError):
            slow.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
            while not stop.wait(0.2):
                slow.sendall(b"x")

    sender = threading.Thread(target=trickle, daemon=True)
    started = time.monotonic()
    sender.start()
    try:
        slow.settimeout(15)
        try:
            answer = slow.recv(1024)
        except ConnectionResetError:  # closed with a trickled byte unread: the kernel resets
            answer = b""
        assert answer == b""  # closed by the server, no answer
        assert time.monotonic() - started < 8
    finally:
        stop.set()
        sender.join(5)
        slow.close()
    with httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=10.0) as c:  # keep-alive
        for _ in range(4):  # 2 s on one connection: each request arrives in time, none is cut
            assert c.get("/").status_code == 200
            time.sleep(0.5)


def test_jobs_are_listed_a_page_at_a_time(servers, file_url, tmp_path):
    server = Server(file_url, tmp_path / "state.json")
    servers.append(server)
    c = server.client
    for k in range(250):
        assert c.post(f"/jobs/j{k:03d}").status_code == 201
    first = c.get("/jobs").json()
    assert [j["job_id"] for j in first["jobs"]] == [f"j{k:03d}" for k in range(100)]
    assert (first["total"], first["offset"], first["limit"], first["next_offset"]) == (250, 0, 100, 100)
    seen, offset = [], 0
    while offset is not None:
        page = c.get("/jobs", params={"offset": offset, "limit": 64}).json()
        seen += [j["job_id"] for j in page["jobs"]]
        offset = page["next_offset"]
    assert seen == [f"j{k:03d}" for k in range(250)]
    for bad in ({"limit": 0}, {"limit": 1001}, {"offset": -1}, {"limit": "x"}):
        r = c.get("/jobs", params=bad)
        assert r.status_code == 422 and ("limit" in r.json()["detail"] or "offset" in r.json()["detail"])


def test_metrics_are_served_gzipped_to_clients_that_take_it(servers, file_url, tmp_path):
    server = Server(file_url, tmp_path / "state.json")
    servers.append(server)
    server.client.post("/jobs/a")
    plain = server.client.get("/metrics", headers={"accept-encoding": "identity"})
    assert "content-encoding" not in plain.headers and 'straggler_job_iterations{job_id="a"}' in plain.text
    for accept in ("gzip", "br, gzip;q=0.5", "*"):
        r = server.client.get("/metrics", headers={"accept-encoding": accept})
        assert r.headers["content-encoding"] == "gzip" and r.text == plain.text  # httpx decodes it
    r = server.client.get("/metrics", headers={"accept-encoding": "gzip;q=0"})
    assert "content-encoding" not in r.headers
