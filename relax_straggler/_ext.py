"""Lazy access to the compiled extension relax_straggler._C.

torch must be imported before the extension (it links against libtorch); a missing or
stale build raises an ImportError that says how to build it.
"""

from __future__ import annotations

import functools
from types import ModuleType


@functools.cache
def ext() -> ModuleType:
    """Returns relax_straggler._C. Raises ImportError with build instructions if absent."""
    import torch  # noqa: F401  (loads libtorch for the extension)

    try:
        from relax_straggler import _C
    except ImportError as exc:
        raise ImportError(
            "relax_straggler._C is not built or does not match the installed torch "
            f"({torch.__version__}): run `make build` (or `pip install --no-build-isolation -e .`) "
            f"in the relax_straggler checkout. Cause: {exc}"
        ) from exc
    return _C
