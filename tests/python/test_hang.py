"""When the job stops: the rank and the collective that hold it (relax_straggler.hang).

The comparison itself on hand-built snapshots, the watchdog with a channel in memory, the
counters of the collective layer, then on 4 Gloo ranks: one rank stops before a world
all_reduce (sleeping, or SIGSTOPped when it is the metrics rank) while the analyzer's side
group waits for its row; the answer must name it within hang-seconds + 10 s, and the run
must still be killable.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import DETECTION, REAL_RUNS, REPO, wait_for
from relax_straggler.hang import ANALYZER, DESYNC, LAGGING, MISSING, NONE, compact, diagnose
from workers.step_times import assert_not_blocked

pytestmark = [REAL_RUNS, DETECTION]

WORKER = REPO / "tests" / "python" / "workers" / "hang_stop.py"
HANG_S = 3.0  # the worker's --straggler-hang-seconds


def entry(seq, op="all_reduce", ago=10.0):
    return {"seq": seq, "op": op, "ago_s": ago}


def snap(rank, groups, step=41, stalled=12.0):
    return {"rank": rank, "step": step, "wall": 0.0, "stalled_s": stalled, "groups": groups}


def group(name, ranks, collective=None, p2p=None, completed=None, desc=""):
    return {"name": name, "desc": desc, "ranks": list(ranks), "collective": collective, "p2p": p2p,
            "completed": completed}


def test_compact_collapses_runs():
    assert compact([7, 4, 5, 6]) == "4-7"
    assert compact([0, 2, 5, 6]) == "0,2,5-6"
    assert compact([]) == ""


def test_the_rank_that_never_entered_is_named_with_its_last_completed_op():
    world = range(4, 8)
    snaps = {r: snap(r, [group("3", world, entry(1234, ago=88.0 + r), desc="dp-3"),
                         group("9", (r, r + 8), p2p=entry(881, "send", 120.0), desc="pp-1")]) for r in world if r != 5}
    snaps[5] = snap(5, [group("3", world, entry(1233, ago=100.0), desc="dp-3"),
                        group("9", (5, 13), p2p=entry(881, "send", 99.0),
                              completed=entry(881, "send", 98.0), desc="pp-1")])
    answer = diagnose(snaps, world)
    assert answer.kind == LAGGING
    f = answer.findings[0]
    assert (f.rank, f.op, f.seq, f.group, f.waiting) == (5, "all_reduce", 1234, "dp-3", (4, 6, 7))
    assert f.waited_s == pytest.approx(92.0)  # the least wait of the three
    assert f.last_completed == "send #881 of group pp-1"  # newer than all_reduce #1233
    assert f.describe() == ("rank 5 never entered all_reduce #1234 of group dp-3 (ranks 4-7); the other 3 have "
                            "waited 92 s in it; rank 5's last completed op: send #881 of group pp-1")
    m = answer.metrics()
    assert (m["straggler/hang/rank"], m["straggler/hang/group_ranks"], m["straggler/hang/seq"]) == (5, "4-7", 1234)


def test_a_training_thread_held_inside_the_analyzer_is_the_analyzers_fault_first():
    # Rank 5 has been inside the analyzer's step() for the whole stop, so it never entered
    # the all_reduce its peers wait in: the groups alone would blame the job's rank 5.
    world = range(4, 8)
    snaps = {r: snap(r, [group("3", world, entry(1234, ago=12.0), desc="dp-3")]) for r in world if r != 5}
    snaps[5] = {**snap(5, [group("3", world, entry(1233, ago=12.5), desc="dp-3")]),
                "analyzer": {"what": "ending the step", "step": 41, "for_s": 12.2}}
    snaps[6]["analyzer"] = {"what": "ending the step", "step": 42, "for_s": 0.001}  # passing through: not held
    answer = diagnose(snaps, world)
    assert answer.kind == ANALYZER
    assert [f.kind for f in answer.findings] == [ANALYZER, LAGGING]
    f = answer.findings[0]
    assert (f.rank, f.op, f.seq) == (5, "ending the step", 41)
    assert answer.text().startswith("relax_straggler itself has held the training thread of rank 5 for 12 s "
                                    "(ending the step, step 41): the analyzer's own stall, not the job's;")
    assert answer.metrics()["straggler/hang/kind"] == "analyzer"


def test_a_rank_without_a_snapshot_is_named_missing():
    snaps = {r: snap(r, [group("0", range(4), entry(7, ago=20.0), desc="default_pg")]) for r in (1, 2, 3)}
    answer = diagnose(snaps, range(4), now=5.0)  # the snapshots were written at wall 0
    assert answer.findings[0].waited_s == pytest.approx(25.0)
    assert answer.no_snapshot == (0,)
    assert answer.kind == MISSING
    assert (answer.findings[0].rank, answer.findings[0].seq, answer.findings[0].waiting) == (0, 7, (1, 2, 3))


def test_different_ops_at_one_sequence_number_are_a_desync():
    snaps = {r: snap(r, [group("0", range(4), entry(12, "all_gather" if r == 3 else "all_reduce"))]) for r in range(4)}
    answer = diagnose(snaps, range(4))
    assert answer.kind == DESYNC
    assert dict(answer.findings[0].ops_by_rank) == {"all_reduce": (0, 1, 2), "all_gather": (3,)}
    assert "all_gather on ranks 3" in answer.text()


def test_the_end_of_a_chain_is_named_first():
    # Rank 1 holds group A (0, 1) but itself waits in group B (1, 2), held by rank 2.
    snaps = {0: snap(0, [group("A", (0, 1), entry(5, ago=50.0))]),
             1: snap(1, [group("A", (0, 1), entry(4, ago=60.0)), group("B", (1, 2), entry(9, ago=40.0))]),
             2: snap(2, [group("B", (1, 2), entry(8, ago=45.0))])}
    answer = diagnose(snaps, range(3))
    assert [(f.rank, f.group) for f in answer.findings] == [(2, "B"), (1, "A")]


def test_a_group_everyone_left_holds_nobody():
    # Every rank went on to group B after A: A's equal sequence numbers are no hang.
    snaps = {r: snap(r, [group("A", range(2), entry(3, ago=30.0)), group("B", range(2), entry(6, ago=5.0))])
             for r in range(2)}
    answer = diagnose(snaps, range(2))
    assert answer.kind == NONE and answer.findings == ()
    assert "no rank is behind" in answer.text()


def test_ranks_that_hold_a_group_alike_are_one_finding():
    world = range(8)
    snaps = {r: snap(r, [group("0", world, entry(7, ago=20.0), desc="default_pg")]) for r in (0, 1, 2, 4)}
    snaps[4] = snap(4, [group("0", world, entry(6, ago=30.0), completed=entry(6, ago=29.0), desc="default_pg")])
    snaps[2] = snap(2, [group("0", world, entry(6, ago=30.0), completed=entry(6, ago=29.0), desc="default_pg")])
    answer = diagnose(snaps, world)
    assert [(f.kind, f.rank, f.ranks) for f in answer.findings] == [(LAGGING, 2, (2, 4)), (MISSING, 3, (3, 5, 6, 7))]
    assert answer.text() == (
        "ranks 2,4 never entered all_reduce #7 of group default_pg (ranks 0-7); the other 2 have waited 20 s in it; "
        "their last completed op: all_reduce #6 of group default_pg; ranks 3,5-7 published no progress (stopped, "
        "dead or cut off) and never joined all_reduce #7 of group default_pg (ranks 0-7); the other 2 have waited "
        "20 s in it")
    m = answer.metrics()
    assert (m["straggler/hang/kind"], m["straggler/hang/rank"], m["straggler/hang/no_snapshot_ranks"]) == \
        (LAGGING, 2, "3,5-7")


def test_one_waiting_rank_is_singular_and_the_missing_wording_is_a_parameter():
    answer = diagnose({0: snap(0, [group("0", (0, 1), entry(3, ago=4.0), desc="dp-0")])}, (0, 1),
                      absent=("has no dump", "have no dump"))
    assert answer.text() == ("rank 1 has no dump and never joined all_reduce #3 of group dp-0 (ranks 0-1); "
                             "the other rank has waited 4 s in it")


def test_many_missing_ranks_are_compared_in_linear_time_and_told_briefly():
    world = range(300_000)
    snaps = {r: snap(r, [group("0", world, entry(9, ago=5.0), desc="default_pg")]) for r in (0, 299_999)}
    t0 = time.perf_counter()
    answer = diagnose(snaps, world)
    assert time.perf_counter() - t0 < 20  # quadratic: hours
    assert [(f.kind, f.rank) for f in answer.findings] == [(MISSING, 1)]
    assert answer.text().startswith("ranks 1-299998 published no progress")


def test_the_text_is_bounded_however_many_groups_are_held():
    # 50 pairs (2k, 2k + 1) each held by its odd rank; every second rank missing beside them.
    snaps = {r: snap(r, [group(f"p{r // 2}", (r - r % 2, r - r % 2 + 1), entry(5 - r % 2, ago=9.0))])
             for r in range(100)}
    answer = diagnose(snaps, range(0, 200))
    assert len(answer.findings) == 50 and answer.text().endswith("; and 40 more findings")
    odd = diagnose({0: snap(0, [group("0", range(0, 4000, 2), entry(3))])}, range(0, 4000, 2))
    assert "ranks 2,4,6,8,10,12,14,16,18,20,22,24,26,28,30,32,... (1999 ranks in all)" in odd.text()


# The answer in the metrics store ---------------------------------------------------------
def test_the_store_row_keeps_every_field_and_the_timer_reader_knows_it(tmp_path):
    from relax_straggler.hang.publish import hang_event
    from relax_straggler.readers.metrics_rows import StoreSource
    from relax_straggler.reporters.store_sink import StoreSink
    from relax_straggler.stores import hang_rows
    from relax_straggler.stores.base import STEP_METRIC, Sample
    from relax_straggler.stores.opener import open_store

    answer = diagnose({0: snap(0, [group("0", (0, 1), entry(6), desc="dp-0")]),
                       1: snap(1, [group("0", (0, 1), entry(5), completed=entry(5, op="send", ago=20.0),
                                         desc="dp-0")])}, [0, 1])
    url = f"file://{tmp_path}/store"
    sink = StoreSink(url + "?job=j", flush_interval_s=0.05)
    sink.write_hang(hang_event(answer))
    assert sink.flush(timeout_s=30)
    sink.close()
    store = open_store(url)
    try:
        store.write([Sample(1.0, "j", STEP_METRIC, r, 41, (30.0,)) for r in (0, 1)] +
                    [Sample(1.0, "j", "forward-compute", r, 41, (10.0,)) for r in (0, 1)])
        stored = hang_rows.latest_answer(store.samples("j", 0, 100))
        expected = {k.split("/")[-1]: v for k, v in answer.metrics().items() if k != "straggler/hang/detected"}
        assert {k: stored[k] for k in hang_rows.FIELDS} == expected
        assert stored["rank"] == 1 and stored["last_completed"] == "all_reduce #5 of group dp-0"
        # Offline analysis of the same store: the hang row is known and no time.
        source = StoreSource(store, "j", 0, 100)
        assert [s.step for s in source.steps()] == [41]
        assert source.unknown == {} and source.problems.total == 0
    finally:
        store.close()


def test_a_hang_row_that_is_not_the_format_is_refused_naming_it():
    from relax_straggler.stores import hang_rows
    from relax_straggler.stores.base import Sample

    def row(subname):
        return Sample(timestamp=1.0, job="j", metric_name="straggler/hang", rank=0, iteration=7, values=(1.0,),
                      subname=subname)

    for subname, why in (("{", "not JSON"), ("[1]", "not a JSON object"), ('{"kind": "lagging"}', "lacks rank")):
        with pytest.raises(ValueError, match=f"straggler/hang row of job 'j', iteration 7: .*{why}"):
            hang_rows.decode(row(subname))
    assert hang_rows.decode(Sample(1.0, "j", "forward-compute", 0, 7, (1.0,))) is None



def test_a_stand_in_opens_the_console_the_config_asks_for(monkeypatch, capsys):
    """A rank answering for a stopped metrics rank opens the console sink the config
    describes, --straggler-console-verbose included, as the metrics rank does."""
    from relax_straggler.config import StragglerConfig
    from relax_straggler.hang.publish import HangPublisher
    from relax_straggler.reporters.console import ConsoleSink

    verbose = []
    init = ConsoleSink.__init__

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        verbose.append(self.verbose)

    monkeypatch.setattr(ConsoleSink, "__init__", recording_init)
    answer = diagnose({0: snap(0, [group("0", (0, 1), entry(6))]), 1: snap(1, [group("0", (0, 1), entry(5))])},
                      [0, 1])
    HangPublisher(None, StragglerConfig(enabled=True, console=True, console_verbose=True))(answer)
    assert verbose == [True]
    assert capsys.readouterr().out == f"[straggler] HANG after step 41: {answer.text()}\n"

# 4 Gloo ranks --------------------------------------------------------------------------
def stored_answer(tmp_path):
    """The newest hang answer in the worker's file store, None before it is there."""
    from relax_straggler.stores import hang_rows
    from relax_straggler.stores.opener import open_store

    store_dir = tmp_path / "store"
    if not store_dir.exists():
        return None
    store = open_store(f"file://{store_dir}")
    try:
        return hang_rows.latest_answer(store.samples("hang-test", 0, 2**62))
    finally:
        store.close()


