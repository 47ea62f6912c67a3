"""The feed (``relax-straggler feed``, formerly ``replay``): writes a recorded or synthetic
job into a store under a new job id, iteration by iteration, with fresh timestamps, at a
chosen speed, as a live job would, for the monitor's demos and tests.

Steps (readers.base.StepTimes, ms) become megatron_metrics rows, one per (rank, timer),
each stage under relax_straggler.common.megatron_timers.stage_timer_name:

    forward -> forward-compute       backward -> backward-compute     optimizer -> optimizer
    data -> batch-generator          communication -> all-grads-sync
    communication/allreduce -> grads-all-reduce
    communication/reduce_scatter -> grads-reduce-scatter
    communication/allgather -> params-all-gather
    p2p columns -> forward-send / forward-recv / backward-send / backward-recv
    interval-time = the step's measured time, or (when the input has none, e.g.
                    straggler.jsonl) the slowest rank's sum of stages

    other stages -> straggler/<stage> (attention, moe, communication/broadcast|alltoall,
                    and communication/send|recv when the step has no p2p columns), as the
                    live sink writes them

Nodes are named node-<rank // ranks_per_node>.

At its end a feed writes the end-of-run row (relax_straggler.stores.end_rows, reason
"replay") unless the job has one at its last iteration already, so the monitor shows the job
finished rather than hanging; end_of_run=False (--no-end) leaves it out, as a job that
crashed would.

Idempotent: an iteration the job already has in the store (rows of STEP_METRIC) is skipped,
so feeding the same input into the same job again writes nothing and an interrupted
feed resumes where it stopped, never duplicating a row.

An injected delay (RANK:STAGE:MS:FROM_ITER) adds MS to that rank's stage from iteration
FROM_ITER on, and, as synchronous training waits for it, MS to every other rank's
data-parallel all-reduce (where the step has one) and to every rank's interval-time.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from relax_straggler.common.megatron_timers import stage_timer_name, timer_meaning
from relax_straggler.common.stages import STAGE_IDS, STAGES
from relax_straggler.readers.base import P2P_OPS, InputError, MinMaxStep, StepTimes
from relax_straggler.stores import end_rows
from relax_straggler.stores.base import SAMPLE_SCHEMA, STEP_METRIC, Store

_ALLREDUCE = STAGE_IDS["communication/allreduce"]
_TIMER_COLUMNS = [(STAGE_IDS[s], stage_timer_name(s)) for s in STAGES]
_P2P_STAGES = (STAGE_IDS["communication/send"], STAGE_IDS["communication/recv"])  # carried by the p2p columns


@dataclass(frozen=True)
class Injection:
    """A delay of `ms` on `rank`'s stage (STAGES index) from iteration `from_iteration` on."""

    rank: int
    stage: int
    ms: float
    from_iteration: int

    @staticmethod
    def parse(text: str) -> "Injection":
        """RANK:STAGE:MS:FROM_ITER; STAGE a stage name (forward) or a Megatron timer name
        (forward-compute). Raises ValueError naming the part that is wrong."""
        parts = text.split(":")
        if len(parts) != 4:
            raise ValueError(f"--inject-delay {text!r}: expected RANK:STAGE:MS:FROM_ITER, e.g. 5:forward:80:40")
        rank, stage, ms, first = parts
        if stage in STAGE_IDS:
            column = STAGE_IDS[stage]
        else:
            meaning = timer_meaning(stage)
            # A part-of timer (optimizer-*) names only a piece of its stage: not a stage to delay.
            if meaning is None or meaning.stage is None or meaning.part_of is not None:
                raise ValueError(f"--inject-delay {text!r}: {stage!r} is neither a stage ({', '.join(STAGES)}) nor "
                                 "a Megatron timer name of one")
            column = STAGE_IDS[meaning.stage]
        try:
            inj = Injection(int(rank), column, float(ms), int(first))
        except ValueError:
            raise ValueError(f"--inject-delay {text!r}: RANK and FROM_ITER must be integers, MS a number") from None
        if inj.rank < 0 or inj.from_iteration < 0 or not (math.isfinite(inj.ms) and inj.ms > 0):
            raise ValueError(f"--inject-delay {text!r}: RANK, FROM_ITER must be >= 0 and MS > 0")
        return inj


