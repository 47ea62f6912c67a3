"""benchmarks/gpu/summarize.py on fake OUT_DIRs: the kernel_stats step's result (built by
kernel_check.build_result from made-up ranks and reports, as on a GPU where the records were
measured) and the kernel_overhead step's overhead JSON reach summary.md; missing results
are named with the end of the step's log."""

import argparse
import importlib.util
import json
import math

import pytest
import torch

from conftest import REPO
from relax_straggler import StragglerConfig
from relax_straggler.common.serialization import json_safe

GPU = REPO / "benchmarks" / "gpu"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"gpu_{name}", GPU / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def kernel_check():
    return _load("kernel_check")


@pytest.fixture(scope="module")
def summarize():
    return _load("summarize")


def _evidence(kernel_ms: float, idle_ms: float) -> dict:
    return {"stages": {"forward": {"kernel_ms": kernel_ms, "idle_ms": idle_ms, "nccl_ms": 0.0,
                                   "top": [["gemm", kernel_ms, 4]]},
                       "backward": {"kernel_ms": 2 * kernel_ms, "idle_ms": idle_ms, "nccl_ms": 0.0, "top": []}},
            "records": 40, "invalid_records": 1, "dropped_records": 0, "unattributed_records": 3}


def _rank(rank: int, slow_kernel_ms: float) -> dict:
    steps = {10: _evidence(3.0, 0.5), 20: _evidence(3.0, 0.5), 30: _evidence(slow_kernel_ms, 0.5),
             40: _evidence(slow_kernel_ms, 0.5)}
    return {"rank": rank, "kernel_source": "cupti", "mode": "kernels", "steps": steps, "warnings": [],
            "contender_matmuls": 800 if rank == 1 else None, "step_ms_before": 10.0, "step_ms_after": 14.0,
            "step_ms": [10.0] * 10 + [14.0] * 10}


def _report(step: int, status: str, rank: int, stage: str, cause: str) -> dict:
    m = {"step": step, "straggler/verdict/status": status, "straggler/verdict/rank": rank,
         "straggler/verdict/stage": stage, "straggler/verdict/cause": cause}
    for s in ("forward", "backward", "optimizer"):
        m.update({f"straggler/{s}/top_rank": 1, f"straggler/{s}/max_ms": 5.0, f"straggler/{s}/kernel_ms": 4.0,
                  f"straggler/{s}/idle_ms": 0.5, f"straggler/{s}/nccl_ms": math.nan})
    return m


def _kernel_stats(kernel_check) -> dict:
    args = argparse.Namespace(steps=50, contend_from=30, contend_size=8192, layers=4, d_model=256, heads=4,
                              seq_len=256, batch_size=8)
    config = StragglerConfig(enabled=True, interval=10, kernel_stats=True, jsonl_path="out/kernel_stats.jsonl")
    reports = [_report(40, "straggler", 1, "forward", "device"), _report(10, "healthy", -1, "none", "none"),
               _report(20, "healthy", -1, "none", "none"), _report(30, "suspected", 1, "forward", "compute")]
    return json_safe(kernel_check.build_result(args, torch.device("cuda", 0), config, reports,
                                               [_rank(0, 3.0), _rank(1, 12.0)]))


def _overhead() -> dict:
    walls = {"bare": [10.0, 10.0, 10.0], "off": [10.0, 10.1, 10.0], "ours/10": [10.2, 10.2, 10.2],
             "ours-kernel-stats/10": [10.71, 10.71, 10.2]}
    rows = [{"variant": v, "wall_ms_per_step": sorted(w)[1], "wall_ratio": sorted(w)[1] / 10.0}
            for v, w in walls.items()]
    return {"device": "cuda:0", "world_size": 2, "rounds": 3, "steps": 100, "rows": rows,
            "blocks": {v: [{"wall_ms": x, "cpu_ms": x} for x in w] for v, w in walls.items()}}


def _summary(summarize, out, capsys) -> str:
    summarize.main(out)
    return capsys.readouterr().out


def test_the_kernel_steps_reach_the_summary(tmp_path, kernel_check, summarize, capsys):
    result = _kernel_stats(kernel_check)
    assert [r["step"] for r in result["reports"]] == [10, 20, 30, 40]  # in step order
    assert result["failure"] is None and result["rank1_causes"] == ["device"]
    assert result["ranks"][1]["records"] == 160 and result["ranks"][1]["unattributed_records"] == 12
    (tmp_path / "kernel_stats.json").write_text(json.dumps(result, allow_nan=False))
    (tmp_path / "kernel_overhead.json").write_text(json.dumps(_overhead()))
    (tmp_path / "steps.tsv").write_text("kernel_stats\t0\t31\nkernel_overhead\t0\t64\n")

    text = _summary(summarize, tmp_path, capsys)
    assert "| kernel_stats | 0 | 31 |" in text and "| kernel_overhead | 0 | 64 |" in text
    assert "NOT MEASURED" not in text
    assert "verdict's cause seen for rank 1: device; confirmed from step 40" in text
    assert "| 1 | kernels | 4 / 4 | 160 | 0 | 4 | 12 | 10.00 / 14.00 |" in text
    # step 40: forward of rank 0, of rank 1, backward of rank 0, of rank 1 (kernel / idle / nccl ms)
    assert ("| 40 | straggler | 1 | forward | device | 3.00 / 0.50 / 0.00 | 12.00 / 0.50 / 0.00 | "
            "6.00 / 0.50 / 0.00 | 24.00 / 0.50 / 0.00 |") in text
    assert "| ours-kernel-stats/10 | 10.71 | 1.0710 |" in text
    assert "ours/10 against off: +2.0 % step time" in text
    assert "ours-kernel-stats/10 against ours/10: +5.0 % step time" in text  # median of 1.05, 1.05, 1.0
    assert "rank 1's top forward kernels, step 40: gemm 12.00 ms x4" in text
    assert "warning in kernel_overhead.log" not in text


def test_an_unmeasured_or_missing_kernel_step_is_named_with_its_reason(tmp_path, kernel_check, summarize, capsys):
    result = _kernel_stats(kernel_check)
    result["failure"] = "rank 0: kernel records not measured: this build has no CUPTI"
    for r in result["reports"]:
        r["per_rank"] = {"0": None, "1": None}
    (tmp_path / "kernel_stats.json").write_text(json.dumps(result))
    warning = "relax_straggler: --straggler-kernel-stats: this build has no CUPTI"
    log = f"{warning}\n{warning}\nRuntimeError: CUPTI_ERROR_NOT_INITIALIZED\n\n"
    (tmp_path / "kernel_overhead.log").write_text(log)

    text = _summary(summarize, tmp_path, capsys)
    assert "kernel stats NOT MEASURED: rank 0: kernel records not measured: this build has no CUPTI" in text
    assert "| 10 | healthy | -1 | none | none | - | - | - | - |" in text
    assert ("kernel stats overhead: missing (kernel_overhead.log ends: RuntimeError: "
            "CUPTI_ERROR_NOT_INITIALIZED)") in text
    (tmp_path / "kernel_overhead.json").write_text(json.dumps(_overhead()))
    text = _summary(summarize, tmp_path, capsys)
    assert text.count(f"warning in kernel_overhead.log: {warning}") == 1

    (tmp_path / "kernel_stats.json").unlink()
    text = _summary(summarize, tmp_path, capsys)
    assert "kernel stats: missing (kernel_stats.log ends: no log)" in text
    assert "overhead: missing" in text and "parity: missing" in text