def run_until_answer(tmp_path, stop_rank: int, how: str, monitor=None) -> tuple[dict, float, str]:
    """Starts the worker, waits for the hang answer in the JSONL and in the store (and,
    given a monitor, for the monitor to serve it), kills the run; returns (the answer's
    metrics, s from the stop to the answer, the console output)."""
    jsonl, stopped = tmp_path / "straggler.jsonl", tmp_path / "stopped"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4", str(WORKER),
           str(stop_rank), how, str(tmp_path)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    log = open(tmp_path / "out.txt", "w+")
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        answer, seen = None, None
        deadline = time.monotonic() + 75
        while answer is None and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
            if monitor is not None:
                monitor.poll_once()
            if jsonl.exists():
                for line in jsonl.read_text().splitlines():
                    metrics = json.loads(line)["metrics"]
                    if "straggler/hang/answer" in metrics:
                        answer, seen = metrics, time.time()
        assert answer is not None, f"no hang answer (exit {proc.poll()}):\n{(tmp_path / 'out.txt').read_text()[-4000:]}"
        # The store sink writes it too (within its flush interval, or the stand-in's close).
        stored = wait_for(lambda: stored_answer(tmp_path), timeout_s=15, what="the hang answer in the store")
        assert stored["answer"] == answer["straggler/hang/answer"]
        assert (stored["rank"], stored["op"], stored["seq"]) == \
            (answer["straggler/hang/rank"], answer["straggler/hang/op"], answer["straggler/hang/seq"])
        if monitor is not None:
            def served():
                monitor.poll_once()
                return monitor.view("hang-test")["hang_check"]["rca"]
            rca = wait_for(served, timeout_s=10, what="the monitor's hang_check.rca")
            assert rca["answer"] == answer["straggler/hang/answer"], rca
        wall, pid = stopped.read_text().split()
        delay = seen - float(wall)
        assert_not_blocked({r: json.loads((tmp_path / f"steps{r}.json").read_text()) for r in range(4)}, warmup=1,
                           expected_steps=4)  # the steps before the stop
        # Interruptible: SIGTERM to the launcher ends the run (a SIGSTOPped rank sees it once continued).
        os.kill(int(pid), signal.SIGCONT)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    return answer, delay, (tmp_path / "out.txt").read_text()


