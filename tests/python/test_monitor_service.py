"""The monitor service (relax_straggler/monitor/service.py and the parts it composes) in
process: polls driven by the test (poll_once), a real file store, the analysis pool, the
state file, store outages."""

from __future__ import annotations

import gzip
import json
import os
import threading
import time

import pytest

from relax_straggler.common.topology import Topology
from relax_straggler.monitor import metrics as metrics_module
from relax_straggler.monitor.feed import Injection, Synthetic, feed
from relax_straggler.monitor.service import Monitor, MonitorConfig
from relax_straggler.monitor.state import read_state
from relax_straggler.monitor.trigger import TriggerConfig
from relax_straggler.stores import verdict_rows
from relax_straggler.stores.base import STEP_METRIC, Sample, StoreError
from relax_straggler.stores.file import FileStore
from relax_straggler.stores.opener import open_store

from conftest import wait_for


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def write_job(url: str, job: str, iterations: int, inject: str = "5:forward:80:40", first: int = 0,
              end: bool = False) -> None:
    """Replays the synthetic 16-rank job; end: with its end-of-run row (else it stops as a crash would)."""
    store = open_store(url)
    try:
        steps = (s for s in Synthetic(ranks=16, iterations=iterations, step_ms=100, seed=3).steps() if s.step >= first)
        feed(steps, store, job, speed=1e9, injections=[Injection.parse(inject)] if inject else [],
             ranks_per_node=4, end_of_run=end)
    finally:
        store.close()


@pytest.fixture
def make_monitor(tmp_path, store_url):
    made = []

    def make(clock=None, **trigger) -> Monitor:
        cfg = MonitorConfig(store_url, check_interval_s=0.1, trigger=TriggerConfig(**trigger),
                            state_path=str(tmp_path / "state.json"))
        m = Monitor(cfg, **({"clock": clock} if clock else {}))
        made.append(m)
        return m

    yield make
    for m in made:
        m.stop()


def test_straggler_window_is_analysed_and_named(make_monitor, store_url):
    m = make_monitor()
    m.register("job-a", Topology(dp=16, pp=1, ranks_per_node=4))
    write_job(store_url, "job-a", 50)
    m.poll_once()
    view = wait_for(lambda: (v := m.view("job-a"))["status"] == "detected" and v, what="detected")
    assert [t["status"] for t in view["transitions"]] == ["active", "predicting", "detected"]
    assert view["slowdown_check"]["straggler_prediction"] == {"straggler_rank": 5, "straggler_node": "node-1"}
    ev = view["evidence"]
    assert ev["window"]["first_iteration"] == 40 and ev["window"]["last_iteration"] == 44
    assert (ev["kind"], ev["stage"], ev["votes"], ev["algorithms"]) == ("individual", "forward", 6, 6)
    assert view["iteration_count"] == 50 and view["last_iteration"] == 49
    assert view["slowdown_check"]["slow_iterations"] == 10
    assert view["metrics"]["max_iteration_duration"] > 1.7 * view["metrics"]["min_iteration_duration"]
    assert ev["live_verdict"] is None  # the job wrote no verdict rows


def test_the_verdict_the_job_wrote_is_served_beside_the_analysis(make_monitor, store_url):
    m = make_monitor()
    m.register("job-v", Topology(dp=16, pp=1, ranks_per_node=4))
    write_job(store_url, "job-v", 50)
    now = time.time()
    rows = []
    for it, state in ((42, "suspected"), (44, "straggler")):
        sub, values = verdict_rows.encode(state, "forward", "compute", [5 if state == "straggler" else -1, 44, 1.0, 1.8],
                                          verdict_rows.VERDICT_VALUES)
        rows.append(Sample(now, "job-v", "straggler/verdict", 0, it, tuple(values), subname=sub))
        sub, values = verdict_rows.encode(state, "forward", "compute", [5, 0, 44, 1.0, 1.8, 180.0, 100.0, 80.0, 0.0, 3, 3],
                                          verdict_rows.FINDING_VALUES)
        rows.append(Sample(now, "job-v", "straggler/verdict/finding", 0, it, tuple(values), subname=sub))
    store = open_store(store_url)
    try:
        store.write(rows)
    finally:
        store.close()
    m.poll_once()
    view = wait_for(lambda: (v := m.view("job-v"))["status"] == "detected" and v, what="detected")
    live = view["evidence"]["live_verdict"]
    assert (live["step"], live["status"], live["rank"], live["stage"], live["cause"]) == (44, "straggler", 5, "forward",
                                                                                          "compute")
    assert [(f["state"], f["rank"], f["excess_ms"]) for f in live["findings"]] == [("straggler", 5, 80.0)]
    # The timer reader knows the verdict's rows: neither unknown names nor bad values.
    assert "straggler/verdict" not in json.dumps(m.results("job-v")[-1]["problems"])


