"""What-if simulator speed: the study's traces end to end (load + model + every analysis),
optionally side by side with the study's own pandas analysis, and synthetic 1F1B jobs of
1,024 and 16,384 workers (dp x pp) with 32 microbatches x 10 steps.

    .venv/bin/python benchmarks/whatif_speed.py [--artifact DIR --artifact-python PY] [--skip-16k] [--runs N]

--artifact DIR: a copy of the study's artifact, run with --artifact-python (an interpreter
with its requirements installed, default: this one) on the same traces, each script as a
subprocess timed end to end: analyzer/wia.py (S, S_i), then compute_mw.py and
compute_ms.py (M_W, M_S) on its result. Ours is timed the same way, as the
`relax-straggler whatif PATH --format json` command (start-up, load, model, S, every S_i,
by worker, M_W, M_S: best and median wall time and CPU time of --runs runs), and in
process. The artifact is not a dependency of this project.
Peak memory is the process's max RSS.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from relax_straggler import _ext
from relax_straggler.whatif import run_whatif

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "whatif-traces"


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def traces(artifact: Path | None, artifact_python: str, runs: int) -> None:
    cli = Path(sys.executable).with_name("relax-straggler")
    for name in ("ST", "AR"):
        path = DATA / f"trace-{name}.parquet"
        best = min(_timed(lambda: run_whatif(path)) for _ in range(3))
        walls, cpus = [], []
        for _ in range(runs):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            walls.append(_timed(lambda: subprocess.run([str(cli), "whatif", str(path), "--format", "json"],
                                                       check=True, capture_output=True)))
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        command = min(walls)
        # CPU time (user + sys of the command) moves less than wall time with the machine's load.
        line = (f"{name}: ours {command:.3f} s end to end as a command (median {statistics.median(walls):.3f} s, "
                f"CPU {min(cpus):.3f} s, of {runs} runs; {best:.3f} s in process)")
        if artifact:
            theirs = _artifact(artifact, artifact_python, name)
            total = sum(theirs.values())
            parts = ", ".join(f"{k} {v:.2f} s" for k, v in theirs.items())
            line += (f"; artifact {total:.2f} s ({parts}) -> {total / command:.0f}x "
                     f"({total / statistics.median(walls):.0f}x of the median)")
        print(line, flush=True)


def _artifact(artifact: Path, python: str, name: str) -> dict[str, float]:
    """Seconds of each artifact script on trace NAME, run as its own run_all.sh runs them."""
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        runs = {
            "wia.py": ["analyzer/wia.py", "--metadata", str(DATA / f"meta-{name}.yaml"), "--trace",
                       str(DATA / f"trace-{name}.parquet"), "--dump-dir", tmp, "--root", tmp],
            "compute_mw.py": ["analyzer/compute_mw.py", "--trial", name, "--dump-dir", tmp, "--analysis-result",
                              f"{tmp}/{name}.json", "--root", tmp],
            "compute_ms.py": ["analyzer/compute_ms.py", "--trial", name, "--dump-dir", tmp, "--analysis-result",
                              f"{tmp}/{name}.json", "--root", tmp],
        }
        for script, argv in runs.items():
            t0 = time.perf_counter()
            subprocess.run([python, *argv], cwd=artifact, check=True, capture_output=True,
                           env={"PYTHONPATH": str(artifact), "PATH": "/usr/bin:/bin"})
            out[script] = time.perf_counter() - t0
    return out


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def synthetic(dp: int, pp: int, by_worker: bool) -> None:
    w = _ext.core().whatif
    t0 = time.perf_counter()
    model = w.synthetic_model(dp, pp, 32, 10, seed=1, slow_dp=dp // 3, slow_stage=pp // 2, slow_factor=1.5)
    built = time.perf_counter() - t0
    t0 = time.perf_counter()
    r = model.analyze([], 0.03, by_worker, 0)
    took = time.perf_counter() - t0
    top = r.top_workers[0]
    print(f"dp {dp} x pp {pp} = {dp * pp} workers, {model.num_ops / 1e6:.1f} M ops: build {built:.1f} s, "
          f"S + by dp_rank + by stage + by op type{' + by worker' if by_worker else ''} + M_W + M_S {took:.1f} s; "
          f"S = {r.slowdown:.3f}, top worker dp {top // pp} / pp {top % pp}, M_W = {r.m_w.rem:.3f}; "
          f"peak RSS {rss_mb():.0f} MB", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--artifact", type=Path, default=None, help="a copy of the study's artifact")
    ap.add_argument("--artifact-python", default=sys.executable, help="the interpreter for the artifact")
    ap.add_argument("--skip-16k", action="store_true")
    ap.add_argument("--runs", type=int, default=7, help="runs of the command per trace (best and median shown)")
    args = ap.parse_args()
    traces(args.artifact, args.artifact_python, args.runs)
    synthetic(128, 8, by_worker=True)
    if not args.skip_16k:
        synthetic(1024, 16, by_worker=False)


if __name__ == "__main__":
    main()
