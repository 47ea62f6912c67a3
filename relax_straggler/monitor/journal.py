"""The monitor's registered jobs in its state file (the journal of state.py).

Each change of a job (registration, topology, detector state, results, a window whose
analysis had not finished) is appended before the change is acknowledged, and every job is
read back at start: a restart of the monitor (even kill -9) or of the store loses no
registered job and no result. A poll that saw new iterations appends when they arrived (one
"seen" line per job), so the hang clock goes on across a restart. A write that fails is
logged, not raised: the monitor goes on, and the next save rewrites the whole file.
"""

from __future__ import annotations

import logging
import os
import threading

from relax_straggler.monitor.jobs import JobRecord
from relax_straggler.monitor.state import StateJournal, read_state
from relax_straggler.monitor.trigger import TriggerConfig
from relax_straggler.stores.url import redact

log = logging.getLogger(__name__)


class JobJournal:
    """Saves the jobs of `jobs` (the monitor's {job_id: JobRecord}, guarded by `lock`) to
    the state file at `path` of the store `store_shown` (its URL without the password)."""

    def __init__(self, path: str, store_shown: str, jobs: dict[str, JobRecord], lock: threading.RLock) -> None:
        self.path = path
        self._store_shown = store_shown
        self._jobs = jobs
        self._lock = lock
        self._save_lock = threading.Lock()
        self._journal = StateJournal(path, store_shown, self._snapshot)

    def _snapshot(self) -> dict:
        with self._lock:
            return {j: r.to_dict() for j, r in self._jobs.items()}

    def restore(self, trigger: TriggerConfig) -> None:
        """Reads the state file into `jobs` (detectors with `trigger`'s thresholds) and
        compacts it; a missing file starts empty. Raises ValueError, naming the file (and the
        line of a malformed record), when it cannot be read or written or holds the state
        of another store."""
        path = self.path
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)  # once: never re-made by a save
        except OSError as exc:
            raise ValueError(f"state file {path}: cannot create its directory: {exc.strerror}") from None
        try:
            state = read_state(path)
        except FileNotFoundError:
            state = None
        except (OSError, ValueError) as exc:
            raise ValueError(f"state file {path}: cannot read it: {exc}; move it away to start empty") from None
        if state is not None:
            # Compared without passwords: a rotated password is the same store.
            if redact(state["store"]) != self._store_shown:
                raise ValueError(f"state file {path}: the state of store {redact(state['store'])}, not of "
                                 f"{self._store_shown}; give this store its own --state file")
            for job_id, raw in state["jobs"].items():
                try:
                    record = JobRecord.from_dict(job_id, raw, trigger)
                except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as exc:
                    where = f"{path} line {state['lines'][job_id]}" if job_id in state["lines"] else path
                    raise ValueError(f"state file {where}: malformed record of job {job_id!r}: {exc!r}; move the "
                                     "file away to start empty") from None
                self._jobs[job_id] = record
            log.info("state file %s: %d registered job(s) restored", path, len(self._jobs))
        try:
            self._journal.compact()  # drops a torn last line and superseded records; appends go on from here
        except OSError as exc:
            raise ValueError(f"state file {path}: cannot write it: {exc}") from None

    def save(self, job_id: str) -> None:
        """Appends `job_id`'s record (or its removal) to the state journal."""
        with self._save_lock:  # the snapshot is taken inside it: a newer record is never followed by an older
            with self._lock:
                record = self._jobs.get(job_id)
                raw = None if record is None else record.to_dict()
            try:
                self._journal.put(job_id, raw)
            except OSError as exc:  # e.g. the store directory is away; the next save rewrites everything
                log.error("cannot write the state file %s: %s (changes since the last save would not survive a "
                          "restart)", self.path, exc)

    def save_seen(self, seen: dict) -> None:
        """Appends when each job's newest iteration arrived ({job_id: (iteration, s)})."""
        if not seen:
            return
        with self._save_lock:
            try:
                self._journal.put_seen(seen)
            except OSError as exc:
                log.error("cannot write the state file %s: %s (a restart would restart the hang clock of %d job(s))",
                          self.path, exc, len(seen))

    def save_all(self) -> None:
        """Rewrites the state file with every job (compaction)."""
        with self._save_lock:
            try:
                self._journal.compact()
            except OSError as exc:
                log.error("cannot write the state file %s: %s", self.path, exc)

    def close(self) -> None:
        """Closes the file; nothing is written after (a monitor killed now loses nothing acknowledged)."""
        self._journal.close()
