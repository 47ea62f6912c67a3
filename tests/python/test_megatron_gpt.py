"""A real Megatron-Core GPTModel, PP 2 x DP 2 on 4 Gloo CPU ranks, driven by Megatron's 1F1B
schedule and watched by the product's default Megatron analyzer. One run in phases
(tests/python/workers/megatron_gpt.py): healthy, rank 1 (stage 0) slowed, recovery, rank 2
(stage 1) slowed, recovery, every rank of stage 1 slowed; each test reads the confirmed
verdicts of its phase. The slowdown is in forward, so the claims are about forward: the
1 ms optimizer and 5 ms backward stages only carry the machine's jitter."""

import json
import math

import pytest

from conftest import DETECTION, REAL_RUNS, REPO, assert_every_sample_reported, torchrun
from truth import unfounded, unfounded_imbalances
from workers.step_times import assert_not_blocked

pytestmark = [REAL_RUNS, DETECTION]

pytest.importorskip("megatron.core")

WORKER = REPO / "tests" / "python" / "workers" / "megatron_gpt.py"
PIPELINE_STAGES = [[0, 1], [2, 3]]  # the comparison groups: each pipeline stage's ranks


class Run:
    """The run's phases, each rank's pipeline stage, losses and per-report verdicts."""

    def __init__(self, result: dict) -> None:
        self.phases = result["phases"]
        self.stage_of = result["stage_of"]
        self.losses = result["losses"]
        self.reports = result["reports"]
        self.step_s = result["step_s"]

    def phase(self, name: str) -> dict:
        return next(p for p in self.phases if p["name"] == name)

    def after(self, phase: dict) -> dict:
        return self.phases[self.phases.index(phase) + 1]

    def reports_in(self, phase: dict) -> list[dict]:
        return [r for r in self.reports if phase["first"] <= r["step"] <= phase["last"]]

    def as_jsonl(self) -> list[dict]:
        """The reports in the JSONL sink's shape that tests/python/truth.py reads."""
        return [dict(r, verdict={"findings": r["findings"]}) for r in self.reports]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Run:
    out = tmp_path_factory.mktemp("megatron_gpt") / "result.json"
    torchrun(4, WORKER, [str(out)], timeout_s=240)
    return Run(json.loads(out.read_text()))


# 4 ranks share 2 cores (with whatever else the machine runs): a rank whose core the
# scheduler keeps busy with others for a few reports is really slower, and the verdict says
# so with cause host_contention (tests/python/test_run_queue.py). What this run injects is
# work, so the claims below are about the findings of any other cause.
CONTENTION = "host_contention"


def findings(report: dict, state: str, stage: str = "") -> list[tuple[int, int, str]]:
    """(rank, group, stage) of the report's findings in `state` (and `stage` if given), but
    for host contention."""
    return [(f["rank"], f["group"], f["stage"]) for f in report["findings"]
            if f["state"] == state and stage in ("", f["stage"]) and f["cause"] != CONTENTION]


def named(report: dict) -> tuple[int, str]:
    """The rank the verdict names (-1: nobody) and the stage of its headline finding."""
    return report["verdict"]["straggler/verdict/rank"], report["verdict"]["straggler/verdict/stage"]


def contended(report: dict) -> bool:
    """Whether the headline finding is host contention."""
    return report["verdict"]["straggler/verdict/cause"] == CONTENTION


def describe(reports: list[dict]) -> str:
    """Step, status and findings per report, a line each, for assertion messages (a string:
    pytest shows it whole)."""
    return "\n".join(f"{r['step']} {r['status']} " + str([(f["rank"], f["stage"], f["state"], f["cause"],
                                                          round(f["excess_ms"], 1)) for f in r["findings"]])
                     for r in reports)


def test_no_training_step_is_held(run):
    assert_not_blocked(dict(enumerate(run.step_s)), warmup=2, expected_steps=run.phases[-1]["last"] + 1)


def test_the_layout_is_pp2_dp2_and_training_converges(run):
    assert run.stage_of == [0, 0, 1, 1]
    assert sorted(run.losses) == ["2", "3"]  # the last stage computes the loss
    steps = run.phases[-1]["last"] + 1
    for losses in run.losses.values():
        assert len(losses) == steps and all(math.isfinite(x) for x in losses)
        assert losses[-1] < 0.5 * losses[0], losses  # fixed microbatches: memorized
    assert_every_sample_reported([r["step"] for r in run.reports], range(2, steps, 2),  # every 2nd step after 2
                                 run.reports[-1]["skipped_samples"])


