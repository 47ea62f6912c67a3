"""Our own straggler.jsonl (relax_straggler.reporters.jsonl): one report per line with
"step", "stages" (names), "device_ms" ([[ms per stage] per rank], null = not run) and
optionally "tokens" (per rank) and "run_queue_ms" (per rank: the training thread's wait for a
CPU in the step, null = not measured). Read line by line.

Line problems (reported with the line number, the line skipped): invalid JSON (or nested
too deep), missing or mistyped fields, a step outside int64, stage names outside the
closed set, a device_ms row of the wrong length, times that are negative, not finite or
beyond MAX_TIME_MS, tokens negative or not finite, a step number seen before. Run-queue
waits that are not a number of ms in [0, MAX_TIME_MS] or null per rank are a problem of their
line that leaves only the waits out.
"""

from __future__ import annotations

import dataclasses
import json
import os
from itertools import chain
from typing import Iterator, Optional, Union

import numpy as np

from relax_straggler.common.metric_names import HANG_ANSWER
from relax_straggler.readers.base import (MAX_STEP, MAX_TIME_MS, InputError, Problems, StepTimes, empty_stage_row,
                                          finite_number, parse_json_int, short_repr)
from relax_straggler.common.stages import STAGE_IDS
from relax_straggler.common.topology import Topology


