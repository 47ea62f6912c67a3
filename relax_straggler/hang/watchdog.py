"""HangWatchdog: a thread per rank that notices when no step has ended for hang_s seconds.

It only reads: the step counter (polled; the training thread does nothing for it), the
collective layer's progress counters and whether the training thread is inside the
analyzer itself (then a stop is the analyzer's fault, and the answer says so first). At a hang it writes this rank's snapshot
through the StoreChannel (bounded by the channel's timeout), once per hang; when steps
end again it removes it. The analyst then reads every rank's snapshot and publishes the
answer once per hang: the metrics rank, or, when the metrics rank has published nothing
collect_s after this rank's own snapshot (stopped or dead), the first other rank to
claim the hang in the store. A rank other than the metrics rank makes at most eight store
calls per hang, whatever the job's size (its snapshot and its count, one look for the metrics
rank's, the claim, the removal and its count, the claim's release); the answering rank polls
the count and reads every snapshot once (two calls when all are in).
No process group is used, so neither a stuck training group nor the analyzer's side group
can hold the answer back (docs/DESIGN.md, "When the job stops"). Errors are logged once
per hang and never reach training.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Optional

from relax_straggler.hang.channel import StoreChannel
from relax_straggler.hang.diagnose import HangAnswer, diagnose

log = logging.getLogger(__name__)


class HangWatchdog:
    """rank: this global rank; ranks: every analysed global rank; metrics_rank: the global
    rank that normally answers. steps() -> steps ended so far; progress() -> the groups'
    progress (CollectiveLayer.progress, or [] without the collective layer); inside() ->
    what the training thread does inside the analyzer (Analyzer.inside), or None. publish(answer)
    is called once per hang on the analysing rank. hang_s > 0; poll_s and collect_s default
    to min(1, hang_s / 4) and min(10, max(2, hang_s / 2))."""

    def __init__(self, *, rank: int, ranks: list[int], metrics_rank: int, hang_s: float,
                 steps: Callable[[], int], progress: Callable[[], list[dict[str, Any]]], channel: StoreChannel,
                 publish: Callable[[HangAnswer], None], inside: Callable[[], Optional[dict[str, Any]]] = lambda: None,
                 poll_s: float = 0.0, collect_s: float = 0.0) -> None:
        if not hang_s > 0:
            raise ValueError(f"hang_s must be > 0, got {hang_s!r}")
        self.rank, self.ranks, self.metrics_rank, self.hang_s = rank, sorted(ranks), metrics_rank, hang_s
        self._steps, self._progress, self._channel, self._publish = steps, progress, channel, publish
        self._inside = inside
        self.poll_s = poll_s or min(1.0, hang_s / 4)
        self.collect_s = collect_s or min(10.0, max(2.0, hang_s / 2))
        self.answers = 0  # hangs answered by this rank
        self._claimed = False  # this rank holds the store's claim of the current hang
        self._since_wall = 0.0  # snapshots older than this (wall s) are left from an earlier hang
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="relax_straggler-hang", daemon=True)

    def start(self) -> "HangWatchdog":
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 1.0) -> None:
        """Stops the thread (waits at most timeout_s; a store call in flight ends by its own timeout)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        last = self._steps()
        changed = time.monotonic()
        published_at = None  # monotonic time this rank's snapshot of the current hang was written
        answered, failed = False, False
        while not self._stop.wait(self.poll_s):
            now, steps = time.monotonic(), self._steps()
            if steps != last:
                last, changed = steps, now
                if published_at is not None:
                    self._quietly(lambda: self._channel.delete_snapshot(self.rank), "remove its snapshot")
                if self._claimed:
                    self._quietly(self._channel.release_claim, "release its claim")
                published_at, answered, failed, self._claimed = None, False, False, False
                continue
            stalled = now - changed
            if last < 1 or stalled < self.hang_s or failed:  # armed once a first step has ended
                continue
            if published_at is None:
                snap = {"rank": self.rank, "step": last - 1, "wall": time.time(), "stalled_s": stalled,
                        "groups": self._progress(), "analyzer": self._inside()}
                if not self._quietly(lambda: self._channel.put_snapshot(self.rank, snap), "publish its snapshot"):
                    failed = True  # the store is unreachable: nothing more this hang
                    continue
                published_at, self._since_wall = now, time.time() - stalled - self.hang_s
            if answered or (self.rank != self.metrics_rank and now - published_at < self.collect_s):
                continue
            answered = True  # decided once per hang: answer now, or leave it to the metrics rank
            try:
                if not self._is_analyst():
                    continue
            except Exception as exc:  # the store went away mid-hang
                log.warning("relax_straggler: the hang watchdog could not read the snapshots: %s", exc)
                continue
            # The metrics rank waits up to collect_s for the others; a stand-in has waited already.
            wait_s = self.collect_s if self.rank == self.metrics_rank else 0.0
            self._quietly(lambda: self._answer(wait_s), "answer the hang")

    def _is_analyst(self) -> bool:
        if self.rank == self.metrics_rank:
            return True
        metrics = self._channel.snapshots([self.metrics_rank]).get(self.metrics_rank)
        if metrics is not None and metrics.get("wall", 0) >= self._since_wall:
            return False  # the metrics rank is alive and answers
        self._claimed = self._channel.claim()
        return self._claimed

    def _answer(self, wait_s: float) -> None:
        """Reads every snapshot once they are all in (the store's count says so), or what is
        there after wait_s: one call a poll while waiting, and one more full read only when
        a count reached early (a snapshot left from an earlier hang) missed a late rank."""
        deadline = time.monotonic() + wait_s
        seen = -1  # the count at the last full read
        snaps: dict[int, dict[str, Any]] = {}
        while True:
            count = self._channel.published()
            expired = time.monotonic() >= deadline or self._stop.is_set()
            if (count >= len(self.ranks) and count != seen) or expired:
                seen = count
                snaps = {r: s for r, s in self._channel.snapshots(self.ranks).items()
                         if s.get("wall", 0) >= self._since_wall}
                if len(snaps) == len(self.ranks) or expired:
                    break
            time.sleep(min(0.2, self.poll_s))
        answer = diagnose(snaps, self.ranks, now=time.time())
        log.warning("relax_straggler: hang: %s", answer.text())
        self.answers += 1
        self._publish(answer)
        self._channel.put_answer({**answer.metrics(), "answered_by": self.rank, "wall": time.time()})

    def _quietly(self, call: Callable[[], Any], what: str) -> bool:
        try:
            call()
            return True
        except Exception as exc:  # a store gone or slow: the watchdog gives up on this hang, training goes on
            log.warning("relax_straggler: the hang watchdog could not %s: %s", what, exc)
            return False