def test_a_rank_that_stops_before_an_all_reduce_is_named(tmp_path):
    from relax_straggler.monitor.service import Monitor, MonitorConfig
    from relax_straggler.monitor.trigger import TriggerConfig

    # A monitor watching the job's store names the same rank and op in hang_check.rca.
    (tmp_path / "store").mkdir()
    monitor = Monitor(MonitorConfig(f"file://{tmp_path / 'store'}", check_interval_s=60,
                                    trigger=TriggerConfig(hang_threshold_s=1.0), state_path=str(tmp_path / "state.json")))
    monitor.register("hang-test")
    try:
        m, delay, out = run_until_answer(tmp_path, stop_rank=2, how="sleep", monitor=monitor)
    finally:
        monitor.stop()
    assert delay <= HANG_S + 10, delay
    assert (m["straggler/hang/kind"], m["straggler/hang/rank"], m["straggler/hang/op"]) == (LAGGING, 2, "all_reduce")
    assert (m["straggler/hang/group"], m["straggler/hang/group_ranks"]) == ("default_pg", "0-3")
    assert m["straggler/hang/seq"] == 6  # the 6th world all_reduce: steps 0-4 ran 5
    assert m["straggler/hang/waiting_ranks"] == 3
    assert m["straggler/hang/waited_s"] >= HANG_S - 1
    # Step 4 was sampled: the wrapper saw its pair all_reduce end, after the world one.
    assert m["straggler/hang/last_completed"] == "all_reduce #5 of group pair-1"
    assert m["straggler/hang/no_snapshot_ranks"] == ""
    assert "[straggler] HANG after step 4: rank 2 never entered all_reduce #6 of group default_pg" in out