def test_clean_job_triggers_nothing(make_monitor, store_url):
    m = make_monitor()
    m.register("calm")
    write_job(store_url, "calm", 60, inject="")
    m.poll_once()
    view = m.view("calm")
    assert view["status"] == "active" and view["analyses"] == 0 and view["analysing"] is None
    assert view["iteration_count"] == 60


def test_rows_older_than_the_registration_are_never_read(make_monitor, store_url):
    write_job(store_url, "old", 50)  # slow from iteration 40, all before the registration
    m = make_monitor()
    m.register("old")
    m.poll_once()
    assert m.view("old")["iteration_count"] == 0


def test_malformed_rows_are_reported_not_fatal(make_monitor, store_url):
    m = make_monitor()
    m.register("messy")
    write_job(store_url, "messy", 50)
    store = open_store(store_url)
    now = time.time()
    store.write([Sample(now, "messy", "no-such-timer", 3, 41, (5.0,)),
                 Sample(now, "messy", "batch-generator", 2, 42, (-4.0,)),
                 Sample(now, "messy", STEP_METRIC, 7, 43, (180.0,))])  # a second interval-time row of rank 7
    store.close()
    m.poll_once()
    wait_for(lambda: m.view("messy")["status"] == "detected", what="detected")
    result = m.results("messy")[-1]
    assert result["straggler_rank"] == 5
    assert result["problems"]["by_kind"] == {"unknown_op": 1, "bad_value": 1, "duplicate": 1}
    assert any("no-such-timer" in p and "iteration 41 rank 3" in p for p in result["problems"]["first"])


def test_a_stray_huge_rank_id_fails_the_analysis_clearly(tmp_path, file_url):
    # one row naming rank 2^31 - 1 must not size the engine's arrays (world = rank + 1)
    m = Monitor(MonitorConfig(file_url, check_interval_s=0.1, state_path=str(tmp_path / "state.json")))
    try:
        m.register("stray")
        write_job(file_url, "stray", 50)
        store = open_store(file_url)
        store.write([Sample(time.time(), "stray", "forward-compute", 2**31 - 1, 40, (50.0,))])  # window's first
        store.close()
        m.poll_once()
        view = wait_for(lambda: (v := m.view("stray"))["analysis_error"] and v, what="the analysis failing")
        assert "rank 2147483647 is beyond the 1,048,576 ranks" in view["analysis_error"], view["analysis_error"]
        assert view["status"] == "active" and view["analysing"] is None
    finally:
        m.stop()


def test_hang_after_threshold_with_injected_clock(make_monitor, store_url):
    clock = Clock()
    m = make_monitor(clock=clock, hang_threshold_s=60.0)
    m.register("quiet")
    write_job(store_url, "quiet", 10, inject="")
    m.poll_once()
    clock.now += 59.0
    m.poll_once()
    assert m.view("quiet")["status"] == "active"
    clock.now += 2.0
    m.poll_once()
    view = m.view("quiet")
    assert view["status"] == "hanging" and view["hang_check"]["is_hanging"]
    assert view["hang_check"]["seconds_since_last_iteration"] == pytest.approx(61.0)
    assert [t["status"] for t in view["transitions"]] == ["active", "hanging"]


def test_a_job_that_ends_normally_is_finished_never_hanging(make_monitor, store_url):
    clock = Clock()
    m = make_monitor(clock=clock, hang_threshold_s=60.0)
    m.register("done")
    m.register("crashed")
    write_job(store_url, "done", 10, inject="", end=True)
    write_job(store_url, "crashed", 10, inject="")
    m.poll_once()
    m.poll_once()  # no new iteration: the end-of-run row is looked for
    clock.now += 3600.0
    m.poll_once()
    done, crashed = m.view("done"), m.view("crashed")
    assert done["status"] == "finished" and not done["hang_check"]["is_hanging"]
    assert done["end"]["reason"] == "replay" and done["end"]["last_step"] == 9 and done["end"]["steps"] == 10
    assert [t["status"] for t in done["transitions"]] == ["active", "finished"]
    assert crashed["status"] == "hanging" and crashed["end"] is None
    assert 'straggler_job_status{job_id="done",status="finished"} 1.0' in m.metrics.text().decode()
    m.stop()
    again = Monitor(m.config, clock=clock)  # the finished state survives a restart
    try:
        again.poll_once()
        assert again.view("done")["status"] == "finished"
    finally:
        again.stop()


