"""Faults on the store and monitor side, end to end with real processes: a writer killed
mid-write and its segment cut short, then writer processes at once; a full disk under the
file store; a damaged job index among healthy jobs under a running monitor; the monitor
killed (SIGKILL) while a job is silent.

Each test asserts that nothing acknowledged is lost (every write that returned is read
back), that one job's damage stays that job's, and that the damage is reported. Every wait
has its own limit, so a hang fails the test instead of wedging the suite.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import REAL_RUNS, REPO, wait_for
from relax_straggler.stores.file import FileStore
from test_monitor_api import Server, feed

pytestmark = REAL_RUNS

T0 = 1_800_000_000.0
# A writer process: writes iterations FIRST.. (8 ranks each, one write per iteration) to
# job "j" of the store at argv[1], printing each iteration once its write returned.
WRITER = textwrap.dedent("""
    import sys
    from relax_straggler.stores.file import FileStore
    from relax_straggler.stores.base import Sample
    store, first, count = FileStore(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    for it in range(first, first + count):
        store.write([Sample(%r + it, "j", "interval-time", r, it, (100.0 + r,)) for r in range(8)])
        print(it, flush=True)
""" % T0)


def writer(store: Path, first: int, count: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WRITER, str(store), str(first), str(count)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def read_back(store: Path) -> dict[int, int]:
    """Rows read back per iteration of job "j"; every iteration the index lists must be read back."""
    reader = FileStore(str(store))
    listed = [i.iteration for i in reader.iterations("j")]
    its = reader.table("j", 0, 10**9).column("iteration").to_pylist()
    back = {it: its.count(it) for it in sorted(set(its))}
    assert list(back) == listed, "the index lists an iteration whose rows cannot be read back"
    return back


def test_writers_after_a_kill_mid_write_and_a_segment_cut_short_lose_no_acknowledged_row(tmp_path):
    store = tmp_path / "store"
    first = writer(store, 0, 100_000)
    acked = []
    while len(acked) < 40:  # kill it mid-stream, at whatever byte it is writing
        acked.append(int(first.stdout.readline()))
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    acked += [int(line) for line in first.stdout.read().split()]
    segment = store / "jobs" / "j" / "seg-000001.arrows"
    with open(segment, "r+b") as f:  # and the crash took the last 3,000 bytes the kernel had not written
        f.truncate(max(segment.stat().st_size - 3000, 0))
    survived = set(read_back(store))
    writers = [writer(store, 1_000_000 * k, 30) for k in (1, 2, 3)]  # three at once, on one job
    outs = [w.communicate(timeout=120) for w in writers]
    assert [w.returncode for w in writers] == [0, 0, 0], [err[-2000:] for _, err in outs]
    new = [int(it) for out, _ in outs for it in out.split()]
    assert len(new) == 90
    back = read_back(store)
    assert all(back.get(it) == 8 for it in new)  # every acknowledged write of the new writers
    assert survived <= set(back) and len(survived) >= len(acked) - 5  # the earlier frames before the cut
    reader = FileStore(str(store))
    reader.iterations("j")
    assert any("cut short" in p for p in reader.problems), reader.problems


FILL = textwrap.dedent("""
    import json, os, sys
    from relax_straggler.stores.file import FileStore
    from relax_straggler.stores.base import Sample, StoreError
    root = sys.argv[1]
    store = FileStore(os.path.join(root, "store"))
    acked, refused = [], 0
    with open(os.path.join(root, "ballast"), "wb") as f:  # most of the disk, freed later
        f.write(b"x" * (%d * 1024))
    for it in range(400):  # the disk fills up
        if it == 250:
            os.remove(os.path.join(root, "ballast"))  # space again: writing goes on
        try:
            store.write([Sample(%r + it, "j", "interval-time", r, it, (100.0 + r,)) for r in range(64)])
            acked.append(it)
        except StoreError:
            refused += 1
    reader = FileStore(os.path.join(root, "store"))
    its = reader.table("j", 0, 10**9).column("iteration").to_pylist()
    print(json.dumps({"acked": acked, "refused": refused, "back": its,
                      "listed": [i.iteration for i in reader.iterations("j")],
                      "problems": reader.problems + store.problems}))
""")


def test_a_full_disk_under_the_file_store_refuses_writes_and_keeps_every_acknowledged_one(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    size_kb, ballast_kb = 512, 384
    fill = tmp_path / "fill.py"
    fill.write_text(FILL % (ballast_kb, T0))
    script = f"mount -t tmpfs -o size={size_kb}k tmpfs {mount} || exit 77; exec {sys.executable} {fill} {mount}"
    try:
        out = subprocess.run(["unshare", "--map-root-user", "--mount", "sh", "-c", script], cwd=REPO,
                             capture_output=True, text=True, timeout=300)
    except FileNotFoundError:
        pytest.skip("no unshare(1) to mount a small tmpfs")
    if out.returncode == 77 or "unshare:" in out.stderr[:200]:
        pytest.skip(f"cannot mount a tmpfs here: {out.stderr.strip()[:200]}")
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["refused"] > 0 and any(it > 250 for it in result["acked"])  # full, then space again
    back = {it: result["back"].count(it) for it in set(result["back"])}
    assert sorted(back) == result["acked"] == result["listed"]  # every acknowledged write, and only those
    assert set(back.values()) == {64}
    assert result["problems"] == []  # a refused write leaves no half frame or half line to report


@pytest.fixture
def servers():
    started: list[Server] = []
    yield started
    for s in started:
        s.stop(signal.SIGKILL)


def test_a_damaged_job_index_stays_that_jobs_under_a_running_monitor(servers, file_url, tmp_path):
    server = Server(file_url, tmp_path / "state.json")
    servers.append(server)
    c = server.client
    for job in ("bad", "good"):
        assert c.post(f"/jobs/{job}").status_code == 201
    proc = feed(file_url, "bad", "--synthetic", "ranks=4,iterations=10,step_ms=50", "--speed", "1000",
                  "--no-end")  # its index: one line per iteration
    assert proc.wait(timeout=60) == 0
    index = Path(file_url[len("file://"):]) / "jobs" / "bad" / "index.jsonl"
    with open(index, "ab") as f:
        f.write(b"[" * 100_000 + b"]" * 100_000 + b"\n")  # a RecursionError in a JSON parser
    proc = feed(file_url, "good", "--synthetic", "ranks=4,iterations=20,step_ms=50", "--speed", "1000")
    assert proc.wait(timeout=60) == 0
    wait_for(lambda: c.get("/good").json()["iteration_count"] == 20, what="the healthy job's 20 iterations")
    bad = c.get("/bad").json()
    assert bad["iteration_count"] == 10 and "index.jsonl line 11" in bad["poll_error"]
    assert len(bad["store_problems"]) == 1 and "index.jsonl line 11" in bad["store_problems"][0]
    health = c.get("/").json()
    assert health["status"] == "degraded" and health["store"]["ok"]
    assert health["job_problems"] == {"count": 1, "jobs": ["bad"]}


def test_the_hang_clock_goes_on_across_a_monitor_killed_while_a_job_is_silent(servers, file_url, tmp_path):
    state = tmp_path / "state.json"
    server = Server(file_url, state, 4.0)
    servers.append(server)
    assert server.client.post("/jobs/quiet").status_code == 201
    proc = feed(file_url, "quiet", "--synthetic", "ranks=4,iterations=30,step_ms=50", "--speed", "1000",
                  "--no-end")
    assert proc.wait(timeout=60) == 0
    wait_for(lambda: server.client.get("/quiet").json()["iteration_count"] == 30, what="30 iterations")
    seen_at = time.monotonic()  # the last iteration arrived before this; the job is silent from here
    time.sleep(2.0)
    server.stop(signal.SIGKILL)
    again = Server(file_url, state, 4.0)
    servers.append(again)

    def since_last_iteration(view: dict) -> bool:
        # counted from the last iteration's arrival (before the kill), not from the restart: a
        # second more than the time since seen_at at most (the answer's own latency)
        return view["hang_check"]["seconds_since_last_iteration"] >= time.monotonic() - seen_at - 1.0

    view = wait_for(lambda: (v := again.client.get("/quiet").json())["iteration_count"] == 30 and v,
                    what="the iterations read again")
    assert since_last_iteration(view), view["hang_check"]
    view = wait_for(lambda: (v := again.client.get("/quiet").json())["status"] == "hanging" and v, what="hanging")
    assert since_last_iteration(view) and view["hang_check"]["seconds_since_last_iteration"] > 4.0