@dataclass(frozen=True)
class Synthetic:
    """A generated data-parallel job: `ranks` ranks, `iterations` iterations of about
    `step_ms` ms (forward 30 %, backward 50 %, optimizer 5 %, the rest all-reduce), noise
    `noise` (relative, normal), fixed `seed`."""

    ranks: int = 16
    iterations: int = 100
    step_ms: float = 1000.0
    noise: float = 0.01
    seed: int = 0

    @staticmethod
    def parse(text: str) -> "Synthetic":
        """KEY=VALUE[,KEY=VALUE...] over the fields. Raises ValueError naming the key."""
        kwargs: dict = {}
        types = {"ranks": int, "iterations": int, "step_ms": float, "noise": float, "seed": int}
        for part in filter(None, text.split(",")):
            key, sep, value = part.partition("=")
            if not sep or key not in types:
                raise ValueError(f"--synthetic {text!r}: {part!r} is not KEY=VALUE with KEY in {', '.join(types)}")
            try:
                kwargs[key] = types[key](value)
            except ValueError:
                raise ValueError(f"--synthetic {text!r}: {key} must be {types[key].__name__}, got {value!r}") from None
        spec = Synthetic(**kwargs)
        if spec.ranks < 2 or spec.iterations < 1 or not spec.step_ms > 0 or spec.noise < 0:
            raise ValueError(f"--synthetic {text!r}: need ranks >= 2, iterations >= 1, step_ms > 0, noise >= 0")
        return spec

    def steps(self) -> Iterator[StepTimes]:
        """The job's steps: each rank's all-reduce waits for the slowest rank's compute."""
        rng = np.random.default_rng(self.seed)
        ranks = np.arange(self.ranks, dtype=np.int64)
        shares = {"forward": 0.30, "backward": 0.50, "optimizer": 0.05}
        allreduce = 0.15 * self.step_ms
        for it in range(self.iterations):
            ms = np.full((self.ranks, len(STAGES)), np.nan)
            for stage, share in shares.items():
                ms[:, STAGE_IDS[stage]] = share * self.step_ms * (1 + self.noise * rng.standard_normal(self.ranks))
            yield _with_allreduce(it, ranks, np.abs(ms), allreduce)


def _with_allreduce(it: int, ranks: np.ndarray, ms: np.ndarray, allreduce_ms: float) -> StepTimes:
    compute = np.nansum(ms, axis=1)
    ms[:, STAGE_IDS["communication/allreduce"]] = allreduce_ms + (compute.max() - compute)
    return StepTimes(step=it, ranks=ranks, ms=ms, step_ms=float(compute.max() + allreduce_ms))


def recorded_steps(path: str) -> Iterator[StepTimes]:
    """The per-rank steps of a recorded job (any format of relax_straggler.readers).
    Raises InputError for min/max-only input (no per-rank times to feed) or unreadable input."""
    from relax_straggler.readers import open_source

    for step in open_source(path).steps():
        if isinstance(step, MinMaxStep):
            raise InputError(f"{path}: min/max-only timer blocks have no per-rank times to replay")
        yield step


def inject(step: StepTimes, injections: Sequence[Injection]) -> StepTimes:
    """`step` with the delays that apply to it (see the module docstring)."""
    active = [i for i in injections if step.step >= i.from_iteration]
    if not active:
        return step
    ms = step.ms.copy()
    extra = 0.0
    for i in active:
        rows = np.flatnonzero(step.ranks == i.rank)
        if rows.size == 0:
            raise ValueError(f"--inject-delay: rank {i.rank} is not in iteration {step.step} "
                             f"(ranks {int(step.ranks.min())}..{int(step.ranks.max())})")
        ms[rows, i.stage] = np.nan_to_num(ms[rows, i.stage]) + i.ms
        others = step.ranks != i.rank
        ms[others, _ALLREDUCE] += i.ms  # NaN (no all-reduce) stays NaN
        extra += i.ms
    step_ms = step.step_ms + extra if math.isfinite(step.step_ms) else math.nan
    return StepTimes(step=step.step, ranks=step.ranks, ms=ms, p2p_ms=step.p2p_ms, step_ms=step_ms,
                     tokens=step.tokens)


def step_duration_ms(step: StepTimes) -> float:
    """The step's measured time, else the slowest rank's sum of stages, ms."""
    if math.isfinite(step.step_ms):
        return float(step.step_ms)
    return float(np.nanmax(np.nansum(step.ms, axis=1)))