def test_a_stop_inside_the_analyzer_is_the_analyzers_fault_not_the_jobs(tmp_path):
    m, delay, out = run_until_answer(tmp_path, stop_rank=1, how="analyzer")
    assert delay <= HANG_S + 10, delay
    assert (m["straggler/hang/kind"], m["straggler/hang/rank"], m["straggler/hang/seq"]) == (ANALYZER, 1, 4)
    assert "relax_straggler itself has held the training thread of rank 1" in m["straggler/hang/answer"]
    assert "the analyzer's own stall, not the job's" in out


def test_a_stopped_metrics_rank_is_named_by_another_rank(tmp_path):
    m, delay, out = run_until_answer(tmp_path, stop_rank=0, how="sigstop")
    assert delay <= HANG_S + 10, delay
    assert (m["straggler/hang/kind"], m["straggler/hang/rank"], m["straggler/hang/op"]) == (MISSING, 0, "all_reduce")
    assert (m["straggler/hang/group"], m["straggler/hang/seq"]) == ("default_pg", 6)
    assert m["straggler/hang/no_snapshot_ranks"] == "0"
    assert m["straggler/hang/waiting_ranks"] == 3
    assert "[straggler] HANG after step 4: rank 0 published no progress" in out
    assert m["straggler/hang/waited_s"] >= HANG_S + 1  # counted up to the answer, after collect_s


