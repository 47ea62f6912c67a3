"""The small checks of configuration and input values, written once.

A bool is never a number here: Python counts True as the int 1, but a flag or a field set
to True where a count, a rank or a threshold belongs is a mistake to report, not 1.
Torch-free and numpy-free: numpy's scalars are recognised through the `numbers` ABCs.
"""

from __future__ import annotations

import math
import numbers

# The window ensemble compares the reports it holds: a window needs at least two.
MIN_WINDOW_SIZE = 2


def is_int(x: object, *, numpy: bool = False) -> bool:
    """Whether x is an int and not a bool; with numpy=True numpy's integer scalars count too
    (values read from arrays)."""
    if isinstance(x, bool):
        return False
    return isinstance(x, numbers.Integral) if numpy else isinstance(x, int)


def is_finite(x: object) -> bool:
    """Whether x is a finite int or float and not a bool."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def require_int(value: object, name: str, minimum: int) -> None:
    """Raises ValueError("<name> must be an integer >= <minimum>, got <value!r>") unless
    value is an int (not a bool) >= minimum."""
    if not is_int(value) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def require_window_size(value: object, name: str) -> None:
    """Raises ValueError("<name> must be an integer >= 2, got <value!r>") unless value is a
    window size: an int of at least MIN_WINDOW_SIZE reports."""
    require_int(value, name, MIN_WINDOW_SIZE)