def step_table(job: str, step: StepTimes, timestamp: float, ranks_per_node: int, cluster: str = "") -> pa.Table:
    """The megatron_metrics rows of one step as a SAMPLE_SCHEMA table (see the module
    docstring for the timer names), all stamped `timestamp` (s)."""
    names: list[np.ndarray] = []
    ranks: list[np.ndarray] = []
    values: list[np.ndarray] = []
    for column, timer in _TIMER_COLUMNS:
        if step.p2p_ms is not None and column in _P2P_STAGES:
            continue
        have = np.isfinite(step.ms[:, column])
        if have.any():
            names.append(np.full(int(have.sum()), timer, dtype=object))
            ranks.append(step.ranks[have])
            values.append(step.ms[have, column])
    if step.p2p_ms is not None:
        for j, op in enumerate(P2P_OPS):
            have = np.isfinite(step.p2p_ms[:, j])
            if have.any():
                names.append(np.full(int(have.sum()), op, dtype=object))
                ranks.append(step.ranks[have])
                values.append(step.p2p_ms[have, j])
    total = step.step_ms if math.isfinite(step.step_ms) else step_duration_ms(step)
    names.append(np.full(step.ranks.size, STEP_METRIC, dtype=object))
    ranks.append(step.ranks)
    values.append(np.full(step.ranks.size, total))
    rank = np.concatenate(ranks).astype(np.int32)
    flat = np.concatenate(values).astype(np.float64)
    n = rank.size
    node_ids = rank // ranks_per_node
    node_names = np.array([f"node-{i}" for i in range(int(node_ids.max()) + 1)], dtype=object)
    return pa.table({
        "timestamp": pa.array(np.full(n, timestamp)),
        "job": pa.array(np.full(n, job, dtype=object), pa.string()),
        "metric_name": pa.array(np.concatenate(names), pa.string()),
        "subname": pa.array(np.full(n, "", dtype=object), pa.string()),
        "rank": pa.array(rank),
        "iteration": pa.array(np.full(n, step.step, dtype=np.int64)),
        "node": pa.array(node_names[node_ids], pa.string()),
        "cluster": pa.array(np.full(n, cluster, dtype=object), pa.string()),
        "metric_values": pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32)), pa.array(flat)),
    }, schema=SAMPLE_SCHEMA)


@dataclass
class FeedStats:
    """iterations and rows written; skipped: iterations the job had in the store already;
    ended: the end-of-run row was written; seconds: wall time."""

    iterations: int = 0
    rows: int = 0
    skipped: int = 0
    ended: bool = False
    seconds: float = 0.0


def feed(steps: Iterable[StepTimes], store: Store, job: str, speed: float = 1.0,
         injections: Sequence[Injection] = (), ranks_per_node: int = 8, cluster: str = "",
         clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
         end_of_run: bool = True) -> FeedStats:
    """Writes `steps` into `store` as job `job`, one write per iteration, each iteration
    stamped when it is written and written once its duration / speed has passed since the
    previous one (speed 2 = twice as fast as recorded). Iterations the job has in the store
    already are skipped, without waiting (see the module docstring). end_of_run: write the
    end-of-run row after the last iteration when the job has none there yet. Raises ValueError on a
    bad speed or injection, StoreError when the store fails, InputError from the reader."""
    if not (math.isfinite(speed) and speed > 0):
        raise ValueError(f"--speed must be > 0, got {speed}")
    if ranks_per_node < 1:
        raise ValueError(f"--ranks-per-node must be >= 1, got {ranks_per_node}")
    stats = FeedStats()
    present = {it.iteration for it in store.iterations(job)}
    start = due = clock()
    last_step, steps_seen = None, 0
    for step in steps:
        last_step = step.step if last_step is None else max(last_step, step.step)
        steps_seen += 1
        if step.step in present:
            stats.skipped += 1
            continue
        step = inject(step, injections)
        due += step_duration_ms(step) / 1000.0 / speed
        wait = due - clock()
        if wait > 0:
            sleep(wait)
        table = step_table(job, step, clock(), ranks_per_node, cluster)
        store.write_table(table)
        stats.iterations += 1
        stats.rows += table.num_rows
    if end_of_run and last_step is not None:
        ended = [s for s in store.samples(job, last_step, last_step) if s.metric_name == end_rows.END_METRIC]
        if not ended:
            store.write_table(end_rows.end_table(job, last_step, steps_seen, "replay", clock(), "node-0", cluster))
            stats.ended = True
    stats.seconds = clock() - start
    return stats
