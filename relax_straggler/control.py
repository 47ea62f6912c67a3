"""Runtime control: pause, resume, change the sampling interval and the thresholds while
training runs, on every rank at the same step.

An operator writes a JSON object to the control file (``--straggler-control-file``)::

    {"enabled": false}                                     # pause: no step is sampled
    {"enabled": true, "interval": 20}                      # resume, sample every 20th step
    {"relative_threshold": 1.3, "absolute_ms_threshold": 8}

Only the metrics rank reads the file: every ``control_every`` steps it looks at the file's
modification time and, when the file changed, parses it. A malformed command (not JSON,
an unknown field, a value out of range) is refused with one warning naming the field and
changes nothing. The command travels to every rank over the side Gloo group as one fixed
float64 row (an async broadcast launched at step s and read at step s + control_every,
long finished by then since training keeps the ranks within a step of each other), and
every rank applies it at that same step. Paused, an analyzer samples nothing and gathers
nothing; it keeps this one broadcast every control_every steps, so that it can be resumed.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Optional

import numpy as np
import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

# The largest sampling interval a command may set (the stage timer takes an int64; beyond a
# few billion steps no step would ever be sampled anyway).
MAX_INTERVAL = 2**31 - 1

@dataclass(frozen=True)
class ControlCommand:
    """A change to apply; None fields stay as they are. interval: steps (>= 1);
    relative_threshold (>= 1), absolute_ms_threshold (ms, >= 0): the RFC rule."""

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
    for name, low in (("relative_threshold", 1.0), ("absolute_ms_threshold", 0.0)):
        value = obj.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or value < low):
            raise ValueError(f"{source}: {name} must be a finite number >= {low:g}, got {value!r}")
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


def _encode(sequence: int, command: Optional[ControlCommand]) -> np.ndarray:
    # [sequence, enabled (-1 unchanged, 0, 1), interval (0 unchanged), relative_threshold,
    # absolute_ms_threshold (NaN unchanged)]
    row = np.array([sequence, -1, 0, math.nan, math.nan], dtype=np.float64)
    if command is not None:
        if command.enabled is not None:
            row[1] = float(command.enabled)
        if command.interval is not None:
            row[2] = command.interval
        if command.relative_threshold is not None:
            row[3] = command.relative_threshold
        if command.absolute_ms_threshold is not None:
            row[4] = command.absolute_ms_threshold
    return row


def _decode(row: np.ndarray) -> Optional[ControlCommand]:
    command = ControlCommand(None if row[1] < 0 else bool(row[1]), None if row[2] < 1 else int(row[2]),
                             None if math.isnan(row[3]) else float(row[3]),
                             None if math.isnan(row[4]) else float(row[4]))
    return command if command.changes() else None


class ControlChannel:
    """Carries the metrics rank's commands to every rank of the side group.

    group / source: the side Gloo group and the global rank of the metrics rank;
    control_file: the metrics rank's ControlFile (None elsewhere); every: steps between
    broadcasts (>= 1). at_step(step) is called by every rank at the end of every step and
    returns the command to apply from the next step on, identical on every rank; it raises
    RuntimeError when the previous broadcast failed or did not finish within wait_s seconds
    (a rank gone or stopped).
    """

    def __init__(self, group: Any, source: int, control_file: Optional[ControlFile], every: int,
                 wait_s: float = 300.0) -> None:
        if every < 1:
            raise ValueError(f"--straggler-control-every must be >= 1, got {every}")
        self._group, self._source, self._file, self.every = group, source, control_file, every
        self._wait = timedelta(seconds=wait_s)
        self._sequence = 0
        self._in_flight: Optional[tuple[Any, torch.Tensor]] = None

    @property
    def refused(self) -> int:
        """Malformed commands refused (metrics rank; 0 elsewhere)."""
        return self._file.refused if self._file is not None else 0

    def at_step(self, step: int) -> Optional[ControlCommand]:
        if step % self.every:
            return None
        command = None
        if self._in_flight is not None:
            work, buffer = self._in_flight
            work.wait(self._wait)
            command = _decode(buffer.numpy())
        self._sequence += 1
        outgoing = self._file.poll() if self._file is not None else None
        buffer = torch.from_numpy(_encode(self._sequence, outgoing))
        self._in_flight = (dist.broadcast(buffer, src=self._source, group=self._group, async_op=True), buffer)
        return command

    def close(self, timeout_s: float = 5.0) -> bool:
        """Waits at most timeout_s s for the last broadcast (every rank launched it), before
        the group goes. False when it is still unfinished (a rank stopped); raises
        RuntimeError when it failed."""
        if self._in_flight is None:
            return True
        work, self._in_flight = self._in_flight[0], None
        try:
            work.wait(timedelta(seconds=max(timeout_s, 0.001)))  # 0 would mean no limit
        except RuntimeError:
            if not work.is_completed():
                return False
            raise
        return True


class LocalControl:
    """ControlChannel for a single process (torch.distributed not initialized): the same
    cadence, a command polled at step s applies from step s + every."""

    def __init__(self, control_file: ControlFile, every: int) -> None:
        if every < 1:
            raise ValueError(f"--straggler-control-every must be >= 1, got {every}")
        self._file, self.every = control_file, every
        self._pending: Optional[ControlCommand] = None

    @property
    def refused(self) -> int:
        return self._file.refused

    def at_step(self, step: int) -> Optional[ControlCommand]:
        if step % self.every:
            return None
        command, self._pending = self._pending, self._file.poll()
        return command

    def close(self, timeout_s: float = 5.0) -> bool:
        return True
