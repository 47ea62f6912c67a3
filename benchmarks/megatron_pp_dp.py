"""Observing never blocks training, on a real Megatron-Core run: GPTModel (local layer spec,
4 layers, hidden 64, seq 32, vocab 128), pipeline 2 x data parallel 2 on 4 Gloo CPU ranks,
Megatron-Core's 1F1B schedule with 4 microbatches, the data-parallel gradient all-reduce
timed as `all-grads-sync`, the Megatron adapter with the default flags (collective timing
on) and --straggler-interval 5, 150 steps (tests/python/workers/megatron_gpt_run.py).

    healthy   nothing slowed
    stage0    rank 1 (stage 0) +30 ms per microbatch in forward from step 40
    stage1    rank 2 (stage 1) the same
    rank3     rank 3 (stage 1, data-parallel rank 1) the same

Per run: the steps over 10 x the rank's median step after the analyzer's warm-up (any
rank), the longest such ratio, the reports written, the ranks confirmed before and after
the onset (and whether a rank of the other stage was ever confirmed), the ranks confirmed
with cause host_contention (4 ranks on 2 cores: a rank kept waiting for a CPU is really
slower, and named so; counted apart), the side-group failures and the analyzer's warnings;
and the live what-if's reports: how many name a top worker (straggler/whatif/top_worker not
"none"), and, from the onset, how many name the slowed rank's worker (top_rank) and how many
have it as the step's leader (straggler/whatif/leader, unconfirmed).
docs/PERFORMANCE.md records the results.

    .venv/bin/python benchmarks/megatron_pp_dp.py [--runs 5] [--scenarios healthy stage0 stage1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "python" / "workers" / "megatron_gpt_run.py"
STEPS, INTERVAL, ONSET, SLOW_MS = 150, 5, 40, 30.0
SCENARIOS = {"healthy": -1, "stage0": 1, "stage1": 2, "rank3": 3}
STAGE_OF = [0, 0, 1, 1]
FACTOR = 10.0


def run(slow_rank: int, steps: int) -> dict:
    """One run: every rank's result (rank{R}.json) and the JSONL reports."""
    with tempfile.TemporaryDirectory() as out:
        jsonl = os.path.join(out, "straggler.jsonl")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4", str(WORKER), out,
               "--steps", str(steps), "--slow-rank", str(slow_rank), "--slow-ms", str(SLOW_MS), "--onset", str(ONSET),
               "--straggler-analysis", "--straggler-interval", str(INTERVAL), "--straggler-jsonl", jsonl]
        start = time.monotonic()
        proc = subprocess.run(cmd, cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True,
                              text=True, timeout=1800)
        wall = time.monotonic() - start
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(4)]
        reports = [json.loads(line) for line in open(jsonl)] if os.path.exists(jsonl) else []
    return {"ranks": ranks, "reports": reports, "wall_s": wall}


def confirmed(report: dict, contention: bool = False) -> set[int]:
    """The ranks confirmed for host contention (contention) or for anything else."""
    return {f["rank"] for f in report["verdict"]["findings"]
            if f["state"] == "straggler" and (f["cause"] == "host_contention") == contention}


def first_confirmations(reports: list[dict]) -> list[list]:
    """[step, rank, stage, cause] of each (rank, stage) the first time it is confirmed."""
    seen, out = set(), []
    for r in reports:
        for f in r["verdict"]["findings"]:
            if f["state"] == "straggler" and (f["rank"], f["stage"]) not in seen:
                seen.add((f["rank"], f["stage"]))
                out.append([r["step"], f["rank"], f["stage"], f["cause"]])
    return out


def whatif_counts(reports: list[dict], slow_rank: int) -> dict:
    """The live what-if's naming: reports that name a top worker, and from the onset those
    that name the slowed rank's worker or have it as their leader."""
    m = [r["metrics"] for r in reports if "straggler/whatif/top_worker" in r["metrics"]]
    after = [r["metrics"] for r in reports if r["step"] >= ONSET and "straggler/whatif/top_worker" in r["metrics"]]
    worker = f"dp {slow_rank % 2} / pp {STAGE_OF[slow_rank]}" if slow_rank >= 0 else None
    return {"whatif_reports": len(m), "whatif_named": sum(x["straggler/whatif/top_worker"] != "none" for x in m),
            "whatif_reports_after_onset": len(after),
            "whatif_named_slowed": sum(x["straggler/whatif/top_rank"] == slow_rank for x in after) if worker else 0,
            "whatif_led_slowed": sum(x.get("straggler/whatif/leader") == worker for x in after) if worker else 0}


def summarize(result: dict, slow_rank: int) -> dict:
    over, worst = 0, 0.0
    for r in result["ranks"]:
        times = r["step_s"][r["warmup"]:]
        median = statistics.median(times)
        over += sum(t > FACTOR * median for t in times)
        worst = max(worst, max(times) / median)
    reports = result["reports"]
    before = sorted(set().union(*[confirmed(x) for x in reports if x["step"] < ONSET]))
    after = sorted(set().union(*[confirmed(x) for x in reports if x["step"] >= ONSET]))
    first = next((x["step"] for x in reports if x["step"] >= ONSET and slow_rank in confirmed(x)), None)
    other_stage = [] if slow_rank < 0 else [r for r in after if STAGE_OF[r] != STAGE_OF[slow_rank]]
    return {"steps_over_10x_median": over, "longest_over_median": round(worst, 1), "reports": len(reports),
            "confirmed_before_onset": before, "confirmed_after_onset": after, "slowed_confirmed_at": first,
            "other_stage_confirmed": other_stage, "first_confirmations": first_confirmations(reports),
            "host_contention_confirmed": sorted(set().union(*[confirmed(x, contention=True) for x in reports])),
            "side_group_failures": [r["failed"] for r in result["ranks"] if r["failed"]],
            "warnings": sum(len(r["warnings"]) for r in result["ranks"]), "wall_s": round(result["wall_s"], 1),
            **whatif_counts(reports, slow_rank)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    args = p.parse_args()
    for name in args.scenarios:
        for i in range(args.runs):
            row = summarize(run(SCENARIOS[name], args.steps), SCENARIOS[name])
            print(json.dumps({"scenario": name, "run": i + 1, **row}), flush=True)


if __name__ == "__main__":
    main()
