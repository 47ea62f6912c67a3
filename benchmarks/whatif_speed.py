"""What-if simulator speed: the study's traces end to end (load + model + every analysis),
optionally side by side with the study's own pandas analysis, and synthetic 1F1B jobs of
1,024 and 16,384 workers (dp x pp) with 32 microbatches x 10 steps.

    .venv/bin/python benchmarks/whatif_speed.py [--artifact DIR] [--skip-16k]

--artifact DIR: a checkout of the study's artifact with its requirements installed in the
running interpreter; its analyzer/wia.py is run on the same traces as a subprocess and
timed (it is not a dependency of this project). Peak memory is the process's max RSS.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from relax_straggler import _ext
from relax_straggler.whatif import run_whatif

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "whatif-traces"


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def traces(artifact: Path | None) -> None:
    for name in ("ST", "AR"):
        path = DATA / f"trace-{name}.parquet"
        best = min(_timed(lambda: run_whatif(path)) for _ in range(3))
        line = f"{name}: ours {best:.3f} s end to end (load + model + S, S_i, by worker, M_W, M_S)"
        if artifact:
            with tempfile.TemporaryDirectory() as out:
                t0 = time.perf_counter()
                subprocess.run([sys.executable, "analyzer/wia.py", "--metadata", str(DATA / f"meta-{name}.yaml"),
                                "--trace", str(path), "--dump-dir", out], cwd=artifact, check=True,
                               capture_output=True)
                theirs = time.perf_counter() - t0
            line += f"; artifact wia.py {theirs:.2f} s (S and S_i only) -> {theirs / best:.0f}x"
        print(line, flush=True)


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
    ap.add_argument("--artifact", type=Path, default=None)
    ap.add_argument("--skip-16k", action="store_true")
    args = ap.parse_args()
    traces(args.artifact)
    synthetic(128, 8, by_worker=True)
    if not args.skip_16k:
        synthetic(1024, 16, by_worker=False)


if __name__ == "__main__":
    main()
