"""The embedded store (``file://DIR``): append-only files, no server.

Layout, one directory per job: the job id percent-encoded, or, when that is longer than a
file name may be (255 bytes), ``#`` + the SHA-256 of the id in hex, with the id in a file
``job`` inside (``#`` never occurs in a percent-encoded name)::

    DIR/jobs/<job>/seg-000001.arrows   frames, appended: 12-byte header (b"RSF1", payload
                                        bytes, crc32 of the payload) + one Arrow IPC stream
                                        (zstd buffers) holding one write's rows of this job
    DIR/jobs/<job>/index.jsonl         one line per frame, written after the frame:
                                        {"seg", "off", "len", "rows",
                                         "its": [[iteration, step_ms, first_ts, last_ts, ranks], ...],
                                         "crc": crc32 of the line's text before ',"crc"' + "}"}
    DIR/jobs/<job>/lock                 flock'd by writers around each append
    DIR/jobs/#<sha256>/job              the job id (UTF-8), in a digest-named directory only

Concurrency: writers (any number of processes) append whole frames under the job's lock;
readers never lock. A reader sees only frames named by complete index lines, and the index
line is written after its frame, so a reader never sees half a write. `iterations()` reads
only the index lines added since its last call (the per-iteration aggregates are kept in
memory), so polling a 1,024-rank job costs one small read.

Recovery: the first write of a process to a job (and any write that finds the segment
not as it left it) checks every segment against the index, under the job's lock; a segment
that grew by whole frames other writers indexed needs only their new index lines. Whole
frames no index line names (a writer died between frame and index line, or the line was
lost) are indexed again; bytes that hold no whole frame are reported and never read. A
torn last frame (a writer died mid-frame), a last segment shorter than the frames its
index names (cut short: a crash, a full disk, a copy cut off) or a missing one is reported
in `problems` and the log, and writing continues in a new segment, so the damaged bytes
are never written over, and every frame indexed from then on is one the writer has just
put at the offset it records. A torn last index line is cut before it is rewritten from
its frame.

Damage a reader skips, each reported once with the file and line (`problems`,
`job_problems(job)`): an index line that is not JSON or not an entry (nested too deep,
a field of the wrong type or range, a checksum that does not match its text), one that names
a frame another line named already, or one whose frame lies past the end of its segment or
in a missing segment (that frame's rows are lost). A frame that fails its checksum when
read is skipped and reported. The other lines and frames of the job are read as usual. A
frame whose index line was lost is not seen until the job's next writer indexes it again.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import math
import os
import struct
import threading
import zlib
from bisect import bisect_right, insort
from dataclasses import dataclass, field
from typing import Iterator, Optional, Sequence
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from relax_straggler.common.appending import append_whole
from relax_straggler.stores.base import (SAMPLE_SCHEMA, STEP_METRIC, IterationTime, Sample, StoreError,
                                         samples_to_table, table_to_samples)
from relax_straggler.stores.row_rules import check_table

log = logging.getLogger(__name__)

MAGIC = b"RSF1"
_HEADER = struct.Struct("<4sII")  # magic, payload bytes, crc32(payload)
# A segment is closed once it passes this size; the next write starts a new one.
SEGMENT_BYTES = 64 << 20
# Problems kept with their message, in all and per job (all are logged).
MAX_PROBLEMS = 100
MAX_JOB_PROBLEMS = 20
_FRAME_SCHEMA = pa.schema([f for f in SAMPLE_SCHEMA if f.name != "job"])  # the job is the directory
_IPC_OPTIONS = ipc.IpcWriteOptions(compression="zstd")
_INDEX = "index.jsonl"
_INDEX_KEYS = frozenset({"seg", "off", "len", "rows", "its"})
_CRC_KEY = b',"crc":'  # an index line's checksum, its last field
_MAX_SEGMENT = 999_999  # six digits in a segment's file name
_MAX_INT = 2**63 - 1  # offsets, lengths, row counts and iterations are int64


# The longest file name ext4, xfs, btrfs and tmpfs hold (NAME_MAX), bytes.
NAME_MAX = 255
_DIGEST_MARK = "#"  # percent-encoding escapes "#": a name starting with it is a digest
_JOB_FILE = "job"


def _job_dir_name(job: str) -> str:
    """The directory name of `job` (see the module docstring). Raises ValueError when empty."""
    if not job:
        raise ValueError("job id must not be empty")
    name = quote(job, safe="")
    name = "%2E" + name[1:] if name.startswith(".") else name  # never "." or ".."
    if len(name) <= NAME_MAX:  # ASCII: characters are bytes
        return name
    return _DIGEST_MARK + hashlib.sha256(job.encode()).hexdigest()


def _write_job_file(job_dir: str, job: str) -> None:
    """Names `job` inside its digest-named directory (atomically: readers see all or nothing)."""
    path = os.path.join(job_dir, _JOB_FILE)
    if os.path.exists(path):
        return
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "wb") as f:
        f.write(job.encode())
    os.replace(tmp, path)


def _segment_name(number: int) -> str:
    return f"seg-{number:06d}.arrows"


def _segment_numbers(job_dir: str) -> list[int]:
    """The segments in `job_dir`, ascending."""
    out = []
    for name in os.listdir(job_dir):
        digits = name[4:-7]
        if name.startswith("seg-") and name.endswith(".arrows") and len(digits) == 6 and digits.isdigit():
            out.append(int(digits))
    return sorted(out)


@dataclass
class _Entry:
    """One index line: a frame and its per-iteration aggregates."""

    seg: int
    off: int
    length: int
    rows: int
    its: list  # [[iteration, step_ms or None, first_ts, last_ts, ranks], ...]

    @property
    def end(self) -> int:
        return self.off + self.length


@dataclass
class _JobIndex:
    """What a reader knows of one job: index bytes and lines consumed, frames, per-iteration entries."""

    offset: int = 0
    lines: int = 0
    entries: list = field(default_factory=list)
    frames: set = field(default_factory=set)  # (seg, off) of every entry: a frame is read once
    by_iteration: dict = field(default_factory=dict)  # iteration -> [(step_ms, first_ts, last_ts, ranks), ...]
    order: list = field(default_factory=list)  # iterations ascending


@dataclass
class _Writer:
    """What a writer process knows of one job: its lock file, where the next frame goes and
    how much of the index it has read (lines past it were appended by other writers)."""

    lock_fd: int
    seg: int = 0
    end: int = -1  # -1: not yet checked
    index_read: int = 0


class FileStore:
    """The file store at `directory`. Implements relax_straggler.stores.base.Store.

    create: make the directory when missing (else a missing one raises StoreError).
    problems: damage found (torn or corrupt frames, damaged index lines, segments cut
    short), each message naming the file and the byte or line; job_problems(job) gives
    one job's."""

    def __init__(self, directory: str, url: Optional[str] = None, create: bool = True) -> None:
        self.directory = os.path.abspath(directory)
        self.url = url or f"file://{self.directory}"
        self._jobs_dir = os.path.join(self.directory, "jobs")
        if create:
            try:
                os.makedirs(self._jobs_dir, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"{self.url}: cannot create {self._jobs_dir}: {exc.strerror}") from None
        elif not os.path.isdir(self._jobs_dir):
            raise StoreError(f"{self.url}: the store directory {self._jobs_dir} is missing")
        self._indexes: dict[str, _JobIndex] = {}
        self._writers: dict[str, _Writer] = {}
        self._lock = threading.Lock()  # the in-memory indexes and writers (the monitor reads from threads)
        self.problems: list[str] = []
        self._job_problems: dict[str, list[str]] = {}

    # --- writing ---------------------------------------------------------------------

    def write(self, samples: Sequence[Sample]) -> None:
        """Appends rows, one frame per job. Raises StoreError (I/O), ValueError (empty job id)."""
        if samples:
            self.write_table(samples_to_table(samples))

    def write_table(self, table: pa.Table) -> None:
        """Appends a SAMPLE_SCHEMA table, one frame per job. Raises ValueError on missing or
        mistyped columns or an empty job id, StoreError on I/O errors."""
        missing = [f.name for f in SAMPLE_SCHEMA if f.name not in table.column_names]
        if missing:
            raise ValueError(f"write_table: missing column(s) {missing}; expected {SAMPLE_SCHEMA.names}")
        try:
            table = table.select(SAMPLE_SCHEMA.names).cast(SAMPLE_SCHEMA)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise ValueError(f"write_table: columns do not match {SAMPLE_SCHEMA}: {exc}") from None
        if table.num_rows == 0:
            return
        check_table(table)
        jobs = pc.unique(table.column("job")).to_pylist()
        for job in jobs:
            rows = table if len(jobs) == 1 else table.filter(pc.equal(table.column("job"), job))
            self._append(job, rows.drop_columns(["job"]))

    def _append(self, job: str, rows: pa.Table) -> None:
        payload = _encode(rows)
        entry_its = _iteration_aggregates(rows)
        frame = _HEADER.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload
        job_dir = os.path.join(self._jobs_dir, _job_dir_name(job))
        writer: Optional[_Writer] = None
        try:
            with self._lock:
                writer = self._writers.get(job)
                if writer is None:
                    os.makedirs(job_dir, exist_ok=True)
                    if os.path.basename(job_dir).startswith(_DIGEST_MARK):
                        _write_job_file(job_dir, job)
                    fd = os.open(os.path.join(job_dir, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
                    writer = self._writers[job] = _Writer(fd)
                fcntl.flock(writer.lock_fd, fcntl.LOCK_EX)
                try:
                    self._check_tail(job, job_dir, writer)
                    seg_path = os.path.join(job_dir, _segment_name(writer.seg))
                    # The offset recorded is where the frame went (the segment's real end), and a
                    # failed write (a full disk) leaves neither half a frame nor half a line.
                    off = _append_to(seg_path, frame)
                    line = _index_line(_Entry(writer.seg, off, len(frame), rows.num_rows, entry_its))
                    try:
                        writer.index_read = _append_to(os.path.join(job_dir, _INDEX), line) + len(line)
                    except OSError:
                        with contextlib.suppress(OSError):
                            os.truncate(seg_path, off)  # not acknowledged: a retry must not find it indexed again
                        raise
                    writer.end = off + len(frame)
                    if writer.end >= SEGMENT_BYTES:
                        writer.seg, writer.end = writer.seg + 1, 0
                finally:
                    fcntl.flock(writer.lock_fd, fcntl.LOCK_UN)
        except OSError as exc:
            if writer is not None:
                writer.end = -1  # the next write checks the segments again
            raise StoreError(f"{self.url}: cannot append to job {job!r} in {job_dir}: {exc}") from None

    def _check_tail(self, job: str, job_dir: str, writer: _Writer) -> None:
        """Makes (writer.seg, writer.end) the place of the next frame. Holds the job lock.
        When the segment is as this writer left it, or other writers appended whole frames
        named by index lines, nothing else is read; otherwise every segment is checked."""
        if writer.end >= 0:
            try:
                size = os.path.getsize(os.path.join(job_dir, _segment_name(writer.seg)))
            except FileNotFoundError:
                size = None if writer.end else 0
            if size == writer.end or (size is not None and size > writer.end and
                                      self._caught_up(job_dir, writer, size)):
                return
        self._recover(job, job_dir, writer)

    def _caught_up(self, job_dir: str, writer: _Writer, size: int) -> bool:
        """True (and the writer moved to `size`) when the index lines added since the writer
        last read it name frames that fill its segment from writer.end to `size` exactly."""
        with open(os.path.join(job_dir, _INDEX), "rb") as f:
            f.seek(writer.index_read)
            data = f.read()
        if not data.endswith(b"\n"):
            return False
        pos = writer.end
        try:
            entries = sorted((_parse_index_line(line) for line in data[:-1].split(b"\n")), key=lambda e: e.off)
        except ValueError:
            return False
        for e in entries:
            if e.seg != writer.seg or e.off != pos:
                return False
            pos = e.end
        if pos != size:
            return False
        writer.end, writer.index_read = size, writer.index_read + len(data)
        return True

    def _recover(self, job: str, job_dir: str, writer: _Writer) -> None:
        """Checks every segment against the index (see the module docstring): frames no index
        line names (a writer died before its line, or the line was lost) are indexed again;
        bytes that hold no whole frame are reported; the next frame goes at the end of the
        last segment, or into a new one when that one is torn, cut short or missing."""
        entries = self._index_entries(job, job_dir)
        by_seg: dict[int, list[_Entry]] = {}
        for e in entries:
            by_seg.setdefault(e.seg, []).append(e)
        segments = _segment_numbers(job_dir)
        last = max([*segments, *by_seg], default=1)
        for seg in segments:
            seg_path = os.path.join(job_dir, _segment_name(seg))
            size = os.path.getsize(seg_path)
            named = sorted((e.off, e.end) for e in by_seg.get(seg, ()) if e.end <= size)
            pos = 0
            for off, end in named:
                if off > pos:  # bytes no line names between two frames (damage there is reported)
                    self._index_frames_in(job, job_dir, seg, pos, off)
                pos = max(pos, end)
            lost = [e for e in by_seg.get(seg, ()) if e.end > size]
            if seg != last:
                if pos < size:
                    self._index_frames_in(job, job_dir, seg, pos, size)
                continue
            if lost:
                self._problem(job, f"{seg_path} was cut short: {size:,} bytes, its index names frames up to byte "
                                   f"{max(e.end for e in lost):,} (a crash, a full disk or a copy cut off); the rows "
                                   f"of {len(lost)} indexed frame(s) ({_iterations_of(lost)}) are lost; writing "
                                   f"continues in {_segment_name(seg + 1)}")
            then = f"; writing continues in {_segment_name(seg + 1)}"
            whole = pos == size or self._index_frames_in(job, job_dir, seg, pos, size, None if lost else then)
            writer.seg, writer.end = (seg, size) if whole and not lost else (seg + 1, 0)
        if last not in segments:
            if by_seg.get(last):
                self._problem(job, f"{os.path.join(job_dir, _segment_name(last))} is missing (removed, or a copy "
                                   f"left it out); the rows of {len(by_seg[last])} indexed frame(s) "
                                   f"({_iterations_of(by_seg[last])}) are lost; writing continues in "
                                   f"{_segment_name(last + 1)}")
                last += 1
            writer.seg, writer.end = last, 0  # a new job, or a new segment not written yet
        if writer.end >= SEGMENT_BYTES:
            writer.seg, writer.end = writer.seg + 1, 0
        index = os.path.join(job_dir, _INDEX)
        writer.index_read = os.path.getsize(index) if os.path.exists(index) else 0  # the lines indexed again too

    def _index_frames_in(self, job: str, job_dir: str, seg: int, start: int, stop: int,
                         then: Optional[str] = "") -> bool:
        """Indexes the whole frames in bytes [start, stop) of segment `seg` that no index
        line names. False when some of those bytes hold no whole frame: the frames before
        them are indexed, the bytes from there to `stop` are never read, and a problem says
        so, `then` ending its message (None: not reported, the caller reported the cause)."""
        seg_path = os.path.join(job_dir, _segment_name(seg))
        with open(seg_path, "rb") as f:
            f.seek(start)
            data = f.read(stop - start)
        pos = 0
        while pos < len(data):
            payload = _frame_at(data, pos)
            rows = None if payload is None else _decoded(payload)
            if rows is None:
                if then is None:
                    return False
                self._problem(job, f"{seg_path}: torn or corrupt frame at byte {start + pos:,} (up to byte {stop:,} "
                                   "no whole frame: a writer stopped mid-write, or the bytes were damaged); the frames "
                                   f"before are kept, these bytes are never read{then}")
                return False
            _append_to(os.path.join(job_dir, _INDEX),
                       _index_line(_Entry(seg, start + pos, _HEADER.size + len(payload), rows.num_rows,
                                          _iteration_aggregates(rows))))
            log.info("%s: the frame at byte %d was named by no index line; indexed again", seg_path, start + pos)
            pos += _HEADER.size + len(payload)
        return True

    def _index_entries(self, job: str, job_dir: str) -> list[_Entry]:
        """The index's readable entries (damaged lines reported and left out); a torn last
        line (no newline) is cut off. Holds the job lock."""
        path = os.path.join(job_dir, _INDEX)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        if end < len(data):
            self._problem(job, f"{path}: torn last line ({len(data) - end} bytes) cut; its frame is indexed again")
            with open(path, "r+b") as f:
                f.truncate(end)
        entries = []
        for number, line in enumerate(data[:end].split(b"\n")[:-1], start=1):
            if line.strip():
                try:
                    entries.append(_parse_index_line(line))
                except ValueError as exc:
                    self._problem(job, f"{path} line {number}: unreadable index line: {exc}; left out")
        return entries

    # --- reading ---------------------------------------------------------------------

    def iterations(self, job: str, after_iteration: int = -1, since: float = 0.0) -> list[IterationTime]:
        """Iterations of `job` after `after_iteration` that have STEP_METRIC rows, ascending.
        An index entry (one write's rows of one iteration) counts when its oldest row is not
        older than `since`. Raises StoreError when the store directory is gone."""
        with self._lock:
            index = self._refresh(job)
            out = []
            for it in index.order[bisect_right(index.order, after_iteration):]:
                parts = [p for p in index.by_iteration[it] if p[1] >= since and p[3] > 0 and math.isfinite(p[0])]
                if parts:
                    out.append(IterationTime(iteration=it, step_ms=max(p[0] for p in parts),
                                             last_timestamp=max(p[2] for p in parts), ranks=sum(p[3] for p in parts)))
            return out

    def samples(self, job: str, first_iteration: int, last_iteration: int, since: float = 0.0) -> Iterator[Sample]:
        """Rows of `job` in [first_iteration, last_iteration] not older than `since`, ordered
        by iteration then rank. Raises StoreError when the store directory is gone."""
        table = self.table(job, first_iteration, last_iteration, since)
        return iter(table_to_samples(table))

    def tables(self, job: str, first_iteration: int, last_iteration: int, since: float = 0.0) -> Iterator[pa.Table]:
        """table() as the one table of an iterator (the rows are sorted in memory: nothing
        to stream). Raises StoreError when the store directory is gone."""
        yield self.table(job, first_iteration, last_iteration, since)

    def table(self, job: str, first_iteration: int, last_iteration: int, since: float = 0.0) -> pa.Table:
        """samples() as a SAMPLE_SCHEMA table. A frame that fails its checksum or a segment
        that is gone (damaged after it was indexed) is skipped and reported."""
        with self._lock:
            entries = [e for e in self._refresh(job).entries
                       if any(first_iteration <= it[0] <= last_iteration for it in e.its)]
        job_dir = os.path.join(self._jobs_dir, _job_dir_name(job))
        parts = []
        files: dict[int, object] = {}
        try:
            for e in entries:
                if e.seg not in files:
                    try:
                        files[e.seg] = open(os.path.join(job_dir, _segment_name(e.seg)), "rb")
                    except FileNotFoundError:
                        files[e.seg] = None
                        self._problem(job, f"{job_dir}/{_segment_name(e.seg)} is missing (removed after it was "
                                           "indexed); its rows are skipped")
                f = files[e.seg]
                if f is None:
                    continue
                f.seek(e.off)
                payload = _frame_at(f.read(e.length), 0)
                rows = None if payload is None else _decoded(payload)
                if rows is None or rows.num_rows != e.rows:
                    self._problem(job, f"{job_dir}/{_segment_name(e.seg)}: the frame at byte {e.off} fails its "
                                       f"checksum or was cut short after it was indexed; the rows of "
                                       f"{_iterations_of([e])} in it are skipped")
                    continue
                parts.append(rows)
        except OSError as exc:
            raise StoreError(f"{self.url}: cannot read job {job!r}: {exc}") from None
        finally:
            for f in files.values():
                if f is not None:
                    f.close()
        if not parts:
            return SAMPLE_SCHEMA.empty_table()
        rows = pa.concat_tables(parts)
        it, ts = rows.column("iteration"), rows.column("timestamp")
        rows = rows.filter(pc.and_(pc.and_(pc.greater_equal(it, first_iteration), pc.less_equal(it, last_iteration)),
                                   pc.greater_equal(ts, since)))
        rows = rows.take(pc.sort_indices(rows, [("iteration", "ascending"), ("rank", "ascending")]))
        rows = rows.append_column("job", pa.array([job] * rows.num_rows, pa.string()))
        return rows.select(SAMPLE_SCHEMA.names).cast(SAMPLE_SCHEMA)

    def jobs(self, since: float = 0.0) -> list[str]:
        """Job ids with an index entry whose oldest row is not older than `since`, sorted."""
        try:
            names = os.listdir(self._jobs_dir)
        except OSError as exc:
            raise StoreError(f"{self.url}: cannot list {self._jobs_dir}: {exc.strerror}") from None
        out = []
        with self._lock:
            for name in names:
                job = self._job_of(name)
                if job is None:
                    continue
                index = self._refresh(job)
                if any(p[1] >= since for it in index.order for p in index.by_iteration[it]):
                    out.append(job)
        return sorted(out)  # by id: digest-named directories sort apart from their ids

    def job_problems(self, job: str) -> list[str]:
        """The damage this store found in `job`'s files so far (the first MAX_JOB_PROBLEMS
        messages, each naming the file and the line or byte); [] when none."""
        return list(self._job_problems.get(job, ()))

    def _job_of(self, name: str) -> Optional[str]:
        """The job id of directory `name`; None for a digest-named one whose id file is not
        written yet (its first write is under way)."""
        if not name.startswith(_DIGEST_MARK):
            return unquote(name)
        try:
            with open(os.path.join(self._jobs_dir, name, _JOB_FILE), "rb") as f:
                return f.read().decode()
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise StoreError(f"{self.url}: cannot read the job id in {self._jobs_dir}/{name}: {exc}") from None

    def ping(self) -> None:
        """Returns when the store directory is there and writable; raises StoreError otherwise."""
        if not os.path.isdir(self._jobs_dir) or not os.access(self._jobs_dir, os.R_OK | os.W_OK | os.X_OK):
            raise StoreError(f"{self.url}: {self._jobs_dir} is missing or not readable and writable")

    def close(self) -> None:
        with self._lock:
            for writer in self._writers.values():
                os.close(writer.lock_fd)
            self._writers.clear()
            self._indexes.clear()

    def _refresh(self, job: str) -> _JobIndex:
        """Reads the index lines of `job` added since the last call; damaged ones are
        reported and skipped (see the module docstring). Holds self._lock."""
        index = self._indexes.setdefault(job, _JobIndex())
        job_dir = os.path.join(self._jobs_dir, _job_dir_name(job))
        path = os.path.join(job_dir, _INDEX)
        try:
            if index.offset and os.path.getsize(path) == index.offset:
                return index  # nothing new: one stat, the monitor's poll of a quiet job
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < index.offset:  # cut by a recovering writer: read it again
                    index = self._indexes[job] = _JobIndex()
                f.seek(index.offset)
                data = f.read()
        except FileNotFoundError:
            if not os.path.isdir(self._jobs_dir):
                raise StoreError(f"{self.url}: the store directory {self._jobs_dir} is missing") from None
            return index
        except OSError as exc:
            raise StoreError(f"{self.url}: cannot read {path}: {exc.strerror}") from None
        end = data.rfind(b"\n") + 1  # an unterminated last line is being written: read it next time
        segment_sizes: dict[int, Optional[int]] = {}
        for line in data[:end].split(b"\n")[:-1]:
            index.lines += 1
            if not line.strip():
                continue
            try:
                entry = _parse_index_line(line)
                self._check_in_segment(job_dir, entry, segment_sizes)
                if (entry.seg, entry.off) in index.frames:
                    raise ValueError(f"names the frame at byte {entry.off} of {_segment_name(entry.seg)} again (a "
                                     "duplicated line); read once")
            except ValueError as exc:
                self._problem(job, f"{path} line {index.lines}: unreadable index line: {exc}; its rows are not visible")
                continue
            index.frames.add((entry.seg, entry.off))
            index.entries.append(entry)
            for it, step_ms, first_ts, last_ts, ranks in entry.its:
                if it not in index.by_iteration:
                    index.by_iteration[it] = []
                    if index.order and it < index.order[-1]:
                        insort(index.order, it)
                    else:
                        index.order.append(it)
                index.by_iteration[it].append((math.nan if step_ms is None else step_ms, first_ts, last_ts, ranks))
        index.offset += end
        return index

    @staticmethod
    def _check_in_segment(job_dir: str, entry: _Entry, sizes: dict[int, Optional[int]]) -> None:
        """Raises ValueError when `entry`'s frame is not inside its segment (a segment's
        size is read once per refresh, again when a frame ends past it)."""
        size = sizes.get(entry.seg, -1)
        if size is not None and entry.end > size:
            try:
                size = sizes[entry.seg] = os.path.getsize(os.path.join(job_dir, _segment_name(entry.seg)))
            except FileNotFoundError:
                size = sizes[entry.seg] = None
        if size is None:
            raise ValueError(f"{_segment_name(entry.seg)} is missing: the rows of {_iterations_of([entry])} are lost")
        if entry.end > size:
            raise ValueError(f"its frame (bytes {entry.off:,} to {entry.end:,}) lies past the end of "
                             f"{_segment_name(entry.seg)} ({size:,} bytes): the segment was cut short (a crash, a "
                             f"full disk or a copy cut off) and the rows of {_iterations_of([entry])} are lost")

    def _problem(self, job: str, message: str) -> None:
        log.warning("%s", message)
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(message)
        kept = self._job_problems.setdefault(job, [])
        if len(kept) < MAX_JOB_PROBLEMS:
            kept.append(message)


def _append_to(path: str, data: bytes) -> int:
    """Appends `data` whole or not at all (relax_straggler.common.appending) to the file at `path`
    (created when missing); returns the offset it starts at. Raises OSError."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        return append_whole(fd, data)
    finally:
        os.close(fd)


def _index_line(entry: _Entry) -> bytes:
    """`entry`'s index line: its fields, then the crc32 of their text."""
    body = json.dumps({"seg": entry.seg, "off": entry.off, "len": entry.length, "rows": entry.rows,
                       "its": entry.its}, separators=(",", ":")).encode()
    return body[:-1] + _CRC_KEY + str(zlib.crc32(body)).encode() + b"}\n"


def _parse_index_line(line: bytes) -> _Entry:
    """The entry of one index line (without its newline). Raises ValueError saying what is
    wrong: not JSON (or nested too deep), a checksum that does not match, a key missing or
    unknown, a field of the wrong type or range. A line without "crc" (written before index
    lines had one) is read unchecked."""
    at = line.rfind(_CRC_KEY)
    if at >= 0:
        digits = line[at + len(_CRC_KEY):-1]
        if not (line.endswith(b"}") and digits.isdigit() and len(digits) <= 10):
            raise ValueError("its checksum is not a number")
        line = line[:at] + b"}"
        if zlib.crc32(line) != int(digits):
            raise ValueError("its checksum does not match its text (the line was changed after it was written)")
    try:
        raw = json.loads(line)
    except RecursionError:
        raise ValueError("nested too deep to be an index entry") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer of too many digits
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(raw, dict) or raw.keys() != _INDEX_KEYS:
        raise ValueError(f"not an index entry {{seg, off, len, rows, its}}: {str(raw)[:80]}")
    for name, low, high in (("seg", 1, _MAX_SEGMENT), ("off", 0, _MAX_INT), ("len", _HEADER.size, _MAX_INT),
                            ("rows", 1, _MAX_INT)):
        value = raw[name]
        if type(value) is not int or not low <= value <= high:
            raise ValueError(f"{name} must be an integer in [{low}, {high}], got {str(value)[:40]}")
    return _Entry(raw["seg"], raw["off"], raw["len"], raw["rows"], _checked_its(raw["its"]))


def _checked_its(its) -> list:
    """An index line's "its" ([[iteration, step_ms or None, first_ts, last_ts, ranks], ...]),
    or ValueError when it has another shape."""
    number = (int, float)
    if not isinstance(its, list) or not its or not all(
            isinstance(x, list) and len(x) == 5 and type(x[0]) is int and 0 <= x[0] <= _MAX_INT
            and (x[1] is None or isinstance(x[1], number)) and isinstance(x[2], number) and isinstance(x[3], number)
            and type(x[4]) is int and x[4] >= 0 for x in its):
        raise ValueError(f"'its' is not a list of [iteration, step_ms, first_ts, last_ts, ranks]: {str(its)[:80]}")
    return its


def _iterations_of(entries: Sequence[_Entry]) -> str:
    """'iterations 3-7' (or 'iteration 3') of the entries' frames, for messages."""
    its = [x[0] for e in entries for x in e.its]
    lo, hi = min(its), max(its)
    return f"iteration {lo}" if lo == hi else f"iterations {lo}-{hi}"


def _encode(rows: pa.Table) -> bytes:
    """One Arrow IPC stream of `rows`, zstd-compressed buffers (a 1,024-rank iteration of 5
    timers: 350 KB raw, 70 KB compressed, under 1 ms to encode)."""
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, _FRAME_SCHEMA, options=_IPC_OPTIONS) as writer:
        writer.write_table(rows.select(_FRAME_SCHEMA.names))
    return sink.getvalue().to_pybytes()


def _decoded(payload: bytes) -> Optional[pa.Table]:
    """The rows of a frame's payload, or None when they are not the frame schema's Arrow
    IPC stream (a payload whose checksum matches only by chance or by design)."""
    try:
        rows = ipc.open_stream(pa.py_buffer(payload)).read_all()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError):  # pyarrow's IOError on a bad stream
        return None
    return rows if rows.schema.equals(_FRAME_SCHEMA) else None