def test_a_malformed_end_row_is_named_once_and_the_job_stays_unfinished(make_monitor, store_url, caplog):
    clock = Clock()
    m = make_monitor(clock=clock, hang_threshold_s=60.0)
    m.register("odd-end")
    write_job(store_url, "odd-end", 10, inject="")
    store = open_store(store_url)
    try:
        store.write([Sample(time.time(), "odd-end", "straggler/end", 0, 9, (9.0, 10.0), subname="crashed")])
    finally:
        store.close()
    with caplog.at_level("WARNING", logger="relax_straggler.monitor.poll"):
        for _ in range(3):
            m.poll_once()
    named = [r.getMessage() for r in caplog.records if "straggler/end row" in r.getMessage()]
    assert len(named) == 1 and "subname 'crashed' is not one of uninstall, replay" in named[0], named
    clock.now += 61.0
    m.poll_once()
    assert m.view("odd-end")["status"] == "hanging"


def test_a_job_run_again_after_its_end_is_no_longer_finished(make_monitor, store_url):
    clock = Clock()
    m = make_monitor(clock=clock, hang_threshold_s=60.0)
    m.register("requeued")
    write_job(store_url, "requeued", 10, inject="", end=True)
    m.poll_once()
    m.poll_once()
    assert m.view("requeued")["status"] == "finished"
    write_job(store_url, "requeued", 20, inject="", first=10)  # iterations after the end row, then a crash
    m.poll_once()
    assert m.view("requeued")["status"] == "active" and m.view("requeued")["end"] is None
    clock.now += 61.0
    m.poll_once()
    assert m.view("requeued")["status"] == "hanging"


def hang_answer_rows(job: str, step: int, rank: int, timestamp: float):
    """The store sink's row of a hang answer naming `rank` (the product's own path)."""
    from relax_straggler.hang import diagnose
    from relax_straggler.hang.publish import hang_event
    from relax_straggler.stores.hang_rows import hang_table

    def snap(r, seq):
        entry = {"seq": seq, "op": "all_reduce", "ago_s": 70.0}
        return {"rank": r, "step": step, "wall": timestamp, "stalled_s": 70.0,
                "groups": [{"name": "0", "desc": "default_pg", "ranks": [0, 1, 2, 3], "collective": entry,
                            "p2p": None, "completed": None}]}

    answer = diagnose({r: snap(r, 6 if r != rank else 5) for r in range(4)}, range(4))
    return hang_table(hang_event(answer).metrics, job, timestamp, "node-0")


def hanging(make_monitor, store_url, job: str) -> tuple[Monitor, Clock]:
    """A monitor whose job `job` wrote 10 iterations and then nothing for 61 s (threshold 60)."""
    clock = Clock()
    m = make_monitor(clock=clock, hang_threshold_s=60.0)
    m.register(job)
    write_job(store_url, job, 10, inject="")
    m.poll_once()
    clock.now += 61.0
    return m, clock


