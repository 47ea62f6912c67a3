"""The fixed-shape per-rank payload gathered on every sampled step.

One float64 row per rank: [step, tokens, rank] followed by (device_ms, host_ms, calls)
for every stage in STAGES order. NaN marks "not measured" (no tokens given, stage not
run). Fixed size means one tensor gather, no pickling (Megatron Timers do the same).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from relax_straggler.stages import STAGES

HEADER = ("step", "tokens", "rank")
FIELDS = ("device_ms", "host_ms", "calls")
ROW_LEN = len(HEADER) + len(FIELDS) * len(STAGES)


def pack(step: int, tokens: float, rank: int, device_ms, host_ms, calls) -> np.ndarray:
    """One rank's row. device_ms / host_ms / calls: sequences of len(STAGES)."""
    row = np.empty(ROW_LEN, dtype=np.float64)
    row[0:3] = (step, tokens, rank)
    body = row[3:].reshape(len(STAGES), len(FIELDS))
    body[:, 0] = device_ms
    body[:, 1] = host_ms
    body[:, 2] = calls
    return row


@dataclass(frozen=True)
class Gathered:
    """All ranks' rows of one sampled step, unpacked. Arrays are (ranks,) or (ranks, stages)."""

    steps: np.ndarray
    tokens: np.ndarray
    device_ms: np.ndarray
    host_ms: np.ndarray
    calls: np.ndarray

    @property
    def num_ranks(self) -> int:
        return int(self.steps.shape[0])


def unpack(rows: np.ndarray) -> Gathered:
    """rows: (ranks, ROW_LEN) float64. Raises ValueError on a wrong shape."""
    rows = np.asarray(rows, dtype=np.float64)
    if rows.ndim != 2 or rows.shape[1] != ROW_LEN:
        raise ValueError(f"payload rows must have shape (ranks, {ROW_LEN}), got {rows.shape}")
    body = rows[:, 3:].reshape(rows.shape[0], len(STAGES), len(FIELDS))
    return Gathered(
        steps=rows[:, 0].copy(),
        tokens=rows[:, 1].copy(),
        device_ms=body[:, :, 0].copy(),
        host_ms=body[:, :, 1].copy(),
        calls=body[:, :, 2].copy(),
    )
