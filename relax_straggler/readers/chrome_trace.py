"""Chrome-trace timelines whose op names are Megatron timer names (the what-if artifact's
timeline-*.json.gz, or any trace in that layout).

Layout: complete events ``{"ph": "X", "name": <timer>, "pid": <dp_rank>, "tid": <lane>,
"ts": <us>, "dur": <us>, "args": {"step": ...}}``; each lane is named by a metadata event
``{"ph": "M", "name": "thread_name", "args": {"name": "PP rank P, TP rank T, <kind>"}}``,
which may come before or after the lane's events; a context / sequence-data parallel
lane adds "DSP rank C" (or "CP rank C"). The worker of an event is (dp_rank = pid, stage
= P) as recorded; its rank is topology.rank_of(pid, P, T + tp x C). args.model_chunk (a
virtual pipeline's chunk) is part of the duplicate key.

The file (plain or gzip) is parsed incrementally, one event at a time, with the standard
library's JSON decoder over a sliding text window, and events are summed per lane as they
come (op_trace.py): memory holds one window and the sums, never the file. Problems name
the line and the event's index in the array. A value longer than MAX_EVENT_CHARS (a huge
string in the trace's metadata or in an event) is passed over by its quotes and brackets
alone, one chunk held at a time: metadata is not read anyway, and such an event is a
reported skip.
"""

from __future__ import annotations

import codecs
import gzip
import json
import os
import re
import zlib
from typing import Iterator, Optional

import numpy as np

from relax_straggler.readers.base import (MAX_SMALL_ID, MAX_STEP, MAX_TIME_S, InputError, Problems, StepTimes,
                                          check_dense, finite_number, parse_json_int)
from relax_straggler.common.topology import MAX_WORLD_SIZE, Topology, make_layout
from relax_straggler.readers.op_records import OpCollector, OpRecords, Placement
from relax_straggler.readers.op_trace import (DuplicateFilter, OpNames, StepAccumulator, load_meta, meta_path_for,
                                              row_keys)

CHUNK_BYTES = 1 << 20
BATCH_EVENTS = 1 << 16
MAX_EVENT_CHARS = 1 << 24  # a longer value is passed over, never parsed (a trace event is ~200 characters)
_LANE_BASE = 1 << 20  # lane key = pid x 2^20 + tid
_MAX_US = MAX_TIME_S * 1e6
_LANE = re.compile(r"PP rank (\d+), TP rank (\d+)")
_CP_LANE = re.compile(r"\b(?:DSP|CP) rank (\d+)")
_WS = " \t\r\n"
_SCAN_OUTSIDE = re.compile(r'["{}\[\]]')  # what changes the nesting outside a string
_SCAN_INSIDE = re.compile(r'["\\]')  # what ends a string or escapes its next character


class _LongValue:
    """A JSON value passed over because it is longer than MAX_EVENT_CHARS."""

    def __init__(self, chars: int) -> None:
        self.chars = chars


