"""Megatron-LM training logs with `Timers` output (--timing-log-level >= 1).

The text is scanned by the C++ TimerLogScanner (csrc/core/ingest/timer_log.h: formats,
launcher prefixes, line-numbered problems) in 8 MiB chunks, so a multi-GB log streams in
constant memory. Each block becomes one step, numbered by the iteration line printed
before it; its values are per-iteration averages over the log interval, in ms.

- ``--timing-log-option all`` blocks give per-rank StepTimes.
- ``minmax`` / ``max`` blocks give MinMaxStep: no rank can be named from them
  (docs/ANALYZE.md says what can and cannot be concluded).

The parallel layout comes from Megatron's argument listing in the same log
(tensor/pipeline/context_parallel_size, virtual_pipeline_model_parallel_size,
world_size) unless given by the caller; ranks are numbered in Megatron's default order
(relax_straggler.common.topology), context-parallel ranks being further ranks of their worker.
"""

from __future__ import annotations

import os
from typing import Iterator, Optional

import numpy as np

from relax_straggler._ext import core
from relax_straggler.readers.base import (P2P_OPS, InputError, MinMaxStep, Problems, Step, StepTimes, check_dense,
                                          empty_stage_row)
from relax_straggler.common.stages import STAGES
from relax_straggler.common.topology import MAX_WORLD_SIZE, Topology, make_layout
from relax_straggler.readers.op_trace import OpNames

CHUNK_BYTES = 8 << 20


