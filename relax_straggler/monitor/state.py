"""The monitor's state file: an append-only journal of job records.

    line 1   {"version": 2, "store": URL}
    then     {"job": ID, "record": {...}}     the job's whole record (JobRecord.to_dict) as of now
             {"job": ID, "deleted": true}     the job was unregistered
             {"job": ID, "seen": [IT, AT]}    iteration IT of the job arrived at AT (s since the
                                              epoch), after its last record: the hang clock

The newest record line of a job wins; a "seen" line after it adds to it (read_state puts it
in the record as "seen"). A change appends one line (one write call, before the change is
acknowledged), so its cost does not grow with the number of jobs, and a process killed at
any moment (kill -9) loses nothing acknowledged: the bytes are in the kernel once write()
returns; a write that fails (a full disk) leaves no part of its line. A poll that saw new
iterations appends one "seen" line per such job, in one write. A torn last line (a write
cut off mid-line) is dropped at load; it was never acknowledged. The journal is compacted
(rewritten with one line per job, to a temporary file renamed over it) at start, at stop
and whenever it grows past COMPACT_FACTOR times its live lines plus COMPACT_MIN_BYTES, so
its size stays proportional to the state and compaction costs O(1) per change on average.

A version 1 state file (one JSON object {"version": 1, "store", "jobs": {ID: record}}) is
read as well; the compaction at start rewrites it as a journal.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Callable, Optional

from relax_straggler.common.appending import append_whole

log = logging.getLogger(__name__)

STATE_VERSION = 2
# Compact when the journal holds more than COMPACT_FACTOR x its live bytes + COMPACT_MIN_BYTES.
COMPACT_FACTOR = 2
COMPACT_MIN_BYTES = 1 << 20


def read_state(path: str) -> dict:
    """The state the journal (or a version 1 file) at `path` holds: {"version", "store",
    "jobs": {job_id: record}, "lines": {job_id: the line number of its record}}. Raises
    FileNotFoundError, OSError, or ValueError naming the line when it is not a monitor state."""
    with open(path, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    torn = lines.pop()  # b"" when the file ends with a newline
    head = _entry(lines[0] if lines else torn, 1)
    if isinstance(head, dict) and head.get("version") == 1 and isinstance(head.get("jobs"), dict):
        return {"version": 1, "store": head.get("store"), "jobs": head["jobs"], "lines": {}}
    if not (isinstance(head, dict) and head.get("version") == STATE_VERSION):
        raise ValueError(f"not a version {STATE_VERSION} (or 1) monitor state")
    if not lines:  # the header alone, torn: nothing was acknowledged after it
        return {"version": STATE_VERSION, "store": head.get("store"), "jobs": {}, "lines": {}}
    if torn:
        log.warning("%s: torn last line (%d bytes) dropped: a write cut off before it was acknowledged", path,
                    len(torn))
    jobs: dict[str, dict] = {}
    numbers: dict[str, int] = {}
    for number, line in enumerate(lines[1:], start=2):
        entry = _entry(line, number)
        try:
            job = entry["job"]
            if not isinstance(job, str):
                raise TypeError("job is not a string")
            if entry.get("deleted"):
                jobs.pop(job, None)
                numbers.pop(job, None)
            elif "seen" in entry:
                iteration, at = entry["seen"]
                if type(iteration) is not int or not isinstance(at, (int, float)):
                    raise TypeError("seen is not [iteration, time]")
                if job in jobs:
                    jobs[job]["seen"] = [iteration, at]
            elif isinstance(entry["record"], dict):
                jobs[job] = entry["record"]
                numbers[job] = number
            else:
                raise TypeError("record is not an object")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"line {number}: malformed journal entry ({exc!r})") from None
    return {"version": STATE_VERSION, "store": head.get("store"), "jobs": jobs, "lines": numbers}


def _entry(line: bytes, number: int):
    """The JSON value of journal line `number`. Raises ValueError naming the line."""
    try:
        return json.loads(line)
    except RecursionError:
        raise ValueError(f"line {number}: nested too deep to be a journal entry") from None
    except ValueError as exc:
        raise ValueError(f"line {number}: not JSON ({exc})") from None


class StateJournal:
    """Appends job records to the journal at `path` of the monitor of `store_url`.
    snapshot: every job's record now ({job_id: record}), called for compaction.
    Not thread-safe: the monitor serialises calls (and takes each record's snapshot inside
    the same serialisation, so a newer record is never followed by an older one)."""

    def __init__(self, path: str, store_url: str, snapshot: Callable[[], dict]) -> None:
        self.path = path
        self.store_url = store_url
        self._snapshot = snapshot
        self._fd: Optional[int] = None
        self._sizes: dict[str, int] = {}  # job -> bytes of its newest record line
        self._seen_sizes: dict[str, int] = {}  # job -> bytes of its "seen" line since that record
        self._live = 0
        self._bytes = 0
        # An append failed: the file may lack a change, so the next save compacts instead.
        self.needs_compaction = False

    def put(self, job_id: str, record: Optional[dict]) -> None:
        """Appends `job_id`'s record (None: unregistered). Raises OSError."""
        if self.needs_compaction or self._fd is None:
            self.compact()
            return
        if record is None:
            if job_id not in self._sizes:
                return  # never written, or its deletion is written already
            line = _line({"job": job_id, "deleted": True})
        else:
            line = _line({"job": job_id, "record": record})
        self._append(line)
        self._live -= self._sizes.pop(job_id, 0) + self._seen_sizes.pop(job_id, 0)
        if record is not None:
            self._sizes[job_id] = len(line)
            self._live += len(line)
        self._compact_when_grown()

    def put_seen(self, seen: dict) -> None:
        """Appends, in one write, that iteration IT of each job arrived at AT ({job_id:
        (IT, AT)}; jobs never written are left out). Raises OSError."""
        if self.needs_compaction or self._fd is None:
            self.compact()
            return
        lines = {job: _line({"job": job, "seen": [it, at]}) for job, (it, at) in seen.items() if job in self._sizes}
        if not lines:
            return
        self._append(b"".join(lines.values()))
        for job, line in lines.items():
            self._live += len(line) - self._seen_sizes.get(job, 0)
            self._seen_sizes[job] = len(line)
        self._compact_when_grown()

    def _append(self, data: bytes) -> None:
        try:
            append_whole(self._fd, data)
        except OSError:
            self.needs_compaction = True
            raise
        self._bytes += len(data)

    def _compact_when_grown(self) -> None:
        if self._bytes > COMPACT_FACTOR * self._live + COMPACT_MIN_BYTES:
            self.compact()

    def compact(self) -> None:
        """Rewrites the journal as one line per job of snapshot() (temporary file, fsync,
        rename). Raises OSError (the journal is left as it was)."""
        records = self._snapshot()
        tmp = f"{self.path}.tmp"
        sizes: dict[str, int] = {}
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            head = _line({"version": STATE_VERSION, "store": self.store_url})
            chunks = [head]
            for job_id, record in records.items():
                line = _line({"job": job_id, "record": record})
                sizes[job_id] = len(line)
                chunks.append(line)
            append_whole(fd, b"".join(chunks))
            os.fsync(fd)  # the rename must not publish a file whose bytes a crash could lose
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        self.close()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self._sizes, self._seen_sizes = sizes, {}
        self._live = sum(sizes.values())
        self._bytes = len(head) + self._live
        self.needs_compaction = False

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _line(entry: dict) -> bytes:
    return json.dumps(entry, separators=(",", ":")).encode() + b"\n"
