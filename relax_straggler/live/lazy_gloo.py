"""Gloo's lazy connection set-up: a group created with it connects a pair of ranks on their
first exchange instead of every pair at creation."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

LAZY_ENV = "TORCH_GLOO_LAZY_INIT"  # read by ProcessGroupGloo when it creates a group (torch 2.13 does)


def lazy_by_environment() -> bool:
    """Whether the process's environment already asks Gloo for lazy connections: LAZY_ENV set
    to a value torch reads as true (1, y, yes, t, true; any case)."""
    return os.environ.get(LAZY_ENV, "").lower() in ("1", "y", "yes", "t", "true")


@contextlib.contextmanager
def lazy_connections(enabled: bool) -> Iterator[None]:
    """Gloo groups created inside connect each pair on first use instead of all pairs at
    creation (where the installed torch reads LAZY_ENV; elsewhere they connect eagerly, as
    without it). Every member must create a group alike: an eager member would wait at
    creation for connections its lazy peers never open."""
    if not enabled:
        yield
        return
    before = os.environ.get(LAZY_ENV)
    os.environ[LAZY_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ[LAZY_ENV]
        else:
            os.environ[LAZY_ENV] = before