def test_a_hanging_job_serves_the_answer_its_ranks_wrote(make_monitor, store_url):
    m, clock = hanging(make_monitor, store_url, "stuck")
    m.poll_once()
    view = m.view("stuck")
    assert view["hang_check"]["is_hanging"] and view["hang_check"]["rca"] is None  # not answered yet
    store = open_store(store_url)
    try:
        store.write_table(hang_answer_rows("stuck", 9, rank=2, timestamp=clock.now - 30))  # an older hang's
        store.write_table(hang_answer_rows("stuck", 9, rank=3, timestamp=clock.now))
    finally:
        store.close()
    m.poll_once()
    rca = m.view("stuck")["hang_check"]["rca"]
    assert (rca["kind"], rca["rank"], rca["op"], rca["seq"], rca["group"], rca["step"]) == \
        ("lagging", 3, "all_reduce", 6, "default_pg", 9)
    assert rca["answer"].startswith("rank 3 never entered all_reduce #6 of group default_pg (ranks 0-3)")
    assert rca["answered_at"] == pytest.approx(clock.now)
    # The culprit's node as its own rows name it (16 ranks, 4 per node: rank 3 on node-0).
    view = m.view("stuck")
    assert rca["node"] == "node-0"
    assert {k: view["verdict"][k] for k in ("rank", "node", "status", "stage", "cause", "since_step")} == \
        {"rank": 3, "node": "node-0", "status": "hanging", "stage": "communication", "cause": "lagging",
         "since_step": 9}
    assert view["drain_plan"]["nodes"] == ["node-0"] and "kubectl cordon node-0" in view["drain_plan"]["commands"][
        "kubernetes"]
    m.metrics.changed()
    assert ('straggler_job_verdict_info{cause="lagging",job_id="stuck",node="node-0",rank="3",stage="communication",'
            'status="hanging"} 1.0') in m.metrics.text().decode()
    # Steps end again: the stop is over and so is its answer.
    write_job(store_url, "stuck", 12, inject="", first=10)
    m.poll_once()
    view = m.view("stuck")
    assert not view["hang_check"]["is_hanging"] and view["hang_check"]["rca"] is None


@pytest.mark.parametrize("subname,why", [("not json", "subname is not JSON"),
                                         ('{"step": "9"}', "subname lacks kind, rank"),
                                         ('{"kind": "lagging", "rank": 1, "group": "g", "group_ranks": "0-1", '
                                          '"op": "all_reduce", "seq": 2, "waiting_ranks": 1, "waited_s": 3, '
                                          '"last_completed": "", "no_snapshot_ranks": "", "stalled_s": 3, '
                                          '"step": "9", "answer": "a"}', "step must be an integer")])
def test_a_malformed_hang_row_is_named_in_the_answer(make_monitor, store_url, subname, why):
    job = f"garbled-{len(why)}"  # one job per case: the ClickHouse server outlives a test
    m, clock = hanging(make_monitor, store_url, job)
    store = open_store(store_url)
    try:
        store.write([Sample(clock.now, job, "straggler/hang", 0, 9, (2.0,), subname=subname)])
    finally:
        store.close()
    m.poll_once()
    view = m.view(job)
    assert view["poll_error"] is None
    assert f"straggler/hang row of job '{job}', iteration 9: {why}" in view["hang_check"]["rca"]["error"]


def test_restart_keeps_jobs_results_and_reruns_a_cut_analysis(make_monitor, store_url, tmp_path):
    m = make_monitor()
    m.register("done", Topology(dp=16, pp=1, ranks_per_node=4))
    m.register("idle")
    write_job(store_url, "done", 50)
    m.poll_once()
    wait_for(lambda: m.view("done")["status"] == "detected", what="detected")
    m.stop()
    state = read_state(str(tmp_path / "state.json"))
    assert sorted(state["jobs"]) == ["done", "idle"]
    # a monitor killed while an analysis ran: the state names the window, the next one reruns it (the
    # state written back in the version 1 form, one JSON object, which a monitor still reads)
    state["jobs"]["done"]["pending"] = [40, 44]
    state["jobs"]["done"]["results"] = []
    (tmp_path / "state.json").write_text(json.dumps({**state, "version": 1}))
    again = make_monitor()
    assert again.job_ids() == ["done", "idle"]
    assert again.view("done")["topology"]["ranks_per_node"] == 4
    again.start()
    view = wait_for(lambda: (v := again.view("done"))["analyses"] == 1 and v, what="rerun analysis")
    assert view["slowdown_check"]["straggler_prediction"]["straggler_rank"] == 5
    again.stop()
    third = make_monitor()
    assert third.view("done")["analyses"] == 1 and third.view("done")["status"] == "detected"