def _frame_at(data: bytes, pos: int) -> Optional[bytes]:
    """The payload of the frame at data[pos:], or None when it is torn or corrupt."""
    if len(data) - pos < _HEADER.size:
        return None
    magic, length, crc = _HEADER.unpack_from(data, pos)
    payload = data[pos + _HEADER.size: pos + _HEADER.size + length]
    if magic != MAGIC or len(payload) != length or zlib.crc32(payload) != crc:
        return None
    return payload


def _iteration_aggregates(rows: pa.Table) -> list:
    """[[iteration, step_ms or None, first_ts, last_ts, ranks], ...] of one frame: step_ms =
    max over ranks of STEP_METRIC's first value (ms), ranks = distinct ranks with STEP_METRIC."""
    times = rows.group_by("iteration").aggregate([("timestamp", "min"), ("timestamp", "max")])
    step_rows = rows.filter(pc.and_(pc.equal(rows.column("metric_name"), STEP_METRIC),
                                    pc.greater(pc.list_value_length(rows.column("metric_values")), 0)))
    step_rows = step_rows.append_column("first_value", pc.list_element(step_rows.column("metric_values"), 0))
    steps = step_rows.group_by("iteration").aggregate([("first_value", "max"), ("rank", "count_distinct")])
    maxima, ranks = steps.column("first_value_max").to_pylist(), steps.column("rank_count_distinct").to_pylist()
    step_of = dict(zip(steps.column("iteration").to_pylist(), zip(maxima, ranks)))
    out = []
    for it, lo, hi in zip(times.column("iteration").to_pylist(), times.column("timestamp_min").to_pylist(),
                          times.column("timestamp_max").to_pylist()):
        step_ms, ranks = step_of.get(it, (None, 0))
        if step_ms is not None and not math.isfinite(step_ms):
            step_ms = None
        out.append([it, step_ms, lo, hi, ranks])
    out.sort()
    return out
