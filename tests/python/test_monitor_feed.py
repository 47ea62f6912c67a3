"""The feed (relax_straggler/monitor/feed.py, `relax-straggler feed`, `replay` its old name):
pacing with an injected clock, injected delays, synthetic jobs, argument errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from relax_straggler.common.stages import STAGE_IDS
from relax_straggler.monitor.feed import Injection, Synthetic, feed, inject, step_table
from relax_straggler.stores.opener import open_store

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-c", "import sys; from relax_straggler.cli import main; sys.exit(main())"]


class FakeTime:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


def test_speed_paces_iterations_and_stamps_fresh_times(tmp_path):
    t = FakeTime()
    store = open_store(f"file://{tmp_path}")
    stats = feed(Synthetic(ranks=4, iterations=5, step_ms=200, noise=0).steps(), store, "paced", speed=2.0,
                 clock=t.clock, sleep=t.sleep)
    assert stats.iterations == 5 and stats.rows == 5 * 4 * 5
    assert t.sleeps == pytest.approx([0.1] * 5)  # 200 ms iterations at twice the speed
    its = store.iterations("paced")
    assert [i.last_timestamp - 1_800_000_000.0 for i in its] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])
    assert [i.step_ms for i in its] == pytest.approx([200.0] * 5)


def test_injected_delay_slows_the_rank_and_the_step():
    steps = list(Synthetic(ranks=8, iterations=6, step_ms=100, seed=2).steps())
    inj = Injection.parse("3:forward-compute:50:4")
    assert inj == Injection(3, STAGE_IDS["forward"], 50.0, 4)
    before, after = inject(steps[3], [inj]), inject(steps[4], [inj])
    assert before is steps[3]
    f, ar = STAGE_IDS["forward"], STAGE_IDS["communication/allreduce"]
    assert after.ms[3, f] == pytest.approx(steps[4].ms[3, f] + 50)
    others = np.arange(8) != 3
    np.testing.assert_allclose(after.ms[others, ar], steps[4].ms[others, ar] + 50)
    assert after.step_ms == pytest.approx(steps[4].step_ms + 50)


def test_step_table_names_timers_and_nodes():
    step = next(Synthetic(ranks=6, iterations=1).steps())
    table = step_table("t", step, 5.0, ranks_per_node=4)
    rows = table.to_pylist()
    assert {r["metric_name"] for r in rows} == {"forward-compute", "backward-compute", "optimizer",
                                                "grads-all-reduce", "interval-time"}
    assert {(r["rank"], r["node"]) for r in rows} == {(r, f"node-{r // 4}") for r in range(6)}
    assert all(r["timestamp"] == 5.0 and r["job"] == "t" and len(r["metric_values"]) == 1 for r in rows)


@pytest.mark.parametrize("text, message", [
    ("3:forward:50", "RANK:STAGE:MS:FROM_ITER"), ("3:warp:50:4", "neither a stage"),
    ("x:forward:50:4", "must be integers"), ("3:forward:-5:4", "MS > 0"), ("3:interval-time:5:4", "neither a stage"),
])
def test_bad_injection_names_the_problem(text, message):
    with pytest.raises(ValueError, match=message):
        Injection.parse(text)


@pytest.mark.parametrize("text, message", [("ranks=1", "ranks >= 2"), ("ranks=x", "ranks must be int"),
                                           ("colour=red", "not KEY=VALUE")])
def test_bad_synthetic_spec_names_the_problem(text, message):
    with pytest.raises(ValueError, match=message):
        Synthetic.parse(text)


def test_injection_of_a_missing_rank_is_refused(tmp_path):
    with pytest.raises(ValueError, match="rank 9 is not in iteration 0"):
        feed(Synthetic(ranks=4, iterations=2).steps(), open_store(f"file://{tmp_path}"), "j", speed=1e9,
             injections=[Injection.parse("9:forward:10:0")])


@pytest.mark.parametrize("command", ["feed", "replay"])  # replay: the command's old name
def test_cli_feeds_a_recording_and_reports_bad_input(tmp_path, command):
    fixture = REPO / "tests" / "python" / "fixtures" / "megatron_all.log"
    ok = subprocess.run(CLI + [command, str(fixture), "--store", f"file://{tmp_path}/s", "--job", "rec",
                               "--speed", "1000"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "replayed 6 iterations" in ok.stdout
    assert [i.iteration for i in open_store(f"file://{tmp_path}/s").iterations("rec")] == [10, 20, 30, 40, 50, 60]
    missing = subprocess.run(CLI + [command, str(tmp_path / "nope.jsonl"), "--store", f"file://{tmp_path}/s",
                                    "--job", "x"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and "nope.jsonl: no such file" in missing.stderr
    neither = subprocess.run(CLI + [command, "--store", f"file://{tmp_path}/s", "--job", "x"], cwd=REPO,
                             capture_output=True, text=True, timeout=120)
    assert neither.returncode == 2 and f"{command}: give either INPUT or --synthetic" in neither.stderr


def test_cli_refuses_a_job_id_the_monitor_cannot_serve(tmp_path):
    bad = subprocess.run(CLI + ["feed", "--synthetic", "ranks=2,iterations=2", "--store", f"file://{tmp_path}/s",
                                "--job", "my run", "--speed", "1000"], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "'my run' cannot be registered with the monitor" in bad.stderr, bad.stderr
    assert not (tmp_path / "s").exists()


def test_feeding_a_job_that_has_the_iterations_writes_no_duplicate(tmp_path):
    t = FakeTime()
    store = open_store(f"file://{tmp_path}")
    spec = Synthetic(ranks=4, iterations=5, step_ms=100, noise=0)
    first = feed(spec.steps(), store, "again", clock=t.clock, sleep=t.sleep)
    rows = len(list(store.samples("again", 0, 10)))
    for _ in range(2):
        again = feed(spec.steps(), store, "again", clock=t.clock, sleep=t.sleep)
        assert (again.iterations, again.rows, again.skipped, again.ended) == (0, 0, 5, False)
    assert first.ended
    assert len(list(store.samples("again", 0, 10))) == rows == first.rows + 1  # and the one end-of-run row
    keys = [(s.iteration, s.rank, s.metric_name) for s in store.samples("again", 0, 10)]
    assert len(keys) == len(set(keys))


def test_an_interrupted_feed_resumes_after_the_last_iteration_written(tmp_path):
    t = FakeTime()
    store = open_store(f"file://{tmp_path}")
    feed(Synthetic(ranks=4, iterations=3, noise=0).steps(), store, "cut", clock=t.clock, sleep=t.sleep)
    sleeps = len(t.sleeps)
    stats = feed(Synthetic(ranks=4, iterations=5, noise=0).steps(), store, "cut", clock=t.clock, sleep=t.sleep)
    assert (stats.iterations, stats.skipped) == (2, 3)
    assert len(t.sleeps) - sleeps == 2  # skipped iterations are not waited for
    assert [i.iteration for i in store.iterations("cut")] == [0, 1, 2, 3, 4]
    assert all(i.ranks == 4 for i in store.iterations("cut"))


def test_a_feed_ends_with_its_end_of_run_row_unless_told_not_to(tmp_path):
    from relax_straggler.stores import end_rows

    t = FakeTime()
    store = open_store(f"file://{tmp_path}")
    spec = Synthetic(ranks=4, iterations=6, step_ms=100, noise=0)
    feed(spec.steps(), store, "ends", clock=t.clock, sleep=t.sleep)
    ended_at = t.now
    feed(spec.steps(), store, "crashes", clock=t.clock, sleep=t.sleep, end_of_run=False)
    end = end_rows.latest_end(store.samples("ends", 0, 10))
    assert end == {"reason": "replay", "last_step": 5, "steps": 6, "ended_at": pytest.approx(ended_at)}
    assert end_rows.latest_end(store.samples("crashes", 0, 10)) is None
    assert [i.iteration for i in store.iterations("ends")] == list(range(6))  # the end row is no iteration
