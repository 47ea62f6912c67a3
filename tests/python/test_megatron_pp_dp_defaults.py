"""A real Megatron-Core GPTModel, pipeline 2 x data parallel 2 on 4 Gloo ranks, watched with the
default flags (collective timing on) and --straggler-interval 5, as a user runs it
(tests/python/workers/megatron_gpt_run.py): the pipeline staggers when ranks reach a sampled
step's gather, and that must never be taken for a failure of the side group, hold a
training step, or leave the run without reports. The 5-run series (healthy and one slowed
rank per stage) is benchmarks/megatron_pp_dp.py (docs/PERFORMANCE.md)."""

import json

import pytest

from conftest import DETECTION, REAL_RUNS, REPO, read_jsonl, torchrun
from truth import unfounded
from workers.step_times import assert_not_blocked

pytestmark = [REAL_RUNS, DETECTION]

pytest.importorskip("megatron.core")

WORKER = REPO / "tests" / "python" / "workers" / "megatron_gpt_run.py"
STEPS, INTERVAL, WARMUP = 60, 5, 10  # WARMUP: the default --straggler-warmup-steps


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[list[dict], list[dict]]:
    out = tmp_path_factory.mktemp("megatron_pp_dp")
    jsonl = out / "straggler.jsonl"
    torchrun(4, WORKER, [str(out), "--steps", str(STEPS), "--straggler-analysis", "--straggler-interval",
                         str(INTERVAL), "--straggler-jsonl", str(jsonl)], timeout_s=400)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)]
    return ranks, read_jsonl(jsonl)


def test_no_training_step_is_held_and_the_side_group_never_fails(run):
    ranks, _ = run
    assert [r["stage"] for r in ranks] == [0, 0, 1, 1]
    assert_not_blocked({r["rank"]: r["step_s"] for r in ranks}, warmup=WARMUP, expected_steps=STEPS)
    assert [r["failed"] for r in ranks] == [None] * 4, [r["warnings"] for r in ranks]
    assert [r["warnings"] for r in ranks] == [[]] * 4
    assert [r["counters"]["skipped_samples"] for r in ranks] == [0] * 4


def test_every_sampled_step_is_reported_and_nobody_is_confirmed(run):
    _, reports = run
    assert [r["step"] for r in reports] == list(range(WARMUP, STEPS, INTERVAL))
    # Nothing is injected: a rank confirmed here must be one the crowded host really slowed
    # (tests/python/truth.py); the comparison groups are the pipeline stages' ranks.
    assert unfounded(reports, groups=[[0, 1], [2, 3]]) == []
