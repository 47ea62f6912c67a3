"""Real multi-rank runs: 4 Gloo ranks on 127.0.0.1 (torchrun), one thread each."""

import json

import pytest

from conftest import DETECTION, REAL_RUNS, REPO, demo_summary, torchrun
from truth import slow_in, unfounded
from workers.step_times import assert_not_blocked

pytestmark = [REAL_RUNS, DETECTION]

WARMUP = 6


def confirmed(report: dict) -> set[tuple[int, str]]:
    """(rank, stage) in state straggler in one JSONL report, but for host contention: 4 ranks
    share 2 cores (with whatever else the machine runs), so a rank whose core the scheduler
    keeps busy with others for a few reports is really slower, and the verdict says so with
    cause host_contention (tests/python/test_run_queue.py); what these runs inject is work."""
    return {(f["rank"], f["stage"]) for f in report["verdict"]["findings"]
            if f["state"] == "straggler" and f["cause"] != "host_contention"}


def headline(report: dict) -> tuple[int, str, str]:
    """The rank, stage and cause the verdict names (rank -1: nobody)."""
    m = report["metrics"]
    return m["straggler/verdict/rank"], m["straggler/verdict/stage"], m["straggler/verdict/cause"]


def test_injected_forward_delay_names_rank_2(run_demo):
    reports, summary = run_demo(4, "--steps", "40", "--straggler-interval", "2", "--straggler-warmup-steps",
                                str(WARMUP), "--inject-delay", "2:forward:30", "--straggler-window-every", "5",
                                "--straggler-window-size", "10")
    assert [r["step"] for r in reports] == list(range(WARMUP, 40, 2))
    for r in reports:
        m = r["metrics"]
        assert m["straggler/forward/top_rank"] == 2, r
        assert r["stragglers"]["forward"] == [2], r
        assert m["straggler/likely_bottleneck"] == "forward", r
        assert m["straggler/forward/slowdown_ratio"] > 1.5
        # Peers wait for rank 2 in the gradient all-reduce: it arrives last.
        assert m["straggler/communication/top_rank"] == 2, r
    # Backward is compute only: the wait is not in it, so the verdict confirms rank 2 in
    # forward and no other rank in backward (the per-step rule alone flags 1 ms jitter
    # there). Rank 2's own backward runs cold after its 30 ms sleep (~0.7 ms slower, 2 % of
    # the step: at the impact bar), so it may be named there too, never as the headline.
    assert {(2, "forward")} <= confirmed(reports[-1])
    others = [(r["step"], rank) for r in reports for rank, stage in confirmed(r) if stage == "backward" and rank != 2]
    assert others == [], others
    assert all(headline(r)[1] == "forward" for r in reports
               if r["metrics"]["straggler/verdict/status"] == "straggler" and headline(r)[2] != "host_contention"), \
        [r["verdict"] for r in reports]
    # The opt-in window ensemble runs on every 5th report over the last 10.
    windows = [r["metrics"] for r in reports if "straggler/window/anomaly_ranks" in r["metrics"]]
    assert len(windows) == 3
    # An algorithm calls a rank slow when it is slow in half the stages it clusters: rank 2
    # is slow in forward and late in the two communication columns, 3 of the 6, exactly at
    # that bar, so one window of a loaded machine can fall short (a lone-stage straggler is
    # the confirmed verdict's to find, asserted above). Where found, it is in forward with
    # the most votes. With 4 ranks on 2 cores another rank may also cross the window's 3 %
    # bar in a stage the load hits; never in forward, where only rank 2 is delayed.
    found = [m for m in windows if 2 in m["straggler/window/anomaly_ranks"]]
    assert len(found) >= 2, windows
    for m in found:
        assert "forward" in m["straggler/window/stages/2"].split(","), m
        votes = {k: v for k, v in m.items() if k.startswith("straggler/window/votes/")}
        assert votes["straggler/window/votes/2"] == max(votes.values()), m
    for m in windows:
        for rank in m["straggler/window/anomaly_ranks"]:
            if rank != 2:
                assert "forward" not in m[f"straggler/window/stages/{rank}"].split(","), m
    assert summary["loss_last"] < summary["loss_first"]


# Reports 5 steps apart, as in production (the default interval is 10): at interval 1 three
# reports in a row are three consecutive steps, which one scheduling episode of 4 ranks on
# 2 cores can span, and the rank is then really slow for that long.
INTERVAL = 5


def test_a_healthy_run_of_50_reports_confirms_no_rank_that_was_not_slower(run_demo):
    reports, summary = run_demo(4, "--steps", str(WARMUP + 50 * INTERVAL), "--straggler-interval", str(INTERVAL),
                                "--straggler-warmup-steps", str(WARMUP))
    assert len(reports) == 50
    assert unfounded(reports) == []
    if not any(f["state"] == "straggler" for r in reports for f in r["verdict"]["findings"]):
        assert summary["verdict"]["headline"] == "no straggler confirmed in 50 reports"


# Every rank sleeps BASE_MS inside the stage (a realistic stage length against the
# scheduling noise of 4 ranks on 2 cores with other work beside them: waits for a CPU of
# 5-30 ms in a step); the slowed rank 20 % longer.
BASE_MS = 80.0


ONSET = WARMUP + 6 * INTERVAL  # the 7th report: the verdict has learned the run's noise