# The watchdog on its own, with a channel in memory --------------------------------------
class MemoryChannel:
    """StoreChannel's interface over a dict; put_snapshot raises when `fail` is set."""

    def __init__(self, fail: bool = False) -> None:
        self.data, self.answers, self.puts, self.deletes, self.fail = {}, [], 0, 0, fail
        self.reads = 0  # calls of snapshots()

    def put_snapshot(self, rank, snapshot):
        self.puts += 1
        if self.fail:
            raise RuntimeError("store unreachable")
        self.data[rank] = snapshot

    def delete_snapshot(self, rank):
        self.deletes += 1
        self.data.pop(rank, None)

    def published(self):
        return len(self.data)

    def snapshots(self, ranks):
        self.reads += 1
        return {r: s for r, s in self.data.items() if r in ranks}

    def put_answer(self, answer):
        self.answers.append(answer)


def watchdog(channel, steps, answers, hang_s=0.3, rank=0, inside=lambda: None, ranks=(0,), collect_s=0.1):
    from relax_straggler.hang.watchdog import HangWatchdog

    progress = [group("0", ranks, entry(3, ago=1.0), desc="default_pg")]
    return HangWatchdog(rank=rank, ranks=list(ranks), metrics_rank=0, hang_s=hang_s, steps=lambda: steps[0],
                        progress=lambda: progress, channel=channel, publish=answers.append, inside=inside,
                        poll_s=0.05, collect_s=collect_s)