def test_store_outage_is_reported_and_recovered(file_url, tmp_path):
    m = Monitor(MonitorConfig(file_url, check_interval_s=0.1, state_path=str(tmp_path / "state.json")))
    m.register("j")
    write_job(file_url, "j", 10, inject="")
    m.poll_once()
    assert m.health()["ok"]
    store_dir = file_url[len("file://"):]
    os.rename(store_dir, str(tmp_path / "away"))
    m.poll_once()
    health = m.health()
    assert not health["ok"] and "missing" in health["error"] and health["errors"] == 1
    m.poll_once()  # inside the backoff: no new attempt, no new error
    assert m.health()["errors"] == 1
    wait_for(lambda: (m.poll_once(), m.health()["errors"] >= 2)[1], what="a reconnect attempt after the backoff")
    assert not os.path.exists(store_dir)  # the reconnect did not start over on an empty store
    os.rename(str(tmp_path / "away"), store_dir)
    write_job(file_url, "j", 15, inject="", first=10)
    wait_for(lambda: (m.poll_once(), m.health()["ok"])[1], what="reconnect")
    assert m.view("j")["iteration_count"] == 15 and m.job_ids() == ["j"]
    m.stop()


def test_unreadable_state_file_is_refused(tmp_path, file_url):
    path = tmp_path / "state.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="state.json: cannot read"):
        Monitor(MonitorConfig(file_url, state_path=str(path)))


def test_a_state_file_of_another_store_is_refused(tmp_path, file_url):
    # Restoring another store's jobs would watch job ids this store may not have.
    path = str(tmp_path / "state.json")
    first = Monitor(MonitorConfig(file_url, state_path=path))
    first.register("j")
    first.stop()
    other = "file://" + str(tmp_path / "other-store")
    with pytest.raises(ValueError, match="state.json: the state of store .* not of " + other):
        Monitor(MonitorConfig(other, state_path=path))


def test_health_before_the_first_poll_says_why_it_is_not_ok(tmp_path, file_url):
    m = Monitor(MonitorConfig(file_url, state_path=str(tmp_path / "state.json")))
    health = m.health()
    assert not health["ok"] and "not connected yet" in health["error"]
    m.poll_once()
    assert m.health()["ok"] and m.health()["error"] is None
    m.stop()


def test_clickhouse_stores_have_their_own_default_state_file():
    a = MonitorConfig("clickhouse://127.0.0.1:8123/default").resolved_state_path()
    b = MonitorConfig("clickhouse://127.0.0.1:9123/default").resolved_state_path()
    c = MonitorConfig("clickhouse://127.0.0.1:8123/metrics").resolved_state_path()
    d = MonitorConfig("clickhouse://127.0.0.1:8123/default?table=dist_metrics").resolved_state_path()
    assert len({a, b, c, d}) == 4
    assert a == "relax-straggler-monitor-127.0.0.1-8123-default.json"
    assert MonitorConfig("clickhouse://127.0.0.1:8123/default?table=megatron_metrics").resolved_state_path() == a


def test_a_clickhouse_url_with_a_bad_database_is_refused_at_start(tmp_path):
    # found at start, not by the poll thread (which it would stop for good)
    with pytest.raises(ValueError, match="database 'bad-db' must be letters, digits and '_'"):
        MonitorConfig("clickhouse://127.0.0.1:8123/bad-db", state_path=str(tmp_path / "state.json"))


def test_polling_survives_an_unexpected_error(tmp_path, file_url):
    class FailingOnce(Clock):  # the first poll's clock read fails, as a bug in a poll would
        failed = False

        def __call__(self) -> float:
            if not self.failed and threading.current_thread().name == "straggler-monitor-poll":
                self.failed = True
                raise RuntimeError("boom")
            return super().__call__()

    clock = FailingOnce()
    m = Monitor(MonitorConfig(file_url, check_interval_s=0.05, state_path=str(tmp_path / "state.json")), clock=clock)
    try:
        m.register("j")
        write_job(file_url, "j", 10, inject="")
        m.start()
        wait_for(lambda: m.view("j")["iteration_count"] == 10, what="polls after the failed one")
        assert clock.failed
    finally:
        m.stop()


