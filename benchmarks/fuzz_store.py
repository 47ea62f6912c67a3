"""Mutation fuzz of the embedded file store (relax_straggler/stores/file.py) and the
monitor's state journal (relax_straggler/monitor/state.py): damaged frames, index lines
and journal lines.

    .venv/bin/python benchmarks/fuzz_store.py --mutants 10000 [--seed 1] [--limit 10]

Seeds, written by the store and the monitor themselves:
  one-job     one job, 16 writes of one iteration (8 ranks, 2 timers: 16 rows each)
  segments    one job, 24 writes; segments are closed past 6,000 bytes instead of 64 MiB
              (stores.file.SEGMENT_BYTES, lowered in this process only), so the seed has
              several segments, as a long job has
  jobs        three jobs, one with an id too long for a file name (a digest-named
              directory), writes of 1 to 3 iterations
  journal     the state journal of a monitor with 8 registered jobs (layouts, two polls
              that saw iterations: "seen" lines, one unregistration), left as by kill -9
Each mutant applies 1 to 3 mutations to one or two files of its seed: byte flips, a range
zeroed, truncation (anywhere, or at a line), bytes or a torn frame appended, lines
duplicated, deleted or swapped, a hostile line inserted (nested 100,000 deep, a len of
10^12, a seg out of range, a missing segment, hostile numbers), the file removed.

A store mutant is read by a reader that had read the seed before the damage (as a
running monitor has) and by a fresh one (jobs, iterations, table, job_problems); then
three writers (FileStore instances of their own, as three processes) each write one new
iteration; then a fresh reader reads every job back. A journal mutant is the state file
a monitor starts over. Counted per seed:

  crash    an exception other than StoreError from the store; from the monitor's start,
           anything but a result or a ValueError naming the state file
  hang     a mutant past --limit s
  lost     an acknowledged row not read back: a row of the three new writes, or a seed
           row whose frame bytes and index line the mutation left whole; for the
           journal, a registered job whose lines are all whole (once each, in order)
           that the monitor which started does not have as registered
  wrong    a row read back twice, or one never written
  silent   seed rows not read back while no store reported a problem
Peak memory: the process's maximum resident set (ru_maxrss). docs/RELIABILITY.md has the
figures of a long run; tests/python/test_store_fuzz.py runs a few hundred in CI.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import resource
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

T0 = 1_800_000_000.0
RANKS = 8
TIMERS = ("interval-time", "forward-compute")
SMALL_SEGMENT_BYTES = 6000
LONG_JOB = "a" + ":" * 127  # percent-encodes past a file name's 255 bytes
NEW_ITERATION = 1000  # the new writes' iterations: 1000, 1001, 1002
DEEP = b"[" * 100_000 + b"]" * 100_000
HOSTILE_INDEX_LINES = [
    DEEP,
    b'{"seg":1,"off":0,"len":1000000000000,"rows":8,"its":[[9,1.0,0,0,8]]}',
    b'{"seg":0,"off":0,"len":100,"rows":8,"its":[[9,1.0,0,0,8]]}',
    b'{"seg":1e300,"off":0,"len":100,"rows":8,"its":[[9,1.0,0,0,8]]}',
    b'{"seg":' + b"9" * 5000 + b',"off":0,"len":100,"rows":8,"its":[[9,1.0,0,0,8]]}',
    b'{"seg":77,"off":0,"len":100,"rows":8,"its":[[9,1.0,0,0,8]]}',
    b'{"seg":1,"off":-3,"len":100,"rows":8,"its":[[9,1.0,0,0,8]]}',
    b'{"seg":1,"off":0,"len":100,"rows":8,"its":"' + b"x" * 100_000 + b'"}',
    b'{"seg":1,"off":0,"len":100,"rows":8,"its":[[9,1.0,0,0,8]],"crc":1}',
    b"null", b"{}", b"\xff\xfe\xfd", b"",
]
HOSTILE_NUMBERS = [b"1" + b"0" * 30, b"9" * 5001, b"1e400", b"-1", b"NaN", b"Infinity", b"2.5", b'"7"', b"null",
                   b"true", b"[]", b"{}", DEEP]


class _Hang(BaseException):
    """Raised by the alarm: a mutant past the limit (not an Exception: no handler eats it)."""


def _alarm(signum, frame):
    raise _Hang()


# --- seeds ------------------------------------------------------------------------------

@dataclass
class Frame:
    """One frame of a seed store: its segment and index (paths relative to the store),
    its byte range, its index line and the rows in it."""

    segment: str
    index: str
    off: int
    length: int
    line: bytes
    keys: list


@dataclass
class StoreSeed:
    name: str
    files: dict  # path relative to the store -> bytes
    truth: dict  # (job, iteration, rank, timer) -> value
    frames: list
    jobs: list
    segment_bytes: int


@dataclass
class JournalSeed:
    name: str
    store_url: str  # the store the journal names (the seed's, left in place)
    journal: bytes
    registered: dict  # job -> registered_at, of the jobs registered at the end
    job_lines: dict  # job -> its lines, in order


def _rows(job: str, iterations) -> list:
    from relax_straggler.stores.base import Sample

    return [Sample(T0 + it, job, timer, r, it, (100.0 + r + it / 1000 + k,))
            for it in iterations for r in range(RANKS) for k, timer in enumerate(TIMERS)]


def _key(sample) -> tuple:
    return sample.job, sample.iteration, sample.rank, sample.metric_name


def _read_tree(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _write_tree(root: Path, files: dict) -> None:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


@contextlib.contextmanager
def _segment_bytes(n: int):
    from relax_straggler.stores import file as file_module

    saved = file_module.SEGMENT_BYTES
    file_module.SEGMENT_BYTES = n
    try:
        yield
    finally:
        file_module.SEGMENT_BYTES = saved


def store_seed(name: str, work: Path, rng: random.Random) -> StoreSeed:
    """One of the store seeds of the module docstring, written by FileStore."""
    from relax_straggler.stores.file import FileStore, _job_dir_name

    layout = {"one-job": (["train-1"], 16, 1), "segments": (["train-1"], 24, 1),
              "jobs": (["train-1", "train-2", LONG_JOB], 8, 3)}[name]
    jobs, writes, widest = layout
    segment_bytes = SMALL_SEGMENT_BYTES if name == "segments" else 64 << 20
    root = work / f"seed-{name}"
    truth, per_job_writes = {}, {job: [] for job in jobs}
    next_it = {job: 0 for job in jobs}
    with _segment_bytes(segment_bytes):
        store = FileStore(str(root))
        for _ in range(writes):
            batch = []
            for job in jobs:
                its = list(range(next_it[job], next_it[job] + rng.randint(1, widest)))
                next_it[job] = its[-1] + 1
                rows = _rows(job, its)
                batch += rows
                per_job_writes[job].append([_key(r) for r in rows])
                truth.update({_key(r): r.values[0] for r in rows})
            store.write(batch)  # one frame per job
        store.close()
    files = _read_tree(root)
    frames = []
    for job in jobs:
        index = f"jobs/{_job_dir_name(job)}/index.jsonl"
        lines = files[index].split(b"\n")[:-1]
        assert len(lines) == len(per_job_writes[job])
        for line, keys in zip(lines, per_job_writes[job]):
            entry = json.loads(line)
            frames.append(Frame(f"jobs/{_job_dir_name(job)}/seg-{entry['seg']:06d}.arrows", index, entry["off"],
                                entry["len"], line, keys))
    return StoreSeed(name, files, truth, frames, jobs, segment_bytes)


def journal_seed(work: Path) -> JournalSeed:
    """The journal seed of the module docstring, written by the monitor."""
    from relax_straggler.common.topology import Topology
    from relax_straggler.monitor.service import Monitor, MonitorConfig
    from relax_straggler.stores.file import FileStore

    root = work / "seed-journal"
    now = [T0 - 100.0]
    config = MonitorConfig(f"file://{root}/store", state_path=str(root / "state.json"), check_interval_s=1.0)
    monitor = Monitor(config, clock=lambda: now[0])
    jobs = [f"train-{k}" for k in range(8)]
    for k, job in enumerate(jobs):
        monitor.register(job, Topology(dp=4, pp=2, ranks_per_node=4) if k % 2 else None)
        now[0] += 1.0
    store = FileStore(str(root / "store"))
    for first in (0, 6):
        for job in jobs[:6]:
            store.write(_rows(job, range(first, first + 6)))
        now[0] += 5.0
        monitor.poll_once()
    store.close()
    monitor.unregister(jobs[7])
    monitor._pool.shutdown(wait=True)  # left as a kill -9 would: no compaction
    monitor._journal.close()
    journal = (root / "state.json").read_bytes()
    job_lines: dict = {}
    for line in journal.split(b"\n")[1:-1]:
        job_lines.setdefault(json.loads(line)["job"], []).append(line)
    registered = {job: monitor._jobs[job].registered_at for job in jobs[:7]}
    return JournalSeed("journal", config.store_url, journal, registered, job_lines)


# --- mutations --------------------------------------------------------------------------

def _lines_op(data: bytes, rng: random.Random, op: str) -> bytes:
    lines = data.split(b"\n")
    if len(lines) < 2:
        return data
    j = rng.randrange(len(lines) - 1)
    if op == "duplicate":
        lines[j:j] = [lines[j]] * rng.randint(1, 2)
    elif op == "delete":
        del lines[j:j + rng.randint(1, 2)]
    else:
        k = rng.randrange(len(lines) - 1)
        lines[j], lines[k] = lines[k], lines[j]
    return b"\n".join(lines)


_BYTE_OPS = ("flip", "zero", "truncate")


def _byte_op(b: bytearray, rng: random.Random, op: str, longest_zero: int) -> bytearray:
    """The mutations of any file: bytes flipped, a range zeroed, the file cut anywhere
    (flip and zero of a non-empty file)."""
    if op == "flip":
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
    elif op == "zero":
        i = rng.randrange(len(b))
        n = min(len(b) - i, rng.randint(1, longest_zero))
        b[i:i + n] = bytes(n)
    elif op == "truncate":
        b = b[:rng.randrange(len(b) + 1)]
    return b


def mutate_text(data: bytes, rng: random.Random, hostile_lines: list) -> tuple[bytes, str]:
    """One mutation of an index or journal; returns (bytes, its name)."""
    b = bytearray(data)
    op = rng.choice(("flip", "zero", "truncate", "truncate-line", "append", "duplicate", "delete", "swap",
                     "hostile-line", "hostile-number"))
    if op in _BYTE_OPS and (b or op == "truncate"):
        b = _byte_op(b, rng, op, longest_zero=200)
    elif op == "truncate-line":
        ends = [i + 1 for i, c in enumerate(b) if c == 10]
        b = b[:rng.choice(ends)] if ends else b
    elif op == "append":
        b += bytes(rng.randrange(256) for _ in range(rng.randint(1, 100))) + (b"\n" if rng.random() < 0.5 else b"")
    elif op in ("duplicate", "delete", "swap"):
        b = bytearray(_lines_op(bytes(b), rng, op))
    elif op == "hostile-line":
        lines = bytes(b).split(b"\n")
        lines.insert(rng.randrange(len(lines)), rng.choice(hostile_lines))
        b = bytearray(b"\n".join(lines))
    else:  # a number replaced by a hostile value
        starts = [k for k in range(len(b)) if 48 <= b[k] <= 57 and (k == 0 or not 48 <= b[k - 1] <= 57)]
        if starts:
            k = rng.choice(starts)
            end = k
            while end < len(b) and (48 <= b[end] <= 57 or b[end] in b".eE+-"):
                end += 1
            b[k:end] = rng.choice(HOSTILE_NUMBERS)
    return bytes(b), op


def mutate_segment(data: bytes, rng: random.Random, frame_starts: list) -> tuple[bytes, str]:
    """One mutation of a segment; returns (bytes, its name)."""
    b = bytearray(data)
    op = rng.choice(("flip", "zero", "truncate", "truncate-frame", "append", "torn-frame"))
    if op in _BYTE_OPS and (b or op == "truncate"):
        b = _byte_op(b, rng, op, longest_zero=500)
    elif op == "truncate-frame" and frame_starts:
        b = b[:rng.choice(frame_starts)]
    elif op == "append":
        b += bytes(rng.randrange(256) for _ in range(rng.randint(1, 3000)))
    else:  # the head of a frame, as a writer killed mid-write leaves it
        b += b"RSF1" + rng.randrange(1, 1 << 20).to_bytes(4, "little") + bytes(rng.randint(4, 200))
    return bytes(b), op


def mutate_store(seed: StoreSeed, rng: random.Random) -> tuple[dict, list]:
    """A mutant of a store seed: 1 to 3 mutations of one or two of its segments and
    indexes (3 %: a file removed)."""
    files = dict(seed.files)
    segments = [p for p in files if p.endswith(".arrows")]
    indexes = [p for p in files if p.endswith("index.jsonl")]
    kind = rng.random()
    targets = [rng.choice(segments)] if kind < 0.4 else [rng.choice(indexes)] if kind < 0.8 else \
        [rng.choice(segments), rng.choice(indexes)]
    done = []
    for path in targets:
        if rng.random() < 0.03:
            del files[path]
            done.append(f"{path}: removed")
            continue
        for _ in range(rng.randint(1, 3)):
            if path.endswith(".arrows"):
                starts = [f.off for f in seed.frames if f.segment == path]
                files[path], op = mutate_segment(files[path], rng, starts)
            else:
                files[path], op = mutate_text(files[path], rng, HOSTILE_INDEX_LINES)
            done.append(f"{path}: {op}")
    return files, done


# --- checks -----------------------------------------------------------------------------

@dataclass
class Tally:
    mutants: int = 0
    crashes: list = field(default_factory=list)
    hangs: list = field(default_factory=list)
    lost: list = field(default_factory=list)
    wrong: list = field(default_factory=list)
    silent: list = field(default_factory=list)
    outcomes: Counter = field(default_factory=Counter)  # what happened, counted (not defects)
    slowest_s: float = 0.0


def _read_all(store, jobs: list) -> list:
    """Every row of `jobs` (and of any other job the store lists) through the reading API."""
    out = []
    for job in sorted(set(jobs) | set(store.jobs())):
        store.iterations(job)
        store.iterations(job, after_iteration=3)
        t = store.table(job, 0, 10**6).to_pydict()
        out += [(j, it, rank, timer, values[0]) for j, it, rank, timer, values in
                zip(t["job"], t["iteration"], t["rank"], t["metric_name"], t["metric_values"])]
        store.job_problems(job)
    return out


def intact_keys(seed: StoreSeed, files: dict) -> set:
    """The seed rows whose frame bytes and index line are in `files` unchanged."""
    keys = set()
    lines_of = {p: set(files[p].split(b"\n")) for p in {f.index for f in seed.frames} if p in files}
    for f in seed.frames:
        segment = files.get(f.segment)
        if segment is None or f.index not in lines_of or f.line not in lines_of[f.index]:
            continue
        if segment[f.off:f.off + f.length] == seed.files[f.segment][f.off:f.off + f.length]:
            keys.update(f.keys)
    return keys


def check_store(seed: StoreSeed, files: dict, work: Path, tally: Tally, label: str) -> None:
    """Reads, writes and reads back one store mutant (see the module docstring)."""
    from relax_straggler.stores.base import StoreError
    from relax_straggler.stores.file import FileStore

    root = work / "mutant"
    shutil.rmtree(root, ignore_errors=True)
    _write_tree(root, seed.files)
    stores = []
    stage = "reading"
    try:
        with _segment_bytes(seed.segment_bytes):
            warm = FileStore(str(root))
            stores.append(warm)
            _read_all(warm, seed.jobs)  # a monitor that had read the job before the damage
            for rel in seed.files:
                if rel not in files:
                    os.remove(root / rel)
                elif files[rel] != seed.files[rel]:
                    (root / rel).write_bytes(files[rel])
            try:
                _read_all(warm, seed.jobs)
                fresh = FileStore(str(root))
                stores.append(fresh)
                _read_all(fresh, seed.jobs)
            except StoreError:
                tally.outcomes["read refused (StoreError)"] += 1
            stage = "writing"
            acked = {}
            for k in range(3):
                job = seed.jobs[k % len(seed.jobs)]
                rows = _rows(job, [NEW_ITERATION + k])
                writer = FileStore(str(root))
                stores.append(writer)
                try:
                    writer.write(rows)
                except StoreError:
                    tally.outcomes["write refused (StoreError)"] += 1
                    continue
                acked.update({_key(r): r.values[0] for r in rows})
            stage = "reading back"
            final = FileStore(str(root))
            stores.append(final)
            read = _read_all(final, seed.jobs)
    except _Hang:
        raise
    except Exception as exc:  # noqa: BLE001 - anything else escaping the store is a crash
        tally.crashes.append(f"{label}: {stage}: {type(exc).__name__}: {str(exc)[:200]}")
        return
    finally:
        for s in stores:
            s.close()
    counts = Counter((job, it, rank, timer) for job, it, rank, timer, _ in read)
    known = {**seed.truth, **acked}
    wrong = [r for r in read if known.get(r[:4]) != r[4]] + [k for k, n in counts.items() if n > 1]
    if wrong:
        tally.wrong.append(f"{label}: {len(wrong)} rows, e.g. {wrong[0]}")
    lost = (intact_keys(seed, files) | set(acked)) - set(counts)
    if lost:
        tally.lost.append(f"{label}: {len(lost)} rows, e.g. {sorted(lost)[0]}")
    missing = set(seed.truth) - set(counts)
    if missing:
        tally.outcomes["damage cost seed rows (reported)"] += 1
        if not any(s.problems for s in stores):
            tally.silent.append(f"{label}: {len(missing)} rows")
    else:
        tally.outcomes["every seed row read back"] += 1


def check_journal(seed: JournalSeed, journal: bytes, work: Path, tally: Tally, label: str) -> None:
    """Starts a monitor over one journal mutant (see the module docstring)."""
    from relax_straggler.monitor.service import Monitor, MonitorConfig

    state = work / "mutant-state.json"
    state.write_bytes(journal)
    monitor = None
    try:
        monitor = Monitor(MonitorConfig(seed.store_url, state_path=str(state), check_interval_s=1.0),
                          clock=lambda: T0)
        loaded = {job: monitor.view(job)["registered_at"] for job in monitor.job_ids()}
    except _Hang:
        raise
    except ValueError as exc:
        if str(exc).startswith(f"state file {state}"):
            tally.outcomes["start refused, naming the file"] += 1
        else:
            tally.crashes.append(f"{label}: ValueError not naming the state file: {str(exc)[:200]}")
        return
    except Exception as exc:  # noqa: BLE001
        tally.crashes.append(f"{label}: {type(exc).__name__}: {str(exc)[:200]}")
        return
    finally:
        if monitor is not None:
            monitor.stop()
    tally.outcomes["started"] += 1
    # What follows the last newline is a write cut off before it was acknowledged (each
    # journal write is its lines with their newlines, whole or absent): not a loss when dropped.
    lines = journal.split(b"\n")[:-1]
    for job, registered_at in seed.registered.items():
        positions = [lines.index(line) if lines.count(line) == 1 else -1 for line in seed.job_lines[job]]
        if -1 in positions or positions != sorted(positions):
            continue  # a line of this job damaged, repeated or moved
        if loaded.get(job) != registered_at:
            tally.lost.append(f"{label}: job {job}")


# --- the run ----------------------------------------------------------------------------

def fuzz(mutants: int, seed: int = 1, limit_s: float = 10.0, names=None) -> dict:
    """Runs about `mutants` mutants, split evenly over the seeds (or those in `names`);
    returns {seed name: Tally}."""
    import logging

    logger = logging.getLogger("relax_straggler")
    level = logger.level
    logger.setLevel(logging.CRITICAL)  # every damage is logged: thousands of lines
    rng = random.Random(seed)
    work = Path(tempfile.mkdtemp(prefix="fuzz-store-"))
    previous = signal.signal(signal.SIGALRM, _alarm)
    tallies = {}
    try:
        seeds = [store_seed(n, work, rng) for n in ("one-job", "segments", "jobs")] + [journal_seed(work)]
        seeds = [s for s in seeds if names is None or s.name in names]
        for s in seeds:
            tally = tallies[s.name] = Tally()
            for k in range(-(-mutants // len(seeds))):
                label = f"{s.name} #{k}"
                if isinstance(s, StoreSeed):
                    files, done = mutate_store(s, rng)
                else:
                    journal, op = s.journal, []
                    for _ in range(rng.randint(1, 3)):
                        journal, name = mutate_text(journal, rng, [DEEP, b'{"job":"x","seen":[1]}', b"{}", b"[]"])
                        op.append(name)
                    done = op
                label += f" ({'; '.join(done)})"
                tally.mutants += 1
                started = time.perf_counter()
                signal.setitimer(signal.ITIMER_REAL, limit_s)
                try:
                    if isinstance(s, StoreSeed):
                        check_store(s, files, work, tally, label)
                    else:
                        check_journal(s, journal, work, tally, label)
                except _Hang:
                    tally.hangs.append(label)
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                    tally.slowest_s = max(tally.slowest_s, time.perf_counter() - started)
    finally:
        signal.signal(signal.SIGALRM, previous)
        logger.setLevel(level)  # in a test run, the tests after this one log as before
        shutil.rmtree(work, ignore_errors=True)
    return tallies


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mutants", type=int, default=1000, help="mutants in all, split evenly over the 4 seeds")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--limit", type=float, default=10.0, help="seconds one mutant may take")
    args = p.parse_args()
    started = time.perf_counter()
    tallies = fuzz(args.mutants, args.seed, args.limit)
    bad = 0
    for name, t in tallies.items():
        defects = t.crashes + t.hangs + t.lost + t.wrong + t.silent
        bad += len(defects)
        print(f"{name:9s} mutants {t.mutants:6d}  crashes {len(t.crashes)}  hangs {len(t.hangs)}  lost {len(t.lost)}"
              f"  wrong {len(t.wrong)}  silent {len(t.silent)}  slowest {t.slowest_s:.2f} s")
        print("          " + ", ".join(f"{what}: {n}" for what, n in sorted(t.outcomes.items())))
        for line in defects[:5]:
            print("   ", line)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"total {sum(t.mutants for t in tallies.values())} mutants in {time.perf_counter() - started:.0f} s, "
          f"peak memory {peak:.0f} MiB")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