class StragglerJsonlReader:
    format = "straggler-jsonl"

    def __init__(self, path: str, problems: Problems, topology: Optional[Topology] = None,
                 meta: Optional[str] = None) -> None:
        if meta is not None:
            raise InputError(f"{path}: --meta applies to trace files; give --dp/--pp/--tp/--dsp for straggler.jsonl")
        self.path = path
        self.problems = problems
        self._topology = topology
        self.total_bytes = os.path.getsize(path)
        self.done_bytes = 0
        self.records = 0
        self._ranks = 0  # ranks of the first report; every report must have as many

    def topology(self) -> Optional[Topology]:
        return self._topology

    def steps(self) -> Iterator[StepTimes]:
        seen: set[int] = set()
        with open(self.path, "rb") as f:
            for number, raw in enumerate(f, start=1):
                self.records = number
                self.done_bytes += len(raw)
                if not raw.strip():
                    continue
                parsed = self._parse(number, raw)
                if parsed is None:
                    continue
                step, waits = parsed
                if seen and step.ranks.size != self._ranks:
                    self.problems.report(number, f"{step.ranks.size} ranks, but the first report had {self._ranks}; "
                                         "skipped", "layout")
                    continue
                self._ranks = step.ranks.size
                if step.step in seen:
                    self.problems.report(number, f"step {step.step} repeats an earlier line; skipped", "duplicate")
                    continue
                seen.add(step.step)
                # The waits are read once the line is kept: a skipped line has one problem.
                yield dataclasses.replace(step, run_queue_ms=self._waits(number, waits, step.ranks.size))
        if not seen:
            raise InputError(f"{self.path}: no usable report line" + (" (empty file)" if self.records == 0 else ""))

    def _parse(self, line: int, raw: bytes) -> Optional[tuple[StepTimes, object]]:
        """The line's step (its run-queue waits not read yet) and its raw "run_queue_ms", or
        None for a line reported as a problem or a hang answer."""
        try:
            rec = json.loads(raw, parse_int=parse_json_int)
        except RecursionError:
            self.problems.report(line, "not a JSON object: nested deeper than the decoder allows", "malformed")
            return None
        except ValueError as exc:  # invalid JSON or not UTF-8
            self.problems.report(line, f"not a JSON object: {exc}", "malformed")
            return None
        if not isinstance(rec, dict):
            self.problems.report(line, "not a JSON object", "malformed")
            return None
        metrics = rec.get("metrics")
        if isinstance(metrics, dict) and HANG_ANSWER in metrics:
            return None  # the watchdog's answer to a stopped job (relax_straggler.hang): no step times
        step, stages, device = rec.get("step"), rec.get("stages"), rec.get("device_ms")
        if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= MAX_STEP:
            self.problems.report(line, "'step' must be an integer in [0, 2^63)", "malformed")
            return None
        if not isinstance(stages, list) or not all(isinstance(s, str) for s in stages):
            self.problems.report(line, "'stages' must be a list of stage names", "malformed")
            return None
        unknown = [s for s in stages if s not in STAGE_IDS]
        if unknown or len(set(stages)) != len(stages):
            what = f"unknown stage(s) {unknown}" if unknown else "repeated stage names"
            self.problems.report(line, f"'stages': {what}", "unknown_op")
            return None
        if not (isinstance(device, list) and device and set(map(type, device)) == {list}
                and set(map(len, device)) == {len(stages)}):
            self.problems.report(line, "'device_ms' must be a non-empty list of per-rank lists of "
                                 f"{len(stages)} values", "malformed")
            return None
        times = _times(device)
        if isinstance(times, tuple):
            r, x = times
            self.problems.report(line, f"device_ms[{r}]: {short_repr(x)} is not a number of ms in "
                                 f"[0, {MAX_TIME_MS:g}]", "bad_value")
            return None
        ms = empty_stage_row(len(device))
        ms[:, [STAGE_IDS[s] for s in stages]] = times
        tokens = rec.get("tokens")
        tok = None
        if tokens is not None:
            tok = [np.nan if t is None else finite_number(t) for t in tokens] if isinstance(tokens, list) else None
            if tok is None or len(tok) != len(device) or any(t is None or t < 0 for t in tok):
                self.problems.report(line, f"'tokens' must list one finite number >= 0 or null per rank "
                                     f"({len(device)})", "malformed")
                return None
            tok = np.array(tok, dtype=np.float64)
        return StepTimes(step=step, ranks=np.arange(len(device), dtype=np.int64), ms=ms, tokens=tok), \
            rec.get("run_queue_ms")

    def _waits(self, line: int, waits: object, ranks: int) -> Optional[np.ndarray]:
        """The line's run-queue waits, (ranks,) ms with NaN for null, or None when it has none.
        A malformed list is a problem of its line that leaves the waits out and keeps the
        step's times (skipped=0): the cause then reads compute, as for an input without them."""
        if waits is None:
            return None
        values = [np.nan if w is None else finite_number(w) for w in waits] if isinstance(waits, list) else None
        if values is None or len(values) != ranks:
            what = f"{short_repr(waits)} is not a list of {ranks}"
        else:
            bad = next((r for r, w in enumerate(values)
                        if waits[r] is not None and (w is None or not 0 <= w <= MAX_TIME_MS)), None)
            if bad is None:
                return np.array(values, dtype=np.float64)
            what = f"run_queue_ms[{bad}]: {short_repr(waits[bad])}"
        self.problems.report(line, f"'run_queue_ms': {what} (one number of ms in [0, {MAX_TIME_MS:g}] or null per "
                             "rank); the waits are left out, the step's times kept", "malformed", skipped=0)
        return None


def _times(device: list) -> Union[np.ndarray, tuple[int, object]]:
    """(ranks, stages) ms of device_ms rows of equal length, NaN for null; or (rank, value)
    of the first value that is not a number of ms in [0, MAX_TIME_MS]. Checked in C loops
    and numpy: a report of a million ranks holds millions of values."""
    flat = list(chain.from_iterable(device))
    width = len(device[0])
    if set(map(type, flat)) <= _NUMBER_OR_NULL:
        times = np.array(flat, dtype=np.float64)  # null -> NaN
        null = np.isnan(times)
        bad = ~null & ~((times >= 0) & (times <= MAX_TIME_MS))
        if not bad.any() and int(null.sum()) == flat.count(None):  # and no NaN in the text
            return times.reshape(len(device), width)
    i = next(i for i, x in enumerate(flat) if x is not None and not (type(x) in _NUMBER_OR_NULL
                                                                     and 0 <= x <= MAX_TIME_MS))
    return i // width, flat[i]


_NUMBER_OR_NULL = {float, int, type(None)}
