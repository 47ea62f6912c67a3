"""Appends that leave a file whole: a record is in the file entirely or not at all.

The files the package appends records to (the JSONL report file, the file store's segments
and index, the monitor's state journal) are read back line by line or frame by frame. A
write cut short by a full disk (ENOSPC), a file size limit or a quota would leave half a
record, which the reader must then tell from damage; instead the file is cut back to where
the record began before the error is raised.
"""

from __future__ import annotations

import contextlib
import os


def append_whole(fd: int, data: bytes) -> int:
    """Appends `data` to the file open at `fd` (O_APPEND; one writer at a time: the caller
    holds the file's lock, if others may append). Returns the offset `data` starts at.
    Raises the OSError of a failed write after cutting the file back to that offset (a
    failing cut is left to the reader's checks: the error raised is the write's)."""
    start = os.lseek(fd, 0, os.SEEK_END)
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, start)
        raise
    return start