def test_a_job_whose_reads_fail_does_not_stop_the_others(tmp_path, file_url, monkeypatch):
    # one job's store error (e.g. a name its store cannot hold) is that job's, not every later job's
    real = FileStore.iterations

    def failing(self, job, *args, **kwargs):
        if job == "bad":
            raise StoreError(f"{self.url}: cannot read job 'bad': File name too long")
        return real(self, job, *args, **kwargs)

    monkeypatch.setattr(FileStore, "iterations", failing)
    m = Monitor(MonitorConfig(file_url, check_interval_s=0.1, state_path=str(tmp_path / "state.json")))
    try:
        m.register("bad")
        m.register("j1")
        write_job(file_url, "j1", 10, inject="")
        m.poll_once()
        m.poll_once()
        assert m.view("j1")["iteration_count"] == 10 and m.view("j1")["poll_error"] is None
        assert "File name too long" in m.view("bad")["poll_error"]
        assert m.health()["ok"]  # the store answers: no reconnect, no backoff for the others
        monkeypatch.setattr(FileStore, "iterations", real)
        m.poll_once()
        assert m.view("bad")["poll_error"] is None
    finally:
        m.stop()


def test_the_longest_legal_job_id_is_polled_like_any_other(tmp_path, file_url):
    job = "a" + ":" * 127
    m = Monitor(MonitorConfig(file_url, check_interval_s=0.1, state_path=str(tmp_path / "state.json")))
    try:
        m.register(job)
        m.register("j1")
        write_job(file_url, job, 10, inject="")
        write_job(file_url, "j1", 10, inject="")
        m.poll_once()
        assert m.view(job)["iteration_count"] == 10 and m.view("j1")["iteration_count"] == 10
    finally:
        m.stop()


def index_path(file_url: str, job: str) -> str:
    return os.path.join(file_url[len("file://"):], "jobs", job, "index.jsonl")


def test_a_damaged_job_index_never_stops_the_polls_of_the_others(tmp_path, file_url):
    m = Monitor(MonitorConfig(file_url, check_interval_s=0.1, state_path=str(tmp_path / "state.json")))
    try:
        m.register("bad")
        m.register("good")
        write_job(file_url, "bad", 10, inject="")
        with open(index_path(file_url, "bad"), "ab") as f:
            f.write(b"[" * 100_000 + b"]" * 100_000 + b"\n")  # RecursionError in a JSON parser
        write_job(file_url, "good", 20, inject="")
        m.poll_once()
        assert m.view("good")["iteration_count"] == 20 and m.view("good")["store_problems"] == []
        bad = m.view("bad")
        assert bad["iteration_count"] == 10 and m.view("good")["poll_error"] is None
        assert len(bad["store_problems"]) == 1 and "index.jsonl line 11: unreadable index line: nested too deep" \
            in bad["store_problems"][0]
        assert "skipped damaged data" in bad["poll_error"] and bad["store_problems"][0] in bad["poll_error"]
        assert m.job_problems() == {"count": 1, "jobs": ["bad"]}
    finally:
        m.stop()


def test_any_error_reading_one_job_is_that_jobs_alone(tmp_path, file_url, monkeypatch):
    real = FileStore.iterations

    def failing(self, job, *args, **kwargs):
        if job == "bad":  # a fault no store check foresaw
            raise RecursionError("maximum recursion depth exceeded while decoding a JSON array")
        return real(self, job, *args, **kwargs)

    monkeypatch.setattr(FileStore, "iterations", failing)
    m = Monitor(MonitorConfig(file_url, check_interval_s=0.1, state_path=str(tmp_path / "state.json")))
    try:
        m.register("bad")
        m.register("good")
        write_job(file_url, "good", 20, inject="")
        m.poll_once()
        assert m.view("good")["iteration_count"] == 20 and m.view("good")["poll_error"] is None
        assert m.view("bad")["poll_error"] == ("RecursionError: maximum recursion depth exceeded while decoding a "
                                               "JSON array")
        assert m.health()["ok"] and m.job_problems() == {"count": 1, "jobs": ["bad"]}
        monkeypatch.setattr(FileStore, "iterations", real)
        m.poll_once()
        assert m.view("bad")["poll_error"] is None and m.job_problems() == {"count": 0, "jobs": []}
    finally:
        m.stop()


def abandon(m: Monitor) -> None:
    """Leaves `m` as a kill -9 would: no compaction, no save at stop."""
    m._pool.shutdown(wait=True)
    m._journal.close()