def test_the_metrics_rank_reads_the_snapshots_once_when_all_are_in():
    channel, steps, answers = MemoryChannel(), [3], []
    w = watchdog(channel, steps, answers, ranks=(0, 1, 2), collect_s=5.0).start()
    try:
        wait_for(lambda: 0 in channel.data, timeout_s=10, what="the metrics rank's snapshot")
        time.sleep(0.5)  # the others' watchdogs write theirs later
        for r in (1, 2):
            late = snap(r, [group("0", (0, 1, 2), entry(3, ago=1.0), desc="default_pg")])
            channel.put_snapshot(r, {**late, "wall": time.time()})
        wait_for(lambda: answers, timeout_s=10, what="the answer")
    finally:
        w.stop()
    assert channel.reads == 1 and answers[0].no_snapshot == ()


def test_a_job_that_keeps_stepping_publishes_nothing():
    channel, steps, answers = MemoryChannel(), [1], []
    w = watchdog(channel, steps, answers).start()
    try:
        for _ in range(20):  # 1 s of steps every 50 ms, each well under hang_s
            time.sleep(0.05)
            steps[0] += 1
    finally:
        w.stop()
    assert (channel.puts, answers) == (0, [])


def test_a_stop_inside_the_analyzer_is_published_as_the_analyzers():
    channel, steps, answers = MemoryChannel(), [3], []
    since = time.monotonic()
    inside = lambda: {"what": "ending the step", "step": 3, "for_s": time.monotonic() - since}  # noqa: E731
    w = watchdog(channel, steps, answers, inside=inside).start()
    try:
        wait_for(lambda: answers, timeout_s=10, what="the answer")
    finally:
        w.stop()
    assert channel.data[0]["analyzer"]["step"] == 3
    assert answers[0].kind == ANALYZER and answers[0].findings[0].rank == 0


def test_one_answer_per_hang_and_the_snapshot_goes_when_steps_resume():
    channel, steps, answers = MemoryChannel(), [3], []
    w = watchdog(channel, steps, answers).start()
    try:
        deadline = time.monotonic() + 10
        while not answers and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # more polls in the same hang: no second answer
        assert len(answers) == 1 and channel.puts == 1
        assert answers[0].step == 2 and len(channel.answers) == 1
        steps[0] += 1  # training resumes
        deadline = time.monotonic() + 10
        while channel.deletes == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert channel.data == {}
    finally:
        w.stop()


def test_a_store_that_fails_is_given_up_for_the_hang_and_stop_is_prompt():
    channel, steps, answers = MemoryChannel(fail=True), [2], []
    w = watchdog(channel, steps, answers).start()
    time.sleep(1.0)
    t0 = time.monotonic()
    w.stop()
    assert time.monotonic() - t0 < 1.0
    assert channel.puts == 1 and answers == []