class _EventStream:
    """Yields (line, index, event) from a JSON array of objects, or from the
    "traceEvents" array of a JSON object, reading the file in chunks."""

    def __init__(self, path: str, problems: Problems) -> None:
        self.path = path
        self.problems = problems
        self.done_bytes = 0
        with open(path, "rb") as f:
            magic = f.read(2)
        self._gzip = magic == b"\x1f\x8b"
        self._decoder = json.JSONDecoder(parse_int=parse_json_int)
        self._line = 1
        self.count = 0  # array elements read so far, skipped ones included

    def _chunks(self) -> Iterator[str]:
        text = codecs.getincrementaldecoder("utf-8")(errors="strict")
        with open(self.path, "rb") as raw:
            stream = gzip.GzipFile(fileobj=raw) if self._gzip else raw
            try:
                while True:
                    data = stream.read(CHUNK_BYTES)
                    self.done_bytes = raw.tell()
                    if not data:
                        tail = text.decode(b"", final=True)
                        if tail:
                            yield tail
                        return
                    yield text.decode(data)
            except (EOFError, OSError, zlib.error) as exc:
                raise InputError(f"{self.path}:{self._line}: the gzip stream is damaged or truncated here "
                                 f"({exc})") from None
            except UnicodeDecodeError as exc:
                raise InputError(f"{self.path}:{self._line}: not UTF-8 text ({exc.reason})") from None

    def events(self) -> Iterator[tuple[int, int, dict]]:
        self._chunk_iter = self._chunks()
        self._buf, self._pos, self._eof = "", 0, False
        self._counted = 0  # newlines before buf[_counted] are in self._line
        first = self._skip(_WS)
        if first is None:
            raise InputError(f"{self.path}: empty file")
        if first == "{":
            self._pos += 1
            while True:
                if self._skip(_WS + ",") != '"':
                    raise InputError(f"{self.path}:{self._at()}: JSON object without a \"traceEvents\" array")
                key = self._value()
                if self._skip(_WS) != ":":
                    raise InputError(f"{self.path}:{self._at()}: expected ':' after {key!r}")
                self._pos += 1
                if self._skip(_WS) is None:
                    break
                if key == "traceEvents":
                    break
                self._value()
        if self._pos >= len(self._buf) or self._buf[self._pos] != "[":
            raise InputError(f"{self.path}:{self._at()}: expected a JSON array of trace events")
        self._pos += 1
        index = 0
        while True:
            c = self._skip(_WS + ",")
            if c is None:
                raise InputError(f"{self.path}:{self._at()}: the event array is not closed (truncated file?)")
            if c == "]":
                return
            line = self._at()
            event = self._value()
            self.count = index + 1
            if isinstance(event, dict):
                yield line, index, event
            elif isinstance(event, _LongValue):
                self.problems.report(line, f"event #{index} is {event.chars:,} characters long, beyond the "
                                     f"{MAX_EVENT_CHARS:,} a trace event may have; skipped", kind="oversized")
            else:
                self.problems.report(line, f"event #{index} is not a JSON object", kind="malformed")
            index += 1

    def _at(self, pos: Optional[int] = None) -> int:
        """The 1-based line of buf[pos] (default: the cursor); counts newlines once."""
        pos = self._pos if pos is None else pos
        if pos >= self._counted:
            self._line += self._buf.count("\n", self._counted, pos)
            self._counted = pos
            return self._line
        return self._line - self._buf.count("\n", pos, self._counted)

    def _more(self) -> bool:
        """Appends the next chunk, dropping what the cursor has passed."""
        if self._eof:
            return False
        try:
            chunk = next(self._chunk_iter)
        except StopIteration:
            self._eof = True
            return False
        self._at()
        self._buf, self._counted, self._pos = self._buf[self._pos:] + chunk, 0, 0
        return True

    def _skip(self, chars: str) -> Optional[str]:
        """Advances past `chars`; the next character, or None at end of input."""
        while True:
            buf, pos = self._buf, self._pos
            while pos < len(buf) and buf[pos] in chars:
                pos += 1
            self._pos = pos
            if pos < len(buf):
                return buf[pos]
            if not self._more():
                return None

    def _value(self) -> object:
        """The JSON value at the cursor, or a _LongValue when it is longer than
        MAX_EVENT_CHARS; the cursor moves past it. Raises InputError for invalid JSON or an
        input that ends inside the value."""
        while True:
            try:
                obj, end = self._decoder.raw_decode(self._buf, self._pos)
            except json.JSONDecodeError as exc:
                if len(self._buf) - self._pos < MAX_EVENT_CHARS and self._more():
                    continue
                if len(self._buf) - self._pos >= MAX_EVENT_CHARS and self._buf[self._pos] in '"[{':
                    line = self._at(exc.pos)
                    chars = self._pass_over()
                    if chars > MAX_EVENT_CHARS:
                        return _LongValue(chars)
                    raise InputError(f"{self.path}:{line}: invalid JSON: {exc.msg}") from None
                raise InputError(f"{self.path}:{self._at(exc.pos)}: invalid or truncated JSON: {exc.msg}") from None
            except RecursionError:
                raise InputError(f"{self.path}:{self._at()}: JSON nested deeper than the decoder allows") from None
            if end == len(self._buf) and self._more():
                continue  # a number at the window's edge may continue in the next chunk
            self._pos = end
            return obj

    def _pass_over(self) -> int:
        """Moves the cursor past the string, array or object it is on, found by its quotes and
        brackets alone: linear in its length, and each chunk dropped once scanned. Returns
        its length in characters. Raises InputError when the input ends inside it."""
        depth, inside, escaped, chars = 0, False, False, 0
        i = self._pos
        while True:
            buf = self._buf
            while i < len(buf):
                if escaped:
                    i, escaped = i + 1, False
                    continue
                m = (_SCAN_INSIDE if inside else _SCAN_OUTSIDE).search(buf, i)
                if m is None:
                    i = len(buf)
                    break
                c, i = m.group(), m.end()
                if inside:
                    escaped, inside = c == "\\", c == "\\"
                elif c == '"':
                    inside = True
                else:
                    depth += 1 if c in "[{" else -1
                if not inside and depth == 0:
                    chars += i - self._pos
                    self._pos = i
                    return chars
            chars += len(buf) - self._pos
            self._pos = len(buf)
            if not self._more():
                raise InputError(f"{self.path}:{self._at()}: the input ends inside a value of {chars:,} characters "
                                 "(truncated file?)")
            i = self._pos + (i - len(buf))  # an escape may reach into the next chunk