def test_the_hang_clock_survives_a_restart(tmp_path, file_url):
    # iterations seen after the job's last saved record arrive again after a restart: they are not new progress
    clock = Clock()
    config = MonitorConfig(file_url, check_interval_s=0.1, state_path=str(tmp_path / "state.json"),
                           trigger=TriggerConfig(hang_threshold_s=60.0))
    m = Monitor(config, clock=clock)
    m.register("quiet")
    write_job(file_url, "quiet", 10, inject="")
    clock.now += 1.0
    m.poll_once()
    write_job(file_url, "quiet", 20, inject="", first=10)
    clock.now += 10.0
    m.poll_once()  # iteration 19 seen now; then the job falls silent
    last_seen = clock.now
    clock.now += 44.0
    abandon(m)
    again = Monitor(config, clock=clock)
    try:
        again.poll_once()
        view = again.view("quiet")
        assert view["iteration_count"] == 20 and view["status"] == "active"
        assert view["hang_check"]["seconds_since_last_iteration"] == pytest.approx(44.0)
        clock.now = last_seen + 68.0
        again.poll_once()
        view = again.view("quiet")
        assert view["status"] == "hanging"
        assert view["hang_check"]["seconds_since_last_iteration"] == pytest.approx(68.0)
    finally:
        again.stop()
    third = Monitor(config, clock=clock)  # compacted by the stop: still the same clock
    try:
        assert third.view("quiet")["hang_check"]["seconds_since_last_iteration"] == pytest.approx(68.0)
    finally:
        third.stop()


def test_metrics_are_built_once_per_change_not_per_scrape(tmp_path, file_url):
    m = Monitor(MonitorConfig(file_url, check_interval_s=0.1, state_path=str(tmp_path / "state.json")))
    try:
        m.register("a")
        first = m.metrics.text()
        assert b'straggler_job_iterations{job_id="a"} 0.0' in first
        assert m.metrics.text() is first  # nothing changed: the same bytes, not built again
        m.register("b")
        assert b'straggler_job_iterations{job_id="b"} 0.0' in m.metrics.text()
        write_job(file_url, "a", 10, inject="")
        scraped = m.metrics.text()
        # After a poll it is built again once the last build is BUILD_SHARE of the time ago
        # (on a loaded host the build of the registration may not be, yet).
        m.poll_once()
        deadline = time.monotonic() + 10.0
        while (built := m.metrics.text()) is scraped and time.monotonic() < deadline:
            time.sleep(0.01)
        assert built is not scraped and b'straggler_job_iterations{job_id="a"} 10.0' in built
        assert m.metrics.text() is built
    finally:
        m.stop()


def test_polls_rebuild_the_metrics_at_most_a_tenth_of_the_time(tmp_path, file_url, monkeypatch):
    m = Monitor(MonitorConfig(file_url, check_interval_s=0.1, state_path=str(tmp_path / "state.json")))
    try:
        m.register("a")
        write_job(file_url, "a", 5, inject="")
        clock = [100.0]
        monkeypatch.setattr(metrics_module.time, "monotonic", lambda: clock[0])
        built = {"n": 0}
        real_generate = metrics_module.generate_latest

        def generate(registry) -> bytes:  # a build of 0.3 s
            built["n"] += 1
            clock[0] += 0.3
            return real_generate(registry)

        monkeypatch.setattr(metrics_module, "generate_latest", generate)
        first = m.metrics.text()  # built at 100.0-100.3: the next build from 103.0 on
        m.poll_once()  # scraped, but within 3 s of the build
        assert built["n"] == 1 and m.metrics.text() is first
        clock[0] = 103.0
        m.poll_once()
        assert built["n"] == 2 and b'straggler_job_iterations{job_id="a"} 5.0' in m.metrics.text()
        m.register("b")  # a change: the next scrape shows it at once
        assert b'job_id="b"' in m.metrics.text() and built["n"] == 3
        assert gzip.decompress(m.metrics.text(gzipped=True)) == m.metrics.text()
    finally:
        m.stop()


def test_job_numbers_come_a_page_at_a_time_by_job_id(tmp_path, file_url):
    m = Monitor(MonitorConfig(file_url, check_interval_s=0.1, state_path=str(tmp_path / "state.json")))
    try:
        for k in (3, 1, 2, 0, 4):
            m.register(f"j{k}")
        assert [j["job_id"] for j in m.job_numbers()] == ["j0", "j1", "j2", "j3", "j4"]
        assert [j["job_id"] for j in m.job_numbers(1, 2)] == ["j1", "j2"]
        assert [j["job_id"] for j in m.job_numbers(4, 2)] == ["j4"] and m.job_numbers(9, 2) == []
        assert m.job_count() == 5
    finally:
        m.stop()