class MegatronLogReader:
    format = "megatron-log"

    def __init__(self, path: str, problems: Problems, topology: Optional[Topology] = None,
                 meta: Optional[str] = None) -> None:
        if meta is not None:
            raise InputError(f"{path}: --meta applies to trace files; give --dp/--pp/--tp/--dsp for a Megatron log")
        self.path = path
        self.problems = problems
        self._given = topology
        self._topology = topology
        self.total_bytes = os.path.getsize(path)
        self.done_bytes = 0
        self.names = OpNames(problems)
        self.records = 0
        self._world: Optional[int] = None  # without a declared layout: ranks in the first block
        self._blocks = 0  # per-rank blocks so far, each as wide as the world: dense work bounded by
        self._values = 0  # the rank values read (readers/base.py check_dense)

    def topology(self) -> Optional[Topology]:
        return self._topology

    def steps(self) -> Iterator[Step]:
        scanner = core().TimerLogScanner()
        seen: set[tuple[int, str]] = set()
        count = blocks = 0
        with open(self.path, "rb") as f:
            while True:
                chunk = f.read(CHUNK_BYTES)
                if chunk:
                    scanner.feed(chunk)
                    self.done_bytes += len(chunk)
                else:
                    scanner.finish()
                for line, message, rejected in scanner.take_issues():
                    self.problems.report(line, message, "malformed", skipped=rejected)
                self.records = scanner.values + scanner.rejected
                if self._topology is None and scanner.arguments:
                    self._topology = self._from_arguments(scanner.arguments)
                for block in scanner.take_blocks():
                    blocks += 1
                    number = block.iteration if block.iteration >= 0 else count
                    if (number, block.form) in seen:
                        self.problems.report(block.line, f"a second '{block.form}' timer block for iteration "
                                             f"{number}; skipped", "duplicate", skipped=_values(block))
                        continue
                    if block.iteration < 0 and count == 0:
                        self.problems.report(block.line, "no 'iteration N/' line before the first timer block; "
                                             "blocks are numbered in file order", "no_iteration", skipped=0)
                    step = self._convert(block, number)
                    if step is None:
                        continue
                    seen.add((number, block.form))
                    count += 1
                    yield step
                if not chunk:
                    break
        if count == 0 and blocks:
            first = f"; first problem: {self.problems.kept[0]}" if self.problems.kept else ""
            raise InputError(f"{self.path}: {blocks} timer block(s) found, none usable{first}")
        if count == 0:
            what = "empty file" if scanner.lines == 0 else f"{scanner.lines} lines"
            raise InputError(f"{self.path}: no Megatron timer block ('times across ranks (ms):' or "
                             f"'(min, max) time across ranks (ms):') found ({what})")

    def _from_arguments(self, args: dict) -> Optional[Topology]:
        def size(name: str) -> int:
            text = args.get(name, "1")
            value = int(text) if text.isdigit() and len(text) <= 7 else 0
            if not 1 <= value <= MAX_WORLD_SIZE:
                raise InputError(f"{self.path}: argument {name} = {text[:40]!r} is not an integer in "
                                 f"[1, {MAX_WORLD_SIZE:,}]")
            return value

        tp, pp = size("tensor_model_parallel_size"), size("pipeline_model_parallel_size")
        cp = size("context_parallel_size") if args.get("context_parallel_size", "None") != "None" else 1
        vpp = (size("virtual_pipeline_model_parallel_size")
               if args.get("virtual_pipeline_model_parallel_size", "None") != "None" else 1)
        if "world_size" not in args:
            return None
        world = size("world_size")
        if world % (tp * pp * cp):
            raise InputError(f"{self.path}: world_size {world} is not a multiple of tp {tp} x pp {pp} x cp {cp}")
        return make_layout(world // (tp * pp * cp), pp, tp, cp=cp, vpp=vpp)  # world <= MAX_WORLD_SIZE

    def _convert(self, block, step: int) -> Optional[Step]:
        """The step of a timer block numbered `step`, or None when none of its timers is a
        stage (counted) or every value is beyond the ranks a job may have (reported)."""
        if block.form != "all":
            lo, hi = np.full(len(STAGES), np.nan), np.full(len(STAGES), np.nan)
            for t in block.timers:
                target = self.names.resolve(t.name, t.line)
                if target is None:
                    continue
                # Summing min (max) over timers of one stage bounds the stage's min (max) from below (above).
                lo[target.stage] = np.nansum([lo[target.stage], t.min_ms])
                hi[target.stage] = np.nansum([hi[target.stage], t.max_ms])
            if block.form == "max":
                lo[:] = np.nan
            return MinMaxStep(step=step, min_ms=lo, max_ms=hi, step_ms=block.iteration_ms)
        timers = []  # (ranks, ms, target) of the known timers
        for t in block.timers:
            ranks = t.ranks
            target = self.names.resolve(t.name, t.line, max(1, ranks.size))
            if target is not None and ranks.size:
                timers.append((ranks, t.ms, target))
        if not timers:
            return None  # only excluded or unknown timers (counted), or every rank line malformed (reported)
        if self._topology is None and self._world is None:
            # Fixed by the first block; a rank beyond any job's is skipped below, not allocated for.
            self._world = max(int(ranks[ranks < MAX_WORLD_SIZE].max(initial=-1)) for ranks, _, _ in timers) + 1
            if self._world == 0:
                self._world = None
                self.problems.report(block.line, f"every rank value is beyond the {MAX_WORLD_SIZE:,} ranks a job may "
                                     "have; block skipped", "layout", skipped=sum(int(r.size) for r, _, _ in timers))
                return None
        world = self._topology.world_size if self._topology is not None else self._world
        self._blocks += 1
        self._values += sum(int(r.size) for r, _, _ in timers)
        check_dense(self.path, self._blocks, world, self._values, "per-rank timer blocks x the world of "
                    + ("the logged arguments" if self._topology is not None else "the first block's largest rank"))
        outside = sum(int((ranks >= world).sum()) for ranks, _, _ in timers)
        if outside:
            self.problems.report(block.line, f"{outside} rank value(s) at or beyond the world size {world} "
                                 "(from the arguments, or the first block); skipped", "layout", skipped=outside)
            timers = [(ranks[ranks < world], values[ranks < world], target) for ranks, values, target in timers]
        ms = empty_stage_row(world)
        p2p = np.full((world, len(P2P_OPS)), np.nan) if any(x.p2p is not None for _, _, x in timers) else None
        for ranks, values, target in timers:
            _add(ms[:, target.stage], ranks, values)
            if target.p2p is not None:
                _add(p2p[:, target.p2p], ranks, values)
        return StepTimes(step=step, ranks=np.arange(world, dtype=np.int64), ms=ms, p2p_ms=p2p,
                         step_ms=block.iteration_ms)


def _values(block) -> int:
    """The timer values of a block (a rank's time in "all" blocks, one per timer otherwise)."""
    return sum(int(t.ranks.size) for t in block.timers) if block.form == "all" else len(block.timers)


def _add(column: np.ndarray, ranks: np.ndarray, values: np.ndarray) -> None:
    """column[ranks] += values, where NaN (not run yet) counts as 0."""
    column[ranks] = np.where(np.isnan(column[ranks]), 0.0, column[ranks]) + values