@pytest.mark.parametrize("stage", ["forward", "backward"])
def test_a_rank_slowed_by_20_percent_is_confirmed_within_5_reports(run_demo, stage):
    delays = [arg for r in range(4) for arg in ("--inject-delay", f"{r}:{stage}:{BASE_MS}")]
    delays += ["--inject-delay", f"2:{stage}:{0.2 * BASE_MS}:{ONSET}"]
    reports, summary = run_demo(4, "--steps", str(ONSET + 8 * INTERVAL), "--straggler-interval", str(INTERVAL),
                                "--straggler-warmup-steps", str(WARMUP), *delays)
    assert [u for u in unfounded(reports) if u[0] < ONSET] == []
    after = [r for r in reports if r["step"] >= ONSET]
    first = next(i for i, r in enumerate(after) if (2, stage) in confirmed(r))
    # Three slow reports in a row confirm: the 3rd report after the onset at the earliest,
    # which is what a quiet machine gives (benchmarks/live_runs.py, docs/PERFORMANCE.md);
    # two more for a loaded report or two of 4 ranks on 2 cores.
    assert first <= 4, [confirmed(r) for r in after]
    assert all(confirmed(r) == {(2, stage)} for r in after[first:]), [confirmed(r) for r in after]
    last = headline(reports[-1])
    assert last == (2, stage, "compute") or last[2] == "host_contention", reports[-1]["verdict"]
    named = [(c["rank"], c["cause"]) for c in summary["verdict"]["confirmed"] if c["cause"] != "host_contention"]
    assert named[0] == (2, "compute"), summary["verdict"]["confirmed"]


# Every rank sleeps a fresh U(0, 15) ms in forward (its compute is a few ms: the sleep is its
# noise) and 45 ms in backward (the rest of a ~85 ms step); rank 2 sleeps 7.3 ms more in
# forward from the onset: 8 % of its step, half the jitter's spread, never beyond one
# report's noise. benchmarks/live_runs.py (jitter, jitter+8%) repeats it.
JITTER = ["--layers", "2", "--d-model", "64", "--heads", "2", "--seq-len", "64", "--batch-size", "4",
          "--inject-jitter", "forward:15", *(a for r in range(4) for a in ("--inject-delay", f"{r}:backward:45"))]


def test_a_rank_8_percent_slower_under_jitter_is_confirmed_and_nobody_else(run_demo):
    reports, _ = run_demo(4, "--steps", str(ONSET + 50 * INTERVAL), "--straggler-interval", str(INTERVAL),
                          "--straggler-warmup-steps", str(WARMUP), *JITTER, "--inject-delay", f"2:forward:7.3:{ONSET}")
    after = [r for r in reports if r["step"] >= ONSET]
    first = next((i for i, r in enumerate(after) if (2, "forward") in confirmed(r)), None)
    # The sequential test climbs for about 17 reports here (docs/DETECTION.md); on a quiet
    # host it took 16 to 31 (benchmarks/live_runs.py): 50 leave room for a loaded one.
    assert first is not None, [confirmed(r) for r in after]
    others = [(r["step"], c) for r in reports for c in confirmed(r) if c != (2, "forward")]
    assert others == [], others


def test_side_group_aggregation_equals_the_core_on_the_same_matrix(tmp_path):
    out = tmp_path / "aggregate.json"
    torchrun(3, REPO / "tests" / "python" / "workers" / "aggregate.py", [str(out), "6"])
    run = json.loads(out.read_text())
    assert_not_blocked(dict(enumerate(run["launch_s"])), warmup=1, expected_steps=6)  # gather() never waits
    results = run["results"]
    assert [r["step"] for r in results] == list(range(6))
    for r in results:
        assert r["same_matrix"]
        assert r["report"] == r["core"]
        assert r["bottleneck"][0] == r["bottleneck"][1] == "backward"
        assert r["hints"][0] == r["hints"][1]
        assert r["report"]["backward"] == [r["step"] % 3, [r["step"] % 3]]


def test_the_demo_confirms_the_contended_rank_once_it_is_measured_slow_and_nobody_the_times_do_not_show(tmp_path):
    # The demo's own model and contention (two busy processes on rank 1's core from step 70 to
    # the end), reports every 5 steps.
    out = tmp_path / "demo"
    torchrun(2, REPO / "examples" / "train_gpt.py", ["--straggler-analysis", "--output", str(out), "--steps", "200",
                                                     "--contend-steps", "70:200", "--straggler-interval", "5",
                                                     "--log-every", "1000"])
    demo_summary(out)  # the step-time guard
    reports = [json.loads(line) for line in (out / "straggler.jsonl").read_text().splitlines()]
    named = [(r["step"], r["metrics"]["straggler/verdict/rank"]) for r in reports]
    assert unfounded(reports) == [], named
    # What the contention did is measured, not assumed: with other work on the host the
    # scheduler moves that work onto rank 0's core, and rank 1 is slowed less, or not at all.
    # Rank 1 is slow in a report when its forward and backward together take at least 1.5x
    # rank 0's (a quiet host leaves it a third of its core: about 3x).
    slow = slow_in(reports, 1, ("forward", "backward"), [0], 1.5)
    during = [i for i, r in enumerate(reports) if r["step"] >= 70]
    onset = next((i for i in during[2:] if all(slow[i - 2:i + 1])), None)  # its 3rd slow report in a row
    if onset is None:
        pytest.skip(f"the contention never slowed rank 1 1.5x for 3 reports in a row beside this host's load: {named}")
    # Confirmed while it is contended. How soon is the benchmark's claim (the onset itself on a
    # quiet host, benchmarks/live_runs.py): a healthy phase on a loaded host teaches the verdict
    # a longer streak (docs/DETECTION.md, States), up to 11 reports after the onset here.
    assert any(named[i][1] == 1 for i in during), str(named)
