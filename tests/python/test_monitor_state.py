"""The monitor's state journal (relax_straggler/monitor/state.py) and the registration
limit: a change appends, its cost does not grow with the number of jobs, kill -9 loses
nothing acknowledged, torn and malformed lines, compaction."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from relax_straggler.common.topology import Topology
from relax_straggler.monitor.service import JobLimitError, Monitor, MonitorConfig
from relax_straggler.monitor.state import COMPACT_MIN_BYTES, read_state

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def monitor(tmp_path, file_url):
    made = []

    def make(**kwargs) -> Monitor:
        m = Monitor(MonitorConfig(file_url, state_path=str(tmp_path / "state.json"), **kwargs))
        made.append(m)
        return m

    yield make
    for m in made:
        m.stop()


def test_a_registration_appends_to_the_state_file(monitor, tmp_path):
    m = monitor()
    for k in range(50):
        m.register(f"job-{k}")
    path = tmp_path / "state.json"
    before, inode = path.read_bytes(), path.stat().st_ino
    m.register("one-more", Topology(dp=4, pp=1))
    after = path.read_bytes()
    assert path.stat().st_ino == inode and after.startswith(before)  # appended, not rewritten
    assert after.count(b"\n") == before.count(b"\n") + 1 and len(after) - len(before) < 2000
    m.unregister("job-3")
    assert path.read_bytes().startswith(after)
    state = read_state(str(path))
    assert len(state["jobs"]) == 50 and "job-3" not in state["jobs"]
    assert state["jobs"]["one-more"]["topology"]["dp"] == 4


def test_registration_cost_does_not_grow_with_the_number_of_jobs(monitor):
    m = monitor(max_jobs=2000)

    def cost_ms(first: int, n: int = 100) -> float:
        times = []
        for k in range(first, first + n):
            started = time.perf_counter()
            m.register(f"job-{k}")
            times.append((time.perf_counter() - started) * 1000)
        return statistics.median(times)  # a scheduling hiccup on the loaded cores moves the mean, not this

    small = cost_ms(0)
    for k in range(100, 1500):
        m.register(f"job-{k}")
    large = cost_ms(1500)
    # a rewrite of the whole state took ~20 ms per registration at 1,500 jobs; an append ~0.1 ms
    assert large < 3 * small + 3.0, (small, large)


def test_acknowledged_registrations_survive_kill_9(tmp_path, file_url):
    code = textwrap.dedent(f"""
        from relax_straggler.monitor.service import Monitor, MonitorConfig
        m = Monitor(MonitorConfig({file_url!r}, state_path={str(tmp_path / "state.json")!r}, max_jobs=100000))
        k = 0
        while True:
            m.register(f"job-{{k}}")
            print(k, flush=True)  # acknowledged
            k += 1
    """)
    for round_ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
        acked = -1
        for line in proc.stdout:
            acked = int(line)
            if acked >= 200 * (round_ + 1) + 37 * round_:  # a different moment each round
                break
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        jobs = read_state(str(tmp_path / "state.json"))["jobs"]
        assert {f"job-{k}" for k in range(acked + 1)} <= set(jobs), round_


def test_a_torn_last_line_is_dropped_and_the_rest_kept(monitor, tmp_path):
    m = monitor()
    m.register("a")
    m.register("b")
    m._journal.close()  # as a process killed here would
    path = tmp_path / "state.json"
    with open(path, "ab") as f:
        f.write(b'{"job":"c","record":{"registered_')
    again = Monitor(MonitorConfig(m.config.store_url, state_path=str(path)))
    try:
        assert again.job_ids() == ["a", "b"]
        assert path.read_bytes().endswith(b"\n")  # compacted at start: the torn bytes are gone
        again.register("c")
    finally:
        again.stop()
    assert sorted(read_state(str(path))["jobs"]) == ["a", "b", "c"]


def test_a_malformed_line_inside_the_journal_is_refused_naming_it(tmp_path, file_url):
    path = tmp_path / "state.json"
    path.write_text('{"version":2,"store":"%s"}\n{"job":"a"}\n{"job":"b","deleted":true}\n' % file_url)
    with pytest.raises(ValueError, match="state.json: cannot read it: line 2: malformed journal entry"):
        Monitor(MonitorConfig(file_url, state_path=str(path)))


def test_the_journal_is_compacted_as_it_grows(monitor, tmp_path):
    m = monitor()
    m.register("other")
    for k in range(6000):  # ~400 bytes each: past COMPACT_MIN_BYTES, so compacted at least once
        m.register("busy", Topology(dp=1 + k % 7, pp=1))
    size = (tmp_path / "state.json").stat().st_size
    assert size < COMPACT_MIN_BYTES + 10_000
    state = read_state(str(tmp_path / "state.json"))
    assert sorted(state["jobs"]) == ["busy", "other"] and state["jobs"]["busy"]["topology"]["dp"] == 1 + 5999 % 7


def test_registrations_beyond_the_limit_are_refused(monitor):
    m = monitor(max_jobs=3)
    for job in ("a", "b", "c"):
        m.register(job)
    with pytest.raises(JobLimitError, match="watches 3 jobs, its limit"):
        m.register("d")
    assert m.register("a", Topology(dp=2, pp=1))[1] is False  # registered already: not a new job
    m.unregister("b")
    assert m.register("d")[1] is True


def test_a_version_1_state_file_is_read_and_rewritten_as_a_journal(tmp_path, file_url):
    path = tmp_path / "state.json"
    first = Monitor(MonitorConfig(file_url, state_path=str(path)))
    first.register("old", Topology(dp=8, pp=1))
    first.stop()
    jobs = read_state(str(path))["jobs"]
    path.write_text(json.dumps({"version": 1, "store": file_url, "jobs": jobs}))
    again = Monitor(MonitorConfig(file_url, state_path=str(path)))
    try:
        assert again.view("old")["topology"]["dp"] == 8
        assert read_state(str(path))["version"] == 2
    finally:
        again.stop()


def test_max_jobs_must_be_positive(file_url):
    with pytest.raises(ValueError, match="max_jobs must be >= 1"):
        MonitorConfig(file_url, max_jobs=0)


def test_state_journal_leaves_no_temporary_file(monitor, tmp_path):
    m = monitor()
    m.register("a")
    m.stop()
    assert [n for n in os.listdir(tmp_path) if n.startswith("state")] == ["state.json"]


def test_a_deeply_nested_journal_line_is_refused_naming_file_and_line(tmp_path, file_url):
    path = tmp_path / "state.json"
    path.write_bytes(b'{"version":2,"store":"%s"}\n{"job":"a","record":%s}\n'
                     % (file_url.encode(), b"[" * 100_000 + b"]" * 100_000))
    with pytest.raises(ValueError, match=r"state.json: cannot read it: line 2: nested too deep"):
        Monitor(MonitorConfig(file_url, state_path=str(path)))


def test_a_malformed_record_is_refused_naming_its_line(tmp_path, file_url):
    path = tmp_path / "state.json"
    path.write_text('{"version":2,"store":"%s"}\n{"job":"a","record":{"registered_at":1}}\n' % file_url)
    with pytest.raises(ValueError, match=r"state.json line 2: malformed record of job 'a'"):
        Monitor(MonitorConfig(file_url, state_path=str(path)))


@pytest.mark.parametrize("field", ["registered_at", "pending", "seen iteration", "seen time", "last_iteration",
                                   "last_progress", "iteration_count", "normal_streak", "sum_ms"])
def test_an_infinite_number_in_a_record_is_a_result_or_refused_naming_the_file(tmp_path, file_url, field):
    # 1e400 reads as inf: int(inf) raised OverflowError out of the monitor's start
    record = {"registered_at": 1.0, "topology": None, "results": [], "pending": [5, 6], "error": None,
              "transitions": [[1.0, "active"]],
              "detector": {"registered_at": 1.0, "baseline": [], "slow_streak": [], "normal_streak": 0,
                           "detected": False, "last_progress": 1.0, "last_iteration": 4, "seen_before": None,
                           "last_growth": None, "last_slow": False, "iteration_count": 5, "slow_iterations": 0,
                           "sum_ms": 0.0, "min_ms": None, "max_ms": None, "last_ms": None}}
    seen = [6, 2.0]
    inf = float("inf")
    if field == "pending":
        record["pending"] = [inf, 6]
    elif field.startswith("seen"):
        seen[field == "seen time"] = inf
    elif field == "registered_at":
        record["registered_at"] = inf
    else:
        record["detector"][field] = inf
    path = tmp_path / "state.json"
    lines = [{"version": 2, "store": file_url}, {"job": "a", "record": record}, {"job": "a", "seen": seen}]
    path.write_text("".join(json.dumps(line).replace("Infinity", "1e400") + "\n" for line in lines))
    try:
        m = Monitor(MonitorConfig(file_url, state_path=str(path)))
    except ValueError as exc:
        assert "state.json" in str(exc)
    else:
        m.stop()
