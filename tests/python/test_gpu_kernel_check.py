"""benchmarks/gpu/kernel_check.py (the GPU check's kernel_stats step) on 2 Gloo ranks on the
CPU: the same plumbing as on the GPU (DDP, --straggler-kernel-stats at interval 10, rank 1's
competing matmul thread, the reports, every rank's records gathered to rank 0), where the
kernel source is unavailable: one warning per rank, every kernel field null (NaN) and the
result's `failure` quoting the warning."""

import json

from conftest import REAL_RUNS, REPO, read_jsonl, torchrun
from workers.step_times import assert_not_blocked

pytestmark = REAL_RUNS

SCRIPT = REPO / "benchmarks" / "gpu" / "kernel_check.py"
TINY = ["--layers", "1", "--d-model", "32", "--heads", "2", "--seq-len", "16", "--batch-size", "2",
        "--corpus-bytes", "200000", "--contend-size", "64"]
WARNING = "--straggler-kernel-stats"


def test_the_cpu_path_writes_the_result_and_says_why_nothing_was_measured(tmp_path):
    out = tmp_path / "kernel_stats.json"
    proc = torchrun(2, SCRIPT, ["--device", "cpu", *TINY, "--steps", "30", "--contend-from", "15",
                                "--output", str(out)])
    assert WARNING in proc.stderr
    result = json.loads(out.read_text())  # strict JSON: NaN written as null

    assert result["device"] == "cpu" and result["world_size"] == 2
    assert (result["interval"], result["warmup_steps"], result["kernel_stats"]) == (10, 10, True)
    assert result["failure"].startswith("rank 0: kernel records not measured: ")
    assert WARNING in result["failure"] and "read NaN" in result["failure"]
    assert result["rank1_causes"] == [] and result["confirmed_rank1_from_step"] is None

    for rank, r in enumerate(result["ranks"]):
        assert r["rank"] == rank
        assert (r["kernel_source"], r["mode"], r["sampled_steps"], r["measured_steps"]) == (None, "unavailable", 0, 0)
        assert (r["records"], r["dropped_records"], r["invalid_records"], r["unattributed_records"]) == (0, 0, 0, 0)
        assert [w for w in r["warnings"] if WARNING in w] == [result["failure"].split(": ", 2)[2]]
        assert r["step_ms_before"] > 0 and r["step_ms_after"] > 0
    assert_not_blocked({r["rank"]: [ms / 1e3 for ms in r["step_ms"]] for r in result["ranks"]}, warmup=10,
                       expected_steps=30)
    assert result["ranks"][0]["contender_matmuls"] is None
    assert result["ranks"][1]["contender_matmuls"] > 0  # the competitor ran on rank 1 only

    reports = result["reports"]
    assert [r["step"] for r in reports] == [10, 20]  # warm-up 10, interval 10, 30 steps
    for r in reports:
        assert set(r) == {"step", "status", "rank", "stage", "cause", "max_ms", "published", "per_rank"}
        assert isinstance(r["status"], str) and isinstance(r["rank"], int) and isinstance(r["cause"], str)
        assert {"forward", "backward", "optimizer"} <= set(r["published"])
        for stage, fields in r["published"].items():
            assert fields["top_rank"] in (0, 1)
            assert (fields["kernel_ms"], fields["idle_ms"], fields["nccl_ms"]) == (None, None, None), stage
            assert r["max_ms"][stage] > 0
        assert r["per_rank"] == {"0": None, "1": None}
    assert result["final"] == {k: reports[-1][k] for k in ("step", "status", "rank", "stage", "cause")}

    lines = read_jsonl(out.with_suffix(".jsonl"))
    assert [line["step"] for line in lines] == [10, 20]
    assert lines[-1]["metrics"]["straggler/forward/kernel_ms"] is None
