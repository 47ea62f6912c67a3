"""A skipped optimizer.step() on one rank (a GradScaler overflow only it sees) puts its step
count one behind its peers': the gathers still pair by call order, so from then on its rows
describe other iterations than its peers'. The rows carry each rank's training forward
passes so far; a rank whose count leaves its peers' is named and no longer judged."""

import json

from conftest import DETECTION, REAL_RUNS, REPO, read_jsonl, torchrun
from workers.step_times import assert_not_blocked

pytestmark = [REAL_RUNS, DETECTION]

WORKER = REPO / "tests" / "python" / "workers" / "skipped_step.py"
SKIP = 10


def test_a_rank_whose_steps_drift_is_named_and_no_longer_judged(tmp_path):
    proc = torchrun(3, WORKER, [str(tmp_path)])
    steps = json.loads((tmp_path / "steps.json").read_text())
    assert_not_blocked(dict(enumerate(steps)), warmup=2, expected_steps=30)
    reports = read_jsonl(tmp_path / "straggler.jsonl")
    drifted = {r["step"]: r["metrics"]["straggler/drifted_ranks"] for r in reports}
    assert all(n == 0 for step, n in drifted.items() if step < SKIP), drifted
    # Rank 1's step SKIP holds two iterations; every later one is an iteration ahead of its label.
    assert all(n == 1 for step, n in drifted.items() if step >= SKIP), drifted
    for r in reports:
        if r["step"] >= SKIP:
            # Never judged from then on: not a straggler, no reference it could move.
            assert all(1 not in ranks for ranks in r["stragglers"].values()), r
            assert r["metrics"]["straggler/forward/top_rank"] != 1, r
    warnings = [line for line in proc.stderr.splitlines() if "training forward passes" in line]
    assert len(warnings) == 1 and "ranks [1]" in warnings[0], proc.stderr[-3000:]
