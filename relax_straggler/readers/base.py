"""What every reader produces, and how readers report bad input.

A reader turns one input file into a stream of steps. Two resolutions exist:

- ``StepTimes``: per-rank times of one step, the input of the full analysis;
- ``MinMaxStep``: only the fastest and slowest rank's time per stage (Megatron's default
  ``--timing-log-option minmax``), from which no rank can be named (docs/ANALYZE.md).

Stage columns are always ``relax_straggler.common.stages.STAGES`` (the closed stage set), NaN
where a rank did not run the stage, so every step of every reader has the same columns.
Times are milliseconds per step; readers convert (the what-if parquet traces are in
seconds, Chrome traces in microseconds).

Bad input never raises a traceback at the user: a reader reports each problem with the
file and the 1-based line (text) or row (parquet) through ``Problems``; in strict mode
the first problem raises ``InputError``, otherwise the offending record is skipped and
counted, and every count is part of the analysis output.

Skipped input and the verdict: each problem says how many of the input's records it leaves
out of the analysis (``Problems.skipped``, never more than the source's ``records``, which
count every record read, skipped ones included), and an input that lists its steps apart
from its records (a metrics store's index) says how many of them could not be read whole
(``steps_lost`` of ``steps_listed``). Past MAX_SKIPPED_FRACTION of either the records left
cannot stand for the run: `analyze` answers inconclusive, `whatif` refuses
(``Problems.unusable``).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterator, Optional, Protocol, Union

import numpy as np

from relax_straggler.common.stages import STAGES
from relax_straggler.common.topology import Topology

log = logging.getLogger(__name__)

# Pipeline point-to-point operations, in the column order of StepTimes.p2p_ms (the same
# order as relax_straggler._core.P2P_OPS).
P2P_OPS: tuple[str, ...] = ("forward-send", "forward-recv", "backward-send", "backward-recv")

# How many problems are kept with their message; all are counted.
MAX_KEPT_PROBLEMS = 200
# Past this fraction of skipped records (or lost steps) no verdict is given: what was skipped
# can move a finding's share of the steps (persistent from one half) by up to that fraction,
# and the steps read may no longer be the run's; a tenth is the most an answer can defend.
MAX_SKIPPED_FRACTION = 0.1

# Step numbers are int64 in the engine; ids of microbatches, sequences and model chunks are
# int32 in the what-if records (-1: none).
MAX_STEP = (1 << 63) - 1
MAX_SMALL_ID = (1 << 31) - 1
# Longest time a record may give, s (~3,000 years): beyond it no clock wrote it, and an
# analysis would print it as a 300-digit result, or sum it to inf.
MAX_TIME_S = 1e11
MAX_TIME_MS = MAX_TIME_S * 1e3

# The analysis is dense: every step costs O(world) whatever the input recorded. A few
# corrupt step or rank ids could so turn a small file into hours of work; an input may
# expand to at most this many (step, rank) cells, plus DENSE_CELLS_PER_RECORD per record it
# holds (a recorded run has at least one record per cell).
DENSE_CELLS_FLOOR = 1 << 18
DENSE_CELLS_PER_RECORD = 64


class InputError(Exception):
    """The input cannot be analyzed (or, with --strict, has a problem). str() names file and line."""


@dataclass(frozen=True)
class Problem:
    path: str
    line: int  # 1-based line (text) or row (parquet); 0 = the file as a whole
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}" if self.line > 0 else f"{self.path}: {self.message}"


@dataclass
class Problems:
    """Collects a reader's problems. strict: the first one raises InputError.

    counts: problems by kind; skipped: input records the problems left out of the analysis;
    steps_listed, steps_lost: steps an input lists apart from its records (a metrics store's
    index; 0 for files) and how many of them could not be read whole."""

    path: str
    strict: bool = False
    kept: list[Problem] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)
    skipped: int = 0
    steps_listed: int = 0
    steps_lost: int = 0

    def report(self, line: int, message: str, kind: str = "malformed", skipped: int = 1) -> None:
        """One problem at `line` (0: not a line); skipped: the records it leaves out (0 for a
        problem that drops no record, as an unknown op name whose rows are counted apart).
        Raises InputError in strict mode."""
        problem = Problem(self.path, line, message)
        if self.strict:
            raise InputError(f"{problem} (--strict)")
        self.counts[kind] += 1
        self.skipped += skipped
        if len(self.kept) < MAX_KEPT_PROBLEMS:
            self.kept.append(problem)
            log.warning("%s", problem)
        elif len(self.kept) == MAX_KEPT_PROBLEMS and self.total == MAX_KEPT_PROBLEMS + 1:
            log.warning("%s: more problems; only their counts are kept", self.path)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def unusable(self, records: int) -> Optional[str]:
        """Why the input left after its problems cannot stand for the run, or None: more than
        MAX_SKIPPED_FRACTION of its `records` skipped, or of its listed steps lost."""
        if self.skipped > MAX_SKIPPED_FRACTION * records:
            return f"{self.skipped:,} of {records:,} records were skipped"
        if self.steps_lost > MAX_SKIPPED_FRACTION * self.steps_listed:
            return f"{self.steps_lost:,} of the {self.steps_listed:,} steps the input lists could not be read whole"
        return None

    def facts(self, records: int) -> dict:
        """The JSON-ready account of the problems: total, by_kind, first (20 messages),
        records, records_skipped, steps_listed, steps_lost."""
        return {"total": self.total, "by_kind": dict(self.counts), "first": [str(p) for p in self.kept[:20]],
                "records": records, "records_skipped": self.skipped, "steps_listed": self.steps_listed,
                "steps_lost": self.steps_lost}


def problems_line(facts: dict) -> str:
    """One line of Problems.facts: "3 problems (bad_value 2, unknown_op 1); 2 of 1,200
    records skipped[; 5 of 400 listed steps not read whole]"."""
    kinds = ", ".join(f"{k} {v:,}" for k, v in facts["by_kind"].items())
    line = (f"{facts['total']:,} problem{'s' if facts['total'] != 1 else ''} ({kinds}); "
            f"{facts['records_skipped']:,} of {facts['records']:,} records skipped")
    if facts["steps_lost"]:
        line += f"; {facts['steps_lost']:,} of {facts['steps_listed']:,} listed steps not read whole"
    return line


