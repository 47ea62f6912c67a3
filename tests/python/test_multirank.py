"""Real multi-rank runs: 4 Gloo ranks on 127.0.0.1 (torchrun), one thread each."""

import json

from conftest import REPO, torchrun

WARMUP = 6


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
        # Backward is compute only: the wait is not in it, so nobody is slow there.
        assert "backward" not in r["stragglers"], r
    # The opt-in window ensemble runs on every 5th report over the last 10.
    windows = [r["metrics"] for r in reports if "straggler/window/anomaly_ranks" in r["metrics"]]
    assert len(windows) == 3
    # Rank 2 is found in forward every time, with the most votes. With 4 ranks on 2 cores
    # another rank may also cross the window's 3 % bar in a stage the load hits; never in
    # forward, where only rank 2 is delayed.
    for m in windows:
        assert 2 in m["straggler/window/anomaly_ranks"], m
        assert "forward" in m["straggler/window/stages/2"].split(","), m
        votes = {k: v for k, v in m.items() if k.startswith("straggler/window/votes/")}
        assert votes["straggler/window/votes/2"] == max(votes.values()), m
        for rank in m["straggler/window/anomaly_ranks"]:
            if rank != 2:
                assert "forward" not in m[f"straggler/window/stages/{rank}"].split(","), m
    assert summary["loss_last"] < summary["loss_first"]


def test_control_run_of_50_sampled_steps_has_no_straggler(run_demo):
    reports, _ = run_demo(4, "--steps", str(WARMUP + 50), "--straggler-interval", "1", "--straggler-warmup-steps",
                          str(WARMUP))
    assert len(reports) == 50
    flagged = [(r["step"], r["stragglers"], r["metrics"]["straggler/hints"]) for r in reports if r["stragglers"]]
    assert flagged == []
    assert all(r["metrics"]["straggler/num_stragglers"] == 0 for r in reports)


def test_side_group_aggregation_equals_the_core_on_the_same_matrix(tmp_path):
    out = tmp_path / "aggregate.json"
    torchrun(3, REPO / "tests" / "python" / "workers" / "aggregate.py", [str(out), "6"])
    results = json.loads(out.read_text())
    assert [r["step"] for r in results] == list(range(6))
    for r in results:
        assert r["same_matrix"]
        assert r["report"] == r["core"]
        assert r["bottleneck"][0] == r["bottleneck"][1] == "backward"
        assert r["hints"][0] == r["hints"][1]
        assert r["report"]["backward"] == [r["step"] % 3, [r["step"] % 3]]