def test_a_snapshot_in_the_store_does_not_grow_with_the_job():
    import datetime

    import torch.distributed as dist

    from relax_straggler.hang.channel import StoreChannel

    n = 100_000
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=10))
    channel = StoreChannel(lambda: store, "t/")
    groups = lambda r: [group("0", range(n), entry(5), desc="default_pg"),  # noqa: E731
                        group(f"dp{r % 8}", range(r % 8, n, 8), entry(9), desc="dp"),
                        group(f"tp{r // 8}", range(r // 8 * 8, r // 8 * 8 + 8), entry(4), desc="tp")]
    for r in (0, 1, 9):
        channel.put_snapshot(r, snap(r, groups(r)))
    assert len(store.get("t/snapshot/9")) < 1000
    assert channel.published() == 3
    got = channel.snapshots([0, 1, 9])  # all present: one check, one multi_get
    assert [g["ranks"] for g in got[9]["groups"]] == [tuple(g["ranks"]) for g in groups(9)]
    assert got[0]["groups"][0]["ranks"] is got[9]["groups"][0]["ranks"]  # one tuple for the world group
    channel.delete_snapshot(1)
    channel.delete_snapshot(1)  # removed already: the count stays right
    assert channel.published() == 2 and sorted(channel.snapshots([0, 1, 9])) == [0, 9]


def test_rank_runs_cover_training_groups_in_a_few_numbers_and_refuse_a_bad_run():
    from relax_straggler.hang.rank_runs import from_runs, to_runs

    assert to_runs(range(100_000)) == [[0, 100_000, 1]]
    assert to_runs(range(3, 100_000, 8)) == [[3, 12_500, 8]]
    assert to_runs([7]) == [[7, 1, 1]] and to_runs([]) == []
    for ranks in ([0, 1, 5, 6, 10], [9, 2, 2, 4], list(range(0, 64, 4)) + [65, 66]):
        assert from_runs(to_runs(ranks)) == tuple(sorted(set(ranks)))
    with pytest.raises(ValueError, match=r"rank run \[0, 0, 1\]"):
        from_runs([[0, 0, 1]])


def test_an_unreachable_store_fails_within_its_timeout():
    import datetime
    import socket

    import torch.distributed as dist

    from relax_straggler.hang.channel import StoreChannel

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    channel = StoreChannel(lambda: dist.TCPStore("127.0.0.1", port, is_master=False,
                                                 timeout=datetime.timedelta(seconds=1), wait_for_workers=False),
                           "relax_straggler/hang/test/0/")
    t0 = time.monotonic()
    with pytest.raises(Exception):
        channel.put_snapshot(0, {"rank": 0})
    assert time.monotonic() - t0 < 10


PROGRESS_SCRIPT = """
import json, sys, torch, torch.distributed as dist
from relax_straggler._ext import ext
from relax_straggler.live.collectives import CollectiveLayer
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
timer = ext().StageTimer(14, 2, 0, 64, False)
layer = CollectiveLayer(timer, [0], exclude=[])
out = {"before": layer.progress()}
x = torch.ones(4)
timer.begin_step(1)  # not sampled: entries counted, an async op's end not seen
dist.all_reduce(x); dist.all_reduce(x)
out["unsampled"] = layer.progress()
timer.begin_step(2)  # sampled: the end is seen
dist.broadcast(x, 0); dist.barrier()
timer.end_step()
out["sampled"] = layer.progress()
layer.restore()
print(json.dumps(out))
"""


def test_the_collective_layer_counts_every_op_entered_and_sees_sampled_ends():
    proc = subprocess.run([sys.executable, "-c", PROGRESS_SCRIPT], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    (g,) = out["before"]
    assert (g["name"], g["desc"], g["ranks"], g["collective"], g["completed"]) == ("0", "default_pg", [0], None, None)
    (g,) = out["unsampled"]
    assert (g["collective"]["seq"], g["collective"]["op"], g["completed"]) == (2, "all_reduce", None)
    (g,) = out["sampled"]
    assert (g["collective"]["seq"], g["collective"]["op"]) == (4, "barrier")
    assert (g["completed"]["seq"], g["completed"]["op"]) == (4, "barrier")
    assert g["p2p"] is None and 0 <= g["collective"]["ago_s"] < 30