@dataclass(frozen=True)
class StepTimes:
    """One step, per rank. ranks: (rows,) global rank ids, ascending; ms: (rows, len(STAGES))
    ms per step, NaN = not run; p2p_ms: (rows, 4) ms in P2P_OPS order, NaN = not run, or
    None when the input has no pipeline p2p times; step_ms: measured step time, NaN if unknown.
    tokens: (rows,) workload per rank or None. run_queue_ms: (rows,) ms each rank's training
    thread waited for a CPU in the step (host contention; NaN = not measured), or None when the
    input has none."""

    step: int
    ranks: np.ndarray
    ms: np.ndarray
    p2p_ms: Optional[np.ndarray] = None
    step_ms: float = float("nan")
    tokens: Optional[np.ndarray] = None
    run_queue_ms: Optional[np.ndarray] = None

    stages = STAGES


@dataclass(frozen=True)
class MinMaxStep:
    """One step of a min/max-only log: (len(STAGES),) arrays of the fastest and slowest
    rank's ms, NaN where the stage was not printed. max-only logs leave min_ms NaN."""

    step: int
    min_ms: np.ndarray
    max_ms: np.ndarray
    step_ms: float = float("nan")

    stages = STAGES


Step = Union[StepTimes, MinMaxStep]


class Source(Protocol):
    """An opened input. Readers are constructed with (path, problems, **options) and
    report progress in bytes (total_bytes may be 0 when unknown).

    A new format (for example the ClickHouse ``megatron_metrics`` table) plugs in by
    providing this protocol and an entry in relax_straggler.readers.READERS."""

    path: str
    format: str
    problems: Problems
    total_bytes: int
    done_bytes: int
    records: int  # what was read: parquet rows, trace events, jsonl lines, timer-log rank values

    def topology(self) -> Optional[Topology]:
        """The layout the input declares (beside-file metadata, logged arguments), if any.
        Valid once steps() has been exhausted for logs that declare it as they go."""
        ...

    def steps(self) -> Iterator[Step]:
        """Steps in input order. Raises InputError when nothing usable can be read."""
        ...


def check_dense(path: str, steps: int, ranks: int, records: int, what: str) -> None:
    """Raises InputError naming `path` and `what` (where the steps and ranks came from)
    when steps x ranks cells exceed the budget of `records` records (DENSE_CELLS_*)."""
    if steps * ranks > DENSE_CELLS_FLOOR + DENSE_CELLS_PER_RECORD * records:
        raise InputError(f"{path}: {steps:,} steps x {ranks:,} ranks ({what}) from only {records:,} records: far "
                         "sparser than a recorded run (corrupt step or rank ids?); refusing to expand it")


def parse_json_int(text: str) -> Union[int, float]:
    """json's parse_int: int(text) up to 20 characters, else inf. A longer integer is beyond
    every field's range (int64 has 19 digits), so it is reported as the field's bad value;
    int() itself would raise ValueError past 4,300 digits."""
    return int(text) if len(text) <= 20 else math.inf


def finite_number(x: object) -> Optional[float]:
    """A JSON value as a finite float, or None: not a number, a bool, NaN, inf, or an int
    beyond float range (float() of it would raise OverflowError)."""
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return None
    try:
        x = float(x)
    except OverflowError:
        return None
    return x if math.isfinite(x) else None


def short_repr(x: object) -> str:
    """repr(x) cut to 40 characters, for a bad value in a problem message."""
    text = repr(x)
    return text if len(text) <= 40 else text[:37] + "..."


def empty_stage_row(rows: int) -> np.ndarray:
    """(rows, len(STAGES)) of NaN."""
    return np.full((rows, len(STAGES)), np.nan)