def test_healthy_nobody_confirmed(run):
    healthy = run.reports_in(run.phase("healthy"))
    assert 7 - run.reports[-1]["skipped_samples"] <= len(healthy) <= 7  # a held sample has no report
    # Nothing is injected yet: a rank or a stage confirmed here must be one the crowded host
    # really slowed (tests/python/truth.py).
    first, last = healthy[0]["step"], healthy[-1]["step"]
    assert [u for u in unfounded(run.as_jsonl(), PIPELINE_STAGES) if first <= u[0] <= last] == [], describe(healthy)
    assert [u for u in unfounded_imbalances(run.as_jsonl(), PIPELINE_STAGES) if first <= u[0] <= last] == [], \
        describe(healthy)


@pytest.mark.parametrize("name, rank", [("slow rank 1", 1), ("slow rank 2", 2)])
def test_one_slowed_rank_is_confirmed_in_its_stage_and_nobody_waiting_is_blamed(run, name, rank):
    slow = run.phase(name)
    recovery = run.after(slow)
    assert slow["slowed"] == [rank] and recovery["name"] == "recovery"
    reports = run.reports_in(slow)
    # Confirming takes 3 reports in a row, more where healthy ranks jitter (at most 8).
    first = next((i for i, r in enumerate(reports) if named(r) == (rank, "forward")), None)
    assert first is not None and first <= 8, describe(reports)
    assert all(named(r) == (rank, "forward") or contended(r) for r in reports[first:]), describe(reports)
    # Its cause: compute, or host contention where the run-queue wait it measured covers most
    # of its excess (4 ranks on 2 cores: a rank that wakes from its sleep waits for a CPU).
    for r in reports[first:]:
        confirmed = [(f["rank"], f["group"], f["stage"]) for f in r["findings"]
                     if f["state"] == "straggler" and f["rank"] == rank and f["stage"] == "forward"
                     and f["cause"] in ("compute", CONTENTION)]
        assert confirmed == [(rank, run.stage_of[rank], "forward")], describe(reports)
    # Its pipeline peer waits in p2p, its data-parallel peer in the gradient all-reduce and
    # the other stage's second rank in that stage's all-reduce: none of them is confirmed in
    # communication, where those waits land, while it is slow or while it recovers. Their
    # forward times do not hold the waits, so another rank confirmed in forward is one the
    # crowded host really slowed, as in the healthy phase above (tests/python/truth.py).
    watched = reports + run.reports_in(recovery)
    for r in watched:
        blamed = {f[0] for f in findings(r, "straggler") if f[2].startswith("communication")}
        assert blamed <= {rank}, describe(watched)
    first, last = watched[0]["step"], watched[-1]["step"]
    assert [u for u in unfounded(run.as_jsonl(), PIPELINE_STAGES) if first <= u[0] <= last and u[1] != rank] == [], \
        describe(watched)
    # One slow rank is no imbalance: its stage is named only where the stage's other rank
    # really was slower than the other stage's ranks, as its data-parallel peer on a crowded
    # host can be.
    assert [u for u in unfounded_imbalances(run.as_jsonl(), PIPELINE_STAGES) if first <= u[0] <= last] == [], \
        describe(watched)
    last = watched[-1]  # recovered: 3 calm reports (the median of 8 for a window finding)
    assert (rank, "forward") not in {(f[0], f[2]) for f in findings(last, "straggler")}, describe(watched)


def test_a_whole_slowed_stage_is_imbalance_not_a_straggler(run):
    phase = run.phase("slow stage 1")
    assert phase["slowed"] == [2, 3] and run.stage_of[2] == run.stage_of[3] == 1
    reports = run.reports_in(phase)
    first = next((i for i, r in enumerate(reports) if findings(r, "imbalance", "forward")), None)
    assert first is not None and first <= 4, describe(reports)  # 3 reports in a row confirm it
    for r in reports[first:]:
        assert (r["status"] == "imbalance" and named(r) == (-1, "forward")) or contended(r), describe(reports)
        assert findings(r, "imbalance", "forward") == [(-1, 1, "forward")], describe(reports)
    for r in reports:
        assert findings(r, "straggler") == [], describe(reports)
