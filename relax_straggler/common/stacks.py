"""A rank's sampled Python stack as the verdict carries it, and its form in the row.

relax_straggler.live.stack_sampler takes the samples on the rank the metrics rank named; they
travel once in that rank's row (relax_straggler.common.payload, STACK_LEN floats: the samples taken,
the count of each of the TOP most frequent frames, and their text, "file:line:function" per
line, UTF-8, 6 bytes per float64, exact below 2**53) and reach Facts.stack
(relax_straggler.judge.confirm).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

TOP = 3  # frames reported
TEXT_FLOATS = 32  # 192 bytes of text
STACK_LEN = 1 + TOP + TEXT_FLOATS  # [samples taken, count of each frame, text]
_BYTES_PER_FLOAT = 6


@dataclass(frozen=True)
class StackFrame:
    """One code location a rank's training thread was found in: file name (no directory),
    line, function, and in how many of the samples."""

    file: str
    line: int
    function: str
    count: int

    def describe(self) -> str:
        return f"{self.file}:{self.line} {self.function}"


@dataclass(frozen=True)
class StackSample:
    """A rank's sampled stack: its most frequent frames, most frequent first, of `samples`."""

    samples: int
    frames: tuple[StackFrame, ...]

    def describe(self) -> str:
        """e.g. "train.py:42 spin_outside_sections in 9 of 12 samples"."""
        return "; ".join(f"{f.describe()} in {f.count} of {self.samples} samples" for f in self.frames)


def encode(sample: StackSample) -> np.ndarray:
    """The row segment of `sample`: (STACK_LEN,) float64. Frames that do not fit the text's
    192 bytes whole are left out (their counts stay in `samples`)."""
    out = np.full(STACK_LEN, np.nan)
    out[0] = sample.samples
    text = b""
    for i, f in enumerate(sample.frames[:TOP]):
        line = f"{f.file}:{f.line}:{f.function}".encode("utf-8", "replace") + b"\n"
        if len(text) + len(line) > TEXT_FLOATS * _BYTES_PER_FLOAT:
            break
        text += line
        out[1 + i] = f.count
    text = text.ljust(TEXT_FLOATS * _BYTES_PER_FLOAT, b"\0")
    for i in range(TEXT_FLOATS):
        out[1 + TOP + i] = int.from_bytes(text[i * _BYTES_PER_FLOAT:(i + 1) * _BYTES_PER_FLOAT], "big")
    return out


def decode(segment: np.ndarray) -> Optional[StackSample]:
    """The StackSample a row segment holds, or None (NaN: no sample travelled). Raises
    ValueError naming what is malformed."""
    segment = np.asarray(segment, dtype=np.float64)
    if segment.shape != (STACK_LEN,):
        raise ValueError(f"stack segment must have shape ({STACK_LEN},), got {segment.shape}")
    if not np.isfinite(segment[0]):
        return None
    words = segment[1 + TOP:]
    if not (np.isfinite(words).all() and (words >= 0).all() and (words < 2 ** 48).all()
            and (words == np.floor(words)).all()):
        raise ValueError("stack segment: its text is not whole 6-byte words")
    text = b"".join(int(w).to_bytes(_BYTES_PER_FLOAT, "big") for w in words).rstrip(b"\0").decode("utf-8", "replace")
    frames = []
    for i, line in enumerate(text.splitlines()[:TOP]):
        file, lineno, function = line.split(":", 2)
        frames.append(StackFrame(file, int(lineno), function, int(segment[1 + i])))
    return StackSample(int(segment[0]), tuple(frames))
