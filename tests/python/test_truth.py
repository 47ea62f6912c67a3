"""The oracle of the real-run tests (tests/python/truth.py) tells a founded confirmation from
an unfounded one on reports whose times are known."""

from truth import unfounded, unfounded_imbalances

STAGES = ["forward", "communication"]


def report(step: int, forward: list[float], findings: list[dict]) -> dict:
    return {"step": step, "stages": STAGES, "device_ms": [[f, 1.0] for f in forward],
            "verdict": {"findings": findings}}


def straggler(rank: int, stage: str = "forward", cause: str = "compute") -> dict:
    return {"rank": rank, "group": 0, "stage": stage, "state": "straggler", "cause": cause}


def imbalance(group: int) -> dict:
    return {"rank": -1, "group": group, "stage": "forward", "state": "imbalance", "cause": "imbalance"}


def test_a_rank_confirmed_while_its_times_match_its_peers_is_unfounded():
    reports = [report(k, [10.0, 10.0, 10.1, 9.9], []) for k in range(5)]
    reports.append(report(5, [10.0, 10.0, 10.1, 9.9], [straggler(2)]))
    assert unfounded(reports) == [(5, 2, "forward", "compute", 1.01)]


def test_a_rank_confirmed_while_6_percent_slower_or_for_host_contention_is_founded():
    slower = [report(k, [10.0, 10.0, 10.6, 9.9], [straggler(2)] if k == 5 else []) for k in range(6)]
    assert unfounded(slower) == []
    contended = [report(k, [10.0, 10.0, 10.0, 10.0], [straggler(1, cause="host_contention")]) for k in range(3)]
    assert unfounded(contended) == []


def test_a_late_rank_is_founded_in_a_communication_stage_only():
    reports = [report(k, [10.0, 9.0, 10.0, 10.0], []) for k in range(3)]
    for r in reports:
        r["device_ms"][1][1] = 0.5  # rank 1 arrives late and waits half as long
    reports[-1]["verdict"]["findings"] = [straggler(1, "communication", "communication_link"), straggler(1)]
    assert unfounded(reports) == [(2, 1, "forward", "compute", 0.9)]


def test_an_imbalance_made_by_one_slow_rank_of_a_pair_is_unfounded_and_a_slow_pair_is_not():
    groups = [[0, 1], [2, 3]]
    one = [report(k, [10.0, 10.0, 20.0, 10.0], [imbalance(1)] if k == 2 else []) for k in range(3)]
    assert unfounded_imbalances(one, groups) == [(2, 1, "forward", 1.0)]
    both = [report(k, [10.0, 10.0, 20.0, 12.0], [imbalance(1)] if k == 2 else []) for k in range(3)]
    assert unfounded_imbalances(both, groups) == []
