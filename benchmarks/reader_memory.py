"""Peak memory and time of the offline readers against the number of ranks, the what-if
replay of a per-op trace in two row orders, and mutants of those inputs.

Each case writes one input and runs the command on it in a fresh process (`relax-straggler
analyze PATH --format json --no-progress`, or `whatif PATH --format json --no-by-worker`),
timing it and reading its peak RSS (the child's max resident set, from wait4). The
command's JSON must come back whole (exit 0), else the case counts as failed.

Cases (--ranks R, default 10^6; --workers W, default 1,024 = dp 128 x pp 8):
  straggler-jsonl   3 steps, R ranks x (forward, backward, optimizer) per line
  megatron-log      3 'times across ranks' blocks of the same three timers x R rank lines
  parquet-trace     3 steps x R ranks x (forward-compute, backward-compute) rows, ordered
                    by step and by rank (analyze, --no-whatif)
  chrome-trace      the parquet case's ops as complete events, R / 10 ranks (a trace of
                    R lanes is several GB of JSON)
  whatif parquet    a synthetic 1F1B job of W workers, 32 microbatches x 10 steps (the C++
                    engine's synthetic model), ordered by step and by rank

--mutants N then runs N damaged copies of each input (byte flips, truncation, a duplicated
or deleted slice, a hostile number written over some bytes; fixed seed), each within
--limit seconds, and counts results (JSON, exit 0 or 1), clean errors (exit 1 with a
message), crashes (a traceback or any other exit) and hangs (past the limit), with the
largest peak RSS of them.

    .venv/bin/python benchmarks/reader_memory.py [--ranks 1000000] [--workers 1024] [--only NAME]
        [--mutants 10] [--limit 300]

docs/RELIABILITY.md has the figures and the command.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

# The engine's synthetic job numbers its op types in this order (csrc/core/whatif/synthetic.cpp).
SYNTHETIC_OPTYPES = ("forward-compute", "backward-compute", "forward-send", "forward-recv", "backward-send",
                     "backward-recv", "params-all-gather", "grads-reduce-scatter", "layernorm-grads-all-reduce",
                     "embedding-grads-all-reduce", "optimizer-clip-main-grad", "optimizer", "gc")
STEPS = 3
# The command, writing its peak resident set (VmHWM: this process's own, unlike a child's
# ru_maxrss, which counts the pages a fork shared with the parent) on stderr as it exits.
CLI = ("import atexit, sys\n"
       "hwm = lambda: next(l for l in open('/proc/self/status') if l.startswith('VmHWM'))\n"
       "atexit.register(lambda: sys.stderr.write(hwm()))\n"
       "from relax_straggler.cli import main\n"
       "sys.exit(main())")


def _times(rng: np.random.Generator, ranks: int, mean: float) -> np.ndarray:
    return np.round(mean * (1.0 + 0.05 * rng.random(ranks)), 2)


def write_jsonl(path: Path, ranks: int) -> int:
    rng = np.random.default_rng(1)
    with open(path, "w") as f:
        for step in range(STEPS):
            cols = [_times(rng, ranks, m) for m in (100.0, 200.0, 10.0)]
            rows = ",".join(f"[{a},{b},{c}]" for a, b, c in zip(*(c.tolist() for c in cols)))
            f.write(f'{{"step": {step}, "stages": ["forward", "backward", "optimizer"], "device_ms": [{rows}]}}\n')
    return STEPS


def write_megatron_log(path: Path, ranks: int) -> int:
    rng = np.random.default_rng(1)
    with open(path, "w") as f:
        for step in range(STEPS):
            f.write(f" iteration {10 * (step + 1):8d}/ 100 | elapsed time per iteration (ms): 400.0 |\n"
                    "times across ranks (ms):\n")
            for name, mean in (("forward-compute", 100.0), ("backward-compute", 200.0), ("optimizer", 10.0)):
                f.write(f"  {name}:\n")
                f.writelines(f"     rank {r}: {t}\n" for r, t in enumerate(_times(rng, ranks, mean).tolist()))
    return STEPS * 3 * ranks


def _op_table(ranks: int) -> pa.Table:
    """3 steps x `ranks` ranks x forward / backward compute, one worker per rank, in step order."""
    rng = np.random.default_rng(1)
    n = STEPS * ranks * 2
    step = np.repeat(np.arange(STEPS), ranks * 2)
    rank = np.tile(np.repeat(np.arange(ranks), 2), STEPS)
    op = np.tile([0, 1], STEPS * ranks)
    duration = np.where(op == 0, 0.1, 0.2) * (1.0 + 0.05 * rng.random(n))
    start = 10.0 + step * 0.5 + np.where(op == 0, 0.0, 0.2)
    return pa.table({"dp_rank": rank, "stage": np.zeros(n, np.int64), "rank": rank, "step": step,
                     "optype": pa.array(np.array(["forward-compute", "backward-compute"])[op]).dictionary_encode(),
                     "start_ts": start, "duration": duration, "seq_id": np.zeros(n, np.int64)})


def write_parquet(path: Path, ranks: int, by_rank: bool) -> int:
    table = _op_table(ranks)
    if by_rank:
        table = table.take(np.lexsort((table.column("step").to_numpy(), table.column("rank").to_numpy())))
    pq.write_table(table, path)
    return table.num_rows


def write_chrome(path: Path, ranks: int) -> int:
    table = _op_table(ranks)
    cols = {c: table.column(c).to_numpy() for c in ("rank", "step", "start_ts", "duration")}
    names = np.array(table.column("optype").to_pylist())
    with gzip.open(path, "wt", compresslevel=1) as f:
        f.write('{"traceEvents": [\n')
        f.writelines(f'{{"ph": "M", "name": "thread_name", "pid": {r}, "tid": 0, '
                     f'"args": {{"name": "PP rank 0, TP rank 0"}}}},\n' for r in range(ranks))
        f.writelines(f'{{"ph": "X", "name": "{n}", "pid": {r}, "tid": 0, "ts": {ts * 1e6:.1f}, '
                     f'"dur": {d * 1e6:.1f}, "args": {{"step": {s}}}}},\n'
                     for n, r, s, ts, d in zip(names.tolist(), cols["rank"].tolist(), cols["step"].tolist(),
                                               cols["start_ts"].tolist(), cols["duration"].tolist()))
        f.write('{"ph": "M", "name": "process_name", "pid": 0, "args": {}}]}\n')
    return table.num_rows + ranks


def write_whatif_parquet(path: Path, workers: int, by_rank: bool) -> int:
    """A synthetic 1F1B job of `workers` = dp x 8 stages, 32 microbatches x 10 steps, one
    row group per step in step order (each written as it is built, so that 100,000 workers
    fit this host), or sorted by rank."""
    from relax_straggler._ext import core

    pp = 8
    dp = workers // pp
    steps = 10
    m = core().whatif.synthetic_model(dp, pp, 32, steps, seed=1, slow_dp=dp // 3, slow_stage=pp // 2,
                                      slow_factor=1.5)
    start, end = m.timeline(False)
    slots = len(m.slot_stage)
    start, end = start.reshape(steps, slots, dp), end.reshape(steps, slots, dp)
    shape = (slots, dp)
    slot_stage = np.broadcast_to(np.asarray(m.slot_stage, dtype=np.int32)[:, None], shape).ravel()
    dp_rank = np.broadcast_to(np.asarray(m.dp_ranks, dtype=np.int32)[None, :], shape).ravel()
    optype = pa.DictionaryArray.from_arrays(
        pa.array(np.broadcast_to(np.asarray(m.slot_optype, dtype=np.int32)[:, None], shape).ravel()),
        pa.array(SYNTHETIC_OPTYPES))
    seq = np.broadcast_to(np.asarray(m.slot_seq, dtype=np.int32)[:, None], shape).ravel()
    rank = dp_rank + dp * slot_stage

    def step_table(k: int) -> pa.Table:
        return pa.table({"dp_rank": dp_rank, "stage": slot_stage, "rank": rank,
                         "step": np.full(rank.size, m.steps[k], dtype=np.int64), "optype": optype,
                         "start_ts": 10.0 + start[k].ravel(), "duration": (end[k] - start[k]).ravel(), "seq_id": seq})

    if by_rank:
        table = pa.concat_tables([step_table(k) for k in range(steps)])
        order = np.lexsort((table.column("start_ts").to_numpy(), table.column("step").to_numpy(),
                            table.column("rank").to_numpy()))
        pq.write_table(table.take(order), path)
        return table.num_rows
    with pq.ParquetWriter(path, step_table(0).schema) as writer:
        for k in range(steps):
            writer.write_table(step_table(k))
    return steps * rank.size


HOSTILE = [b"1" + b"0" * 30, b"9" * 400, b"1e400", b"1e308", b"-7", b"NaN", b"null", b"[" * 2000, b"2.5"]


def mutate(data: bytes, rng: np.random.Generator) -> bytes:
    """1 to 3 cheap mutations of a large input (each O(size))."""
    b = bytearray(data)
    for _ in range(int(rng.integers(1, 4))):
        op, i = int(rng.integers(5)), int(rng.integers(max(1, len(b))))
        if op == 0:
            for k in rng.integers(0, max(1, len(b)), size=int(rng.integers(1, 9))).tolist():
                b[k] = int(rng.integers(256))
        elif op == 1:
            b = b[:i]
        elif op == 2:
            b[i:i] = b[i:i + int(rng.integers(1, 4096))]
        elif op == 3:
            del b[i:i + int(rng.integers(1, 4096))]
        else:
            value = HOSTILE[int(rng.integers(len(HOSTILE)))]
            b[i:i + len(value)] = value
    return bytes(b)


def _hwm_mb(text: bytes) -> float:
    """The last "VmHWM: N kB" in `text`, MB; 0 when none."""
    found = re.findall(rb"VmHWM:\s+(\d+) kB", text)
    return int(found[-1]) / 1024 if found else 0.0


def run(argv: list[str], limit_s: float = 1e9) -> tuple[float, float, str]:
    """(wall s, peak RSS MB, outcome) of one command in a fresh process. outcome: "result"
    (its JSON, exit 0 or 1), "error" (exit 1 with a message), "crash", "hang" (killed at
    the limit; its peak is the last one read from /proc)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, "-c", CLI, *argv], stdout=out, stderr=err)
        polled = 0.0
        while proc.poll() is None:
            try:
                with open(f"/proc/{proc.pid}/status", "rb") as f:
                    polled = max(polled, _hwm_mb(f.read()))
            except OSError:
                pass
            if time.perf_counter() - t0 > limit_s:
                proc.kill()
                proc.wait()
                return time.perf_counter() - t0, polled, "hang"
            time.sleep(0.05)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        stderr = err.read()
        try:
            json.loads(out.read())
            whole = True
        except ValueError:
            whole = False
    code = proc.returncode
    if b"Traceback" in stderr or code not in (0, 1):
        outcome = "crash"
    elif whole:
        outcome = "result"
    else:
        outcome = "error" if code == 1 and b"error:" in stderr else "crash"
    return wall, max(polled, _hwm_mb(stderr)), outcome


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=1_000_000)
    p.add_argument("--workers", type=int, default=1024)
    p.add_argument("--only", default=None, help="run only the cases whose name contains this")
    p.add_argument("--mutants", type=int, default=0, help="damaged copies of each input to run")
    p.add_argument("--limit", type=float, default=300.0, help="seconds a mutant may run")
    args = p.parse_args()
    r, w = args.ranks, args.workers
    analyze = ["analyze", "--format", "json", "--no-progress"]
    cases = [
        (f"straggler-jsonl, {r:,} ranks", "s.jsonl", lambda f: write_jsonl(f, r), analyze, r),
        (f"megatron-log, {r:,} ranks", "m.log", lambda f: write_megatron_log(f, r), analyze, r),
        (f"parquet-trace by step, {r:,} ranks", "p.parquet", lambda f: write_parquet(f, r, False),
         analyze + ["--no-whatif"], r),
        (f"parquet-trace by rank, {r:,} ranks", "p.parquet", lambda f: write_parquet(f, r, True),
         analyze + ["--no-whatif"], r),
        (f"chrome-trace, {r // 10:,} ranks", "c.json.gz", lambda f: write_chrome(f, r // 10),
         analyze + ["--no-whatif"], r // 10),
        (f"whatif parquet by step, {w:,} workers", "w.parquet", lambda f: write_whatif_parquet(f, w, False),
         ["whatif", "--format", "json", "--no-by-worker"], w),
        (f"whatif parquet by rank, {w:,} workers", "w.parquet", lambda f: write_whatif_parquet(f, w, True),
         ["whatif", "--format", "json", "--no-by-worker"], w),
    ]
    rng = np.random.default_rng(1)
    print("| input | records | file MB | wall s | peak RSS MB | KB per rank | result |")
    print("|---|---|---|---|---|---|---|")
    mutants = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, file, write, command, ranks in cases:
            if args.only and args.only not in name:
                continue
            path = Path(tmp) / file
            records = write(path)
            mb = path.stat().st_size / 1e6
            wall, rss, outcome = run([command[0], str(path), *command[1:]])
            print(f"| {name} | {records:,} | {mb:,.0f} | {wall:.1f} | {rss:,.0f} | {rss * 1024 / ranks:.2f} | "
                  f"{outcome} |", flush=True)
            if args.mutants:
                data = path.read_bytes()
                tally = {"result": 0, "error": 0, "crash": 0, "hang": 0}
                peak = slowest = 0.0
                for _ in range(args.mutants):
                    path.write_bytes(mutate(data, rng))
                    wall, rss, outcome = run([command[0], str(path), *command[1:]], args.limit)
                    tally[outcome] += 1
                    peak, slowest = max(peak, rss), max(slowest, wall)
                mutants.append((name, tally, peak, slowest))
                del data
            path.unlink()
    if mutants:
        print("\n| mutants of | runs | results | clean errors | crashes | hangs | largest peak RSS MB | slowest s |")
        print("|---|---|---|---|---|---|---|---|")
        for name, t, peak, slowest in mutants:
            print(f"| {name} | {sum(t.values())} | {t['result']} | {t['error']} | {t['crash']} | {t['hang']} | "
                  f"{peak:,.0f} | {slowest:.1f} |")


if __name__ == "__main__":
    main()