class ChromeTraceReader:
    format = "chrome-trace"

    def __init__(self, path: str, problems: Problems, topology: Optional[Topology] = None,
                 meta: Optional[str] = None, ops: bool = False) -> None:
        self.path = path
        self.problems = problems
        self._ops = OpCollector() if ops else None
        self._placement = Placement.empty()
        meta = meta or meta_path_for(path)
        self._topology = topology or (load_meta(meta) if meta else None)
        self._stream = _EventStream(path, problems)
        self.total_bytes = os.path.getsize(path)
        self.names = OpNames(problems)

    @property
    def done_bytes(self) -> int:
        return self._stream.done_bytes

    @property
    def records(self) -> int:
        """Trace events read, skipped ones included."""
        return self._stream.count

    def topology(self) -> Optional[Topology]:
        return self._topology

    def op_records(self) -> Optional[OpRecords]:
        """The valid ops once steps() has been exhausted; None unless opened with ops=True."""
        return None if self._ops is None else self._ops.records(self._placement)

    def steps(self) -> Iterator[StepTimes]:
        lanes: dict[tuple[int, int], tuple[int, int, int]] = {}  # (pid, tid) -> (pp, tp, cp)
        self._lane_events: dict[int, int] = {}  # lane key -> its events that passed the row checks
        self._op_lanes: set[int] = set()  # lanes with only excluded ops still place what-if ops
        acc, dups = StepAccumulator(self.path), DuplicateFilter()
        batch: list[tuple] = []
        for line, index, ev in self._stream.events():
            ph = ev.get("ph")
            if ph == "M":
                if ev.get("name") == "thread_name":
                    self._name_lane(line, index, ev, lanes)
                continue
            if ph != "X":
                continue
            row = self._row(line, index, ev)
            if row is not None:
                batch.append(row + (line,))
            if len(batch) >= BATCH_EVENTS:
                self._add(batch, acc, dups)
                batch = []
        self._add(batch, acc, dups)
        if not acc.keys().size:
            raise InputError(f"{self.path}: no usable complete ('X') events")
        summed = set(acc.keys().tolist())
        ranks = self._lane_ranks(sorted(summed | self._op_lanes), lanes, acc.num_steps)
        placed = np.array(list(ranks), dtype=np.int64)
        self._placement = Placement(placed, placed // _LANE_BASE,
                                    np.array([lanes[divmod(k, _LANE_BASE)][0] for k in ranks], dtype=np.int64),
                                    np.array(list(ranks.values()), dtype=np.int64))
        kept = [k for k in ranks if k in summed]
        yield from acc.steps(np.array(kept, dtype=np.int64), np.array([ranks[k] for k in kept], dtype=np.int64))

    def _name_lane(self, line: int, index: int, ev: dict, lanes: dict[tuple[int, int], tuple[int, int, int]]) -> None:
        """Records a thread_name event's (PP, TP, DSP) ranks of its lane; reports a malformed one."""
        args = ev.get("args")
        if args is not None and not isinstance(args, dict):
            self.problems.report(line, f"event #{index} (thread_name): args must be an object", "malformed")
            return
        lane = str((args or {}).get("name", ""))
        m, cp = _LANE.search(lane), _CP_LANE.search(lane)
        if not (m and isinstance(ev.get("pid"), int) and isinstance(ev.get("tid"), int)):
            return
        ids = (m.group(1), m.group(2), cp.group(1) if cp else "0")
        if any(len(x) > 7 or int(x) >= MAX_WORLD_SIZE for x in ids):
            self.problems.report(line, f"event #{index} (thread_name {lane[:80]!r}): PP, TP and DSP ranks must be "
                                 f"below {MAX_WORLD_SIZE:,}; lane name skipped", "layout")
            return
        lanes[(ev["pid"], ev["tid"])] = (int(ids[0]), int(ids[1]), int(ids[2]))

    def _row(self, line: int, index: int, ev: dict) -> Optional[tuple]:
        where = f"event #{index}"
        name, pid, tid = ev.get("name"), ev.get("pid"), ev.get("tid")
        ts, dur = ev.get("ts"), ev.get("dur")
        args = ev.get("args")
        step = args.get("step") if isinstance(args, dict) else None
        if not isinstance(name, str) or not isinstance(pid, int) or not isinstance(tid, int) \
                or not 0 <= pid < _LANE_BASE or not 0 <= tid < _LANE_BASE:
            self.problems.report(line, f"{where}: needs a string name and integer pid, tid in [0, 2^20)", "malformed")
            return None
        if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= MAX_STEP:
            self.problems.report(line, f"{where} ({name}): args.step must be an integer in [0, 2^63)", "malformed")
            return None
        ts, dur = finite_number(ts), finite_number(dur)
        if ts is None or dur is None or not (0 <= ts <= _MAX_US and 0 <= dur <= _MAX_US):
            self.problems.report(line, f"{where} ({name}): ts and dur must be numbers of us in [0, {_MAX_US:g}]",
                                 "bad_value")
            return None
        ids = [_int_arg(args, k) for k in ("model_chunk", "mb_id", "seq_id")]
        if None in ids:
            key = ("model_chunk", "mb_id", "seq_id")[ids.index(None)]
            self.problems.report(line, f"{where} ({name}): args.{key} must be an integer in [-1, 2^31) or null",
                                 "bad_value")
            return None
        target = self.names.resolve(name, line)
        if target is None and not self.names.known(name):
            return None
        stage = -1 if target is None else target.stage
        p2p = -1 if target is None or target.p2p is None else target.p2p
        chunk, mb, seq = ids
        name_id = int(self._ops.name_ids([name])[0]) if self._ops is not None else -1
        return pid * _LANE_BASE + tid, step, stage, p2p, ts, dur, chunk, mb, seq, name_id

    def _add(self, batch: list[tuple], acc: StepAccumulator, dups: DuplicateFilter) -> None:
        """Accumulates a batch of events per lane (ranks are known once every lane is named)."""
        if not batch:
            return
        lane, step, stage, p2p, ts, dur, chunk, mb, seq, name_id, line = (np.array(c) for c in zip(*batch))
        ns = [np.clip(np.round(x * 1e3), -(2.0 ** 62), 2.0 ** 62).astype(np.int64) for x in (ts, dur)]
        keys = row_keys(lane, step, stage, p2p, chunk, *ns)
        dup = dups.seen_before(keys)
        for i in np.flatnonzero(dup).tolist():
            self.problems.report(int(line[i]), "duplicate event (same lane, step, op, ts and dur as an earlier one)",
                                 "duplicate")
        lanes, events = np.unique(lane[~dup], return_counts=True)
        for k, n in zip(lanes.tolist(), events.tolist()):
            self._lane_events[k] = self._lane_events.get(k, 0) + n
        keep = ~dup & (stage >= 0)
        acc.add(step[keep], lane[keep], stage[keep], p2p[keep], dur[keep] / 1e3, ts[keep] / 1e3)
        if self._ops is not None:
            keep = ~dup
            self._op_lanes.update(np.unique(lane[keep]).tolist())
            self._ops.add(lane[keep], step[keep], name_id[keep], ts[keep] * 1e-6, dur[keep] * 1e-6, seq[keep],
                          mb[keep], chunk[keep])

    def _lane_ranks(self, keys: list[int], lanes: dict[tuple[int, int], tuple[int, int, int]],
                    steps: int) -> dict[int, int]:
        """Lane key -> global rank; lanes without a name or outside the topology are reported.
        Raises InputError when the layout would cost far more than the input's `steps`
        and records allow (readers/base.py check_dense)."""
        named = {k: lanes[divmod(k, _LANE_BASE)] for k in keys if divmod(k, _LANE_BASE) in lanes}
        for k in keys:
            if k not in named:
                self.problems.report(0, f"{self._lane_events.get(k, 0)} events on pid {k // _LANE_BASE} tid "
                                     f"{k % _LANE_BASE} are skipped: the lane has no 'PP rank P, TP rank T' "
                                     "thread_name", "layout", skipped=self._lane_events.get(k, 0))
        if not named:
            raise InputError(f"{self.path}: no event lane is named 'PP rank P, TP rank T, ...' by a thread_name "
                             "metadata event, so no event can be placed on a rank")
        if self._topology is None:
            sizes = (max(k // _LANE_BASE for k in named) + 1, max(p for p, _, _ in named.values()) + 1,
                     max(t for _, t, _ in named.values()) + 1, max(c for _, _, c in named.values()) + 1)
            world = sizes[0] * sizes[1] * sizes[2] * sizes[3]
            what = (f"the layout of the named lanes: pid up to {sizes[0] - 1}, PP rank up to {sizes[1] - 1}, TP rank "
                    f"up to {sizes[2] - 1}, DSP rank up to {sizes[3] - 1}")
            check_dense(self.path, steps, world, self.records, what)
            if world > MAX_WORLD_SIZE:
                raise InputError(f"{self.path}: {what}: {world:,} ranks are beyond the {MAX_WORLD_SIZE:,} ranks a job "
                                 "may have")
            self._topology = make_layout(*sizes[:3], cp=sizes[3])
        else:
            check_dense(self.path, steps, self._topology.world_size, self.records, "the declared layout")
        topo, out = self._topology, {}
        for k, (pp, tp, cp) in named.items():
            dp = k // _LANE_BASE
            if dp >= topo.dp or pp >= topo.pp or tp >= topo.tp or cp >= topo.slots // topo.tp:
                self.problems.report(0, f"{self._lane_events.get(k, 0)} events of pid {dp} (PP rank {pp}, TP rank "
                                     f"{tp}, DSP rank {cp}) are skipped: outside the topology dp {topo.dp} x pp "
                                     f"{topo.pp} x tp {topo.tp} x dsp {topo.slots // topo.tp}", "layout",
                                     skipped=self._lane_events.get(k, 0))
                continue
            out[k] = int(topo.rank_of(dp, pp, tp + topo.tp * cp))
        if not out:
            raise InputError(f"{self.path}: every event lane is outside the topology dp {topo.dp} x pp {topo.pp} x "
                             f"tp {topo.tp} x dsp {topo.slots // topo.tp}")
        return out


def _int_arg(args: dict, key: str) -> Optional[int]:
    """An integer event argument in [-1, 2^31), -1 when absent or null; None for any other value."""
    v = args.get(key)
    if v is None:
        return -1
    return v if isinstance(v, int) and not isinstance(v, bool) and -1 <= v <= MAX_SMALL_ID else None

