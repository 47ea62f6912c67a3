"""The confirmed verdict on real training processes, repeated: how many reports it takes to
confirm a slowed rank and how often a healthy run confirms anyone.

Each scenario is the demo (examples/train_gpt.py) under torchrun on Gloo, one thread per
rank, with the product's default settings; a run's reports come from its JSONL:

    healthy        4 ranks, 50 reports at interval 5, nothing slowed
    forward+20%    4 ranks, every rank sleeps 40 ms in forward, rank 2 20 % longer from
                   the 7th report on (backward+20%: the same in backward, under DDP)
    demo           2 ranks, two busy processes on rank 1's core from step 70 (reports
                   every 5 steps)
    jitter         4 ranks, every rank sleeping a fresh U(0, 15) ms in forward each step
                   (forward about 10 ms, the step about 85 ms), 50 reports, nothing slowed
    jitter+8%      the same, rank 2 sleeping 7.3 ms more in forward (8 % of its step, half
                   the sleep's spread) from the 7th report on, 36 reports after it

Per scenario and run: the report (1 = the first after the onset) that first confirms the
slowed rank in the slowed stage, the share of later reports naming it, the reports
before the onset (all of them for the healthy runs) that confirm anyone, and the reports
that confirm anyone else (any rank and stage but the slowed one's, the whole run).

    .venv/bin/python benchmarks/live_runs.py [--runs 5] [--scenarios healthy forward backward demo jitter jitter+8%]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "examples" / "train_gpt.py"
TINY = ["--layers", "1", "--d-model", "32", "--heads", "2", "--seq-len", "16", "--batch-size", "2",
        "--corpus-bytes", "200000", "--contend-rank", "-1", "--log-every", "1000"]
# The jitter scenarios: a model whose forward computes a few ms, every rank sleeping a fresh
# U(0, 15) ms in forward and 45 ms in backward (the rest of a ~85 ms step): the forward's noise
# is the sleep's, 4 ranks sharing 2 cores add the host's.
JITTER_MODEL = ["--layers", "2", "--d-model", "64", "--heads", "2", "--seq-len", "64", "--batch-size", "4",
                "--corpus-bytes", "200000", "--contend-rank", "-1", "--log-every", "1000",
                "--inject-jitter", "forward:15", *(a for r in range(4) for a in ("--inject-delay", f"{r}:backward:45"))]
WARMUP, INTERVAL, BASE_MS = 6, 5, 40.0
ONSET = WARMUP + 6 * INTERVAL


def run(nproc: int, args: list[str]) -> list[dict]:
    """The JSONL reports of one demo run on `nproc` ranks."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", str(DEMO),
               "--straggler-analysis", "--output", out, *args]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        with open(os.path.join(out, "straggler.jsonl")) as fh:
            return [json.loads(line) for line in fh]


def confirmed(report: dict) -> set[tuple[int, str]]:
    return {(f["rank"], f["stage"]) for f in report["verdict"]["findings"] if f["state"] == "straggler"}


def scenario(name: str) -> tuple[int, list[str], int, tuple[int, str] | None]:
    """(ranks, demo arguments, onset step, the slowed (rank, stage) or None)."""
    if name == "healthy":
        return 4, [*TINY, "--steps", str(WARMUP + 50 * INTERVAL), "--straggler-interval", str(INTERVAL),
                   "--straggler-warmup-steps", str(WARMUP)], 1 << 30, None
    if name in ("forward", "backward"):
        delays = [a for r in range(4) for a in ("--inject-delay", f"{r}:{name}:{BASE_MS}")]
        delays += ["--inject-delay", f"2:{name}:{0.2 * BASE_MS}:{ONSET}"]
        return 4, [*TINY, "--steps", str(ONSET + 8 * INTERVAL), "--straggler-interval", str(INTERVAL),
                   "--straggler-warmup-steps", str(WARMUP), *delays], ONSET, (2, name)
    if name == "jitter":
        return 4, [*JITTER_MODEL, "--steps", str(WARMUP + 50 * INTERVAL), "--straggler-interval", str(INTERVAL),
                   "--straggler-warmup-steps", str(WARMUP)], 1 << 30, None
    if name == "jitter+8%":
        return 4, [*JITTER_MODEL, "--steps", str(ONSET + 36 * INTERVAL), "--straggler-interval", str(INTERVAL),
                   "--straggler-warmup-steps", str(WARMUP), "--inject-delay", f"2:forward:7.3:{ONSET}"], ONSET, \
            (2, "forward")
    if name == "demo":
        return 2, ["--steps", "150", "--contend-steps", "70:150", "--straggler-interval", "5",
                   "--log-every", "1000"], 70, None
    raise ValueError(f"unknown scenario {name!r}")


def measure(name: str) -> dict:
    """One run of scenario `name`: {"first": report number or None, "named": share of the
    reports from the first on, "false": reports before the onset confirming anyone, "others":
    reports confirming any (rank, stage) but the slowed one, "reports": reports written}."""
    nproc, args, onset, slowed = scenario(name)
    reports = run(nproc, args)
    before = [r for r in reports if r["step"] < onset]
    after = [r for r in reports if r["step"] >= onset]
    if name == "demo":
        hit = [r["metrics"]["straggler/verdict/rank"] == 1 for r in after]
    else:
        hit = [slowed in confirmed(r) for r in after] if slowed else []
    first = hit.index(True) if True in hit else None
    named = sum(hit[first:]) / len(hit[first:]) if first is not None else 0.0
    others = sum(bool(confirmed(r) - {slowed}) for r in reports) if name != "demo" else None
    return {"first": None if first is None else first + 1, "named": named,
            "false": sum(bool(confirmed(r)) for r in before), "before": len(before), "others": others,
            "reports": len(reports)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--scenarios", nargs="+", default=["healthy", "forward", "backward", "demo", "jitter", "jitter+8%"])
    args = p.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    print("| scenario | runs | confirmed on report (1 = first after the onset) | named after | "
          "reports before the onset confirming anyone | reports confirming anyone else |")
    print("|---|---|---|---|---|---|")
    for name in args.scenarios:
        results = [measure(name) for _ in range(args.runs)]
        firsts = ", ".join("-" if r["first"] is None else str(r["first"]) for r in results)
        named = min(r["named"] for r in results)
        false = ", ".join(f"{r['false']}/{r['before']}" for r in results)
        others = "-" if name == "demo" else ", ".join(f"{r['others']}/{r['reports']}" for r in results)
        healthy = name in ("healthy", "jitter")
        print(f"| {name} | {args.runs} | {'-' if healthy else firsts} | "
              f"{'-' if healthy else f'>= {named:.0%}'} | {false} | {others} |", flush=True)


if __name__ == "__main__":
    main()
