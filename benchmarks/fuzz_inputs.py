"""Mutation fuzz of the offline inputs: every reader (relax_straggler.readers.READERS) and
the op-jsonl input through `relax-straggler analyze` and `relax-straggler whatif`.

Each seed input is mutated (fixed seed): byte flips, truncation, duplicated and deleted
lines or rows, huge numbers, NaN / inf, negative values, deep nesting, wrong types. Every
mutant must give a result (its JSON; exit 0, or 1 from analyze when nothing can be
concluded) or a clean bad-input error (exit 1 with a message), within --limit seconds.
Counted: crashes (a traceback, or exit 2: bad options), hangs (over the limit), results
lost (exit 0 without its JSON).

    python benchmarks/fuzz_inputs.py --inputs 10000 [--limit 2] [--seed 1]

tests/python/test_cli_fuzz.py runs a few hundred per input in CI; docs/RELIABILITY.md has
the figures of a long run.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "python" / "fixtures"
# The engine's synthetic job numbers its op types in this order (csrc/core/whatif/synthetic.cpp).
SYNTHETIC_OPTYPES = ("forward-compute", "backward-compute", "forward-send", "forward-recv", "backward-send",
                     "backward-recv", "params-all-gather", "grads-reduce-scatter", "layernorm-grads-all-reduce",
                     "embedding-grads-all-reduce", "optimizer-clip-main-grad", "optimizer", "gc")
HOSTILE = [b"1" + b"0" * 30, b"9" * 5001, b"1e400", b"-1e400", b"NaN", b"Infinity", b"-7", b"2.5", b'"12.5"',
           b"null", b"true", b"[]", b"{}", b"[" * 5000, str(2**63).encode(), str(2**20 - 1).encode(), b"-0"]
PARQUET_HOSTILE = [2**40, 2**63 - 1, -1, 2**20 - 1, 1.5, float("nan"), float("inf"), None, "12.5", 0]


def synthetic_rows(dp: int = 2, pp: int = 2, microbatches: int = 4, steps: int = 3) -> list[dict]:
    """Per-op rows of a small synthetic 1F1B job (worker dp 1 / pp 1 slow)."""
    from relax_straggler._ext import core

    m = core().whatif.synthetic_model(dp, pp, microbatches, steps, seed=1, slow_dp=1, slow_stage=1, slow_factor=1.5)
    start, end = m.timeline(False)
    slots = len(m.slot_stage)
    start, end = start.reshape(steps, slots, dp), end.reshape(steps, slots, dp)
    rows = []
    for k, step in enumerate(m.steps):
        for slot in range(slots):
            for lane, d in enumerate(m.dp_ranks):
                stage = m.slot_stage[slot]
                rows.append({"dp_rank": d, "stage": stage, "rank": d + dp * stage, "step": step,
                             "optype": SYNTHETIC_OPTYPES[m.slot_optype[slot]], "start_s": 10.0 + start[k, slot, lane],
                             "duration_s": end[k, slot, lane] - start[k, slot, lane], "seq_id": m.slot_seq[slot]})
    return rows


_PARQUET_COLUMNS = {"dp_rank": "dp_rank", "stage": "stage", "rank": "rank", "step": "step", "optype": "optype",
                    "start_ts": "start_s", "duration": "duration_s", "seq_id": "seq_id"}


def seeds() -> dict[str, tuple[str, bytes]]:
    """name -> (file suffix, bytes) of every seed input."""
    rows = synthetic_rows()
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({c: [r[k] for r in rows] for c, k in _PARQUET_COLUMNS.items()}), sink)
    out = {name: (suffix, (FIXTURES / name).read_bytes()) for name, suffix in (
        ("straggler.jsonl", ".jsonl"), ("megatron_all.log", ".log"), ("megatron_minmax.log", ".log"),
        ("timeline-small.json", ".json"))}
    out["trace-syn.parquet"] = (".parquet", sink.getvalue().to_pybytes())
    out["ops.jsonl"] = (".jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode())
    return out


def mutate_text(data: bytes, rng: random.Random) -> bytes:
    """1 to 4 mutations of a text input."""
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        i = rng.randrange(len(b)) if b else 0
        if op == 0 and b:  # byte flips
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(len(b))] = rng.randrange(256)
        elif op == 1:  # truncation
            b = b[: rng.randrange(len(b) + 1)]
        elif op in (2, 3):  # duplicated or deleted lines
            lines = bytes(b).split(b"\n")
            j = rng.randrange(len(lines))
            if op == 2:
                lines[j:j] = [lines[j]] * rng.randint(1, 3)
            else:
                del lines[j:j + rng.randint(1, 3)]
            b = bytearray(b"\n".join(lines))
        else:  # a number (or a token after ':') replaced by a hostile value
            digits = [k for k in range(len(b)) if 48 <= b[k] <= 57 and (k == 0 or not 48 <= b[k - 1] <= 57)]
            if not digits:
                continue
            k = rng.choice(digits)
            end = k
            while end < len(b) and (48 <= b[end] <= 57 or b[end] in b".eE+-"):
                end += 1
            b[k:end] = rng.choice(HOSTILE)
    return bytes(b)


def mutate_parquet(data: bytes, rng: random.Random) -> bytes:
    """A parquet mutant: hostile cell values, a column of another type, duplicated or
    dropped rows; or damaged bytes of the file itself."""
    if rng.random() < 0.15:
        return mutate_text(data, rng)
    table = pq.read_table(pa.BufferReader(data))
    cols = {name: table.column(name).to_pylist() for name in table.column_names}
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(5)
        name = rng.choice(list(cols))
        n = min(len(c) for c in cols.values())
        if n == 0:
            break
        if op <= 1:
            for _ in range(rng.randint(1, 3)):
                cols[name][rng.randrange(n)] = rng.choice(PARQUET_HOSTILE)
        elif op == 2:
            cols[name] = [str(x) for x in cols[name]]
        elif op == 3:
            j, k = rng.randrange(n), rng.randint(1, 3)
            for c in cols.values():
                c[j:j] = [c[j]] * k
        else:
            j = rng.randrange(n)
            k = rng.randint(1, 20)
            for c in cols.values():
                del c[j:j + k]
    arrays = {}
    for name, values in cols.items():
        try:
            arrays[name] = pa.array(values)
        except (pa.ArrowException, OverflowError):
            arrays[name] = pa.array([None if v is None else str(v) for v in values])
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table(arrays), sink)
    return sink.getvalue().to_pybytes()


@dataclass
class Tally:
    inputs: int = 0
    results: int = 0
    errors: int = 0
    crashes: list[str] = field(default_factory=list)
    hangs: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    slowest_s: float = 0.0


class _Hang(BaseException):
    """Raised by the alarm: a run past the limit (not an Exception, so no handler eats it)."""


def _alarm(signum, frame):
    raise _Hang()


def run_one(argv: list[str], limit_s: float, tally: Tally, label: str) -> None:
    """One CLI run with stdout and stderr captured, classified into `tally`."""
    from relax_straggler.cli import main

    out, err = io.StringIO(), io.StringIO()
    tally.inputs += 1
    t0 = time.perf_counter()
    signal.setitimer(signal.ITIMER_REAL, limit_s)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    except _Hang:
        tally.hangs.append(label)
        return
    except BaseException as exc:  # noqa: BLE001 - anything escaping is a crash
        tally.crashes.append(f"{label}: {type(exc).__name__}: {str(exc)[:200]}")
        return
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        tally.slowest_s = max(tally.slowest_s, time.perf_counter() - t0)
    try:
        json.loads(out.getvalue())
        has_json = True
    except ValueError:
        has_json = False
    if code in (0, 1) and has_json:  # analyze exits 1 with its summary when nothing can be concluded
        tally.results += 1
    elif code == 0:
        tally.lost.append(label)
    elif code == 1 and err.getvalue().strip():
        tally.errors += 1
    else:
        tally.crashes.append(f"{label}: exit {code}: {err.getvalue()[-300:]}")


def fuzz(inputs: int, seed: int = 1, limit_s: float = 2.0, names: tuple[str, ...] = ()) -> dict[str, Tally]:
    """`inputs` mutants per seed input (all seeds unless `names`), each through analyze and,
    for per-op inputs, whatif. Returns the tally per seed."""
    import logging

    logging.disable(logging.WARNING)  # every problem is logged; the counts are what matters here
    old = signal.signal(signal.SIGALRM, _alarm)
    tallies: dict[str, Tally] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name, (suffix, data) in seeds().items():
                if names and name not in names:
                    continue
                rng = random.Random(f"{seed}-{name}")
                tally = tallies.setdefault(name, Tally())
                mutate = mutate_parquet if suffix == ".parquet" else mutate_text
                path = os.path.join(tmp, f"mutant-{name.split('.')[0]}{suffix}")
                for i in range(inputs):
                    with open(path, "wb") as f:
                        f.write(mutate(data, rng))
                    label = f"{name} #{i}"
                    if name != "ops.jsonl":
                        run_one(["analyze", path, "--no-progress", "--format", "json"], limit_s, tally, label)
                    if name in ("trace-syn.parquet", "timeline-small.json", "ops.jsonl"):
                        run_one(["whatif", path, "--format", "json", "--no-by-worker", "--threads", "1"], limit_s,
                                tally, label + " whatif")
    finally:
        signal.signal(signal.SIGALRM, old)
        logging.disable(logging.NOTSET)
    return tallies


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--inputs", type=int, default=1000, help="mutants per seed input")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--limit", type=float, default=2.0, help="seconds one run may take")
    args = p.parse_args()
    t0 = time.perf_counter()
    tallies = fuzz(args.inputs, args.seed, args.limit)
    bad = 0
    for name, t in tallies.items():
        print(f"{name:22s} runs {t.inputs:6d}  results {t.results:6d}  errors {t.errors:6d}  crashes "
              f"{len(t.crashes)}  hangs {len(t.hangs)}  lost {len(t.lost)}  slowest {t.slowest_s:.2f} s")
        for line in (t.crashes + t.hangs + t.lost)[:5]:
            print("   ", line)
        bad += len(t.crashes) + len(t.hangs) + len(t.lost)
    print(f"total {sum(t.inputs for t in tallies.values())} runs in {time.perf_counter() - t0:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
