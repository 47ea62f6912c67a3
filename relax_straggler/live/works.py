"""How a c10d Work of the analyzer's side group ended, without trusting the timeout's exception.

`Work.wait(timeout)` raises RuntimeError("Operation timed out!") when its limit passes
before the work completes, and the work may complete an instant later, before the caller
looks at it again: a late but successful collective then looks like a failed one. So the
limit's exception is never read as an outcome. A work is judged only once
`is_completed()` says it finished; `wait()` without a limit then returns at once, or
raises the work's own error.
"""

from __future__ import annotations

import ctypes
from datetime import timedelta
from enum import Enum
from typing import Any, Optional


class Outcome(Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


def outcome(work: Any, timeout_s: float = 0.0) -> tuple[Outcome, Optional[BaseException]]:
    """Waits at most timeout_s s (0: only looks) for `work` (a torch.distributed Work).
    Returns (RUNNING, None) while it has not finished, (SUCCEEDED, None), or (FAILED, the
    work's error)."""
    if not work.is_completed() and timeout_s > 0:
        try:
            work.wait(timedelta(seconds=max(timeout_s, 0.001)))  # 0 would mean no limit
        except RuntimeError:
            pass  # the limit passed, or the work failed: told apart below
    if not work.is_completed():
        return Outcome.RUNNING, None
    try:
        work.wait()  # finished: returns at once, or raises the work's own error
    except RuntimeError as exc:
        return Outcome.FAILED, exc
    return Outcome.SUCCEEDED, None


def reason(exc: BaseException, limit: int = 160) -> str:
    """An error as one short line for a warning (Gloo's messages run to several sentences)."""
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    return line if len(line) <= limit else line[:limit - 3] + "..."


def never_free(*held: Any) -> None:
    """Never frees `held`: a side group with a collective that waits for a stopped rank, and
    the unfinished collectives themselves (their Work, which holds their tensors). A Gloo
    group's destructor joins its worker threads, which such a collective holds until Gloo's
    own timeout (30 min by default): freed at uninstall or at interpreter exit, the group
    would hold the process that long. And were the last reference to an unfinished Work
    dropped, the worker thread would free its tensors when the collective ends, taking the
    interpreter lock to do so; a thread that takes it while the interpreter exits aborts
    the process ("terminate called without an active exception"). Kept referenced, they
    end with the process."""
    for obj in held:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
