"""Runtime control: pause, resume, change the sampling interval and the thresholds while
training runs, on every rank at the same step.

An operator writes a JSON object to the control file (``--straggler-control-file``)::

    {"enabled": false}                                     # pause: no step is sampled
    {"enabled": true, "interval": 20}                      # resume, sample every 20th step
    {"relative_threshold": 1.3, "absolute_ms_threshold": 8}

Only the metrics rank reads the file: every ``control_every`` steps it looks at the file's
modification time and, when the file changed, parses it. A malformed command (not JSON,
an unknown field, a value out of range) is refused with one warning naming the field and
changes nothing. The command travels to every rank in the metrics rank's next decision
(relax_straggler.live.lockstep), and every rank applies it at the same step. Paused, an
analyzer samples nothing and gathers nothing; the decisions go on, so that it can be
resumed.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any, Optional

from relax_straggler.common import thresholds

log = logging.getLogger(__name__)

# The largest sampling interval a command may set (the stage timer takes an int64; beyond a
# few billion steps no step would ever be sampled anyway).
MAX_INTERVAL = 2**31 - 1

@dataclass(frozen=True)
class ControlCommand:
    """A change to apply; None fields stay as they are. interval: steps (>= 1);
    relative_threshold (>= 1), absolute_ms_threshold (ms, >= 0): the slow-rank rule
    (relax_straggler.common.thresholds)."""

    enabled: Optional[bool] = None
    interval: Optional[int] = None
    relative_threshold: Optional[float] = None
    absolute_ms_threshold: Optional[float] = None

    def changes(self) -> dict[str, Any]:
        """The fields this command sets."""
        return {k: v for k, v in self.__dict__.items() if v is not None}


def parse_command(text: str, source: str) -> ControlCommand:
    """The command in `text` (a JSON object). Raises ValueError naming `source` and the
    offending field."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source}: not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{source}: expected a JSON object such as {{\"enabled\": false}}, got {type(obj).__name__}")
    known = set(ControlCommand.__dataclass_fields__)
    unknown = sorted(set(obj) - known)
    if unknown:
        raise ValueError(f"{source}: unknown field(s) {unknown}; known: {sorted(known)}")
    enabled, interval = obj.get("enabled"), obj.get("interval")
    if enabled is not None and not isinstance(enabled, bool):
        raise ValueError(f"{source}: enabled must be true or false, got {enabled!r}")
    if interval is not None and (isinstance(interval, bool) or not isinstance(interval, int)
                                 or not 1 <= interval <= MAX_INTERVAL):
        raise ValueError(f"{source}: interval must be an integer in [1, {MAX_INTERVAL}], got {interval!r}")
    for name in thresholds.FIELDS:
        value = obj.get(name)
        why = None if value is None else thresholds.violation(name, value)
        if why is not None:
            raise ValueError(f"{source}: {name} {why}, got {value!r}")
    command = ControlCommand(enabled, interval,
                             None if obj.get("relative_threshold") is None else float(obj["relative_threshold"]),
                             None if obj.get("absolute_ms_threshold") is None else float(obj["absolute_ms_threshold"]))
    if not command.changes():  # {} or only nulls
        raise ValueError(f"{source}: the command changes nothing")
    return command


class ControlFile:
    """The metrics rank's view of the control file: poll() returns a command once per change
    of the file, None otherwise (also for a malformed one, which is logged and refused)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._seen: Optional[tuple[int, int]] = None  # (mtime_ns, size) of the file last read
        self.refused = 0  # malformed commands

    def poll(self) -> Optional[ControlCommand]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("relax_straggler: control file %s cannot be read (%s)", self.path, exc)
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._seen:
            return None
        self._seen = stamp
        try:
            with open(self.path, encoding="utf-8") as fh:
                command = parse_command(fh.read(), self.path)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            self.refused += 1
            log.warning("relax_straggler: control command refused, nothing changed: %s", exc)
            return None
        log.info("relax_straggler: control command accepted: %s", command.changes())
        return command
