"""Lazy access to the two compiled extensions.

    core()  relax_straggler._core: the torch-free engine (statistics, verdicts, window
            detection, attribution, input scanners). Loading it never imports torch, so the
            offline analysis and the monitor service start quickly.
    ext()   relax_straggler._C: the LibTorch glue (StageTimer, the timed collective
            backend). torch is imported first: the extension links against libtorch.

A missing or stale build raises an ImportError that says how to build it.
"""

from __future__ import annotations

import functools
from types import ModuleType

_BUILD = "run `make build` (or `pip install --no-build-isolation -e .`) in the relax_straggler checkout"


@functools.cache
def core() -> ModuleType:
    """Returns relax_straggler._core. Raises ImportError with build instructions if absent."""
    try:
        from relax_straggler import _core
    except ImportError as exc:
        raise ImportError(f"relax_straggler._core is not built: {_BUILD}. Cause: {exc}") from exc
    return _core


@functools.cache
def ext() -> ModuleType:
    """Returns relax_straggler._C. Raises ImportError with build instructions if absent."""
    import torch  # noqa: F401  (loads libtorch for the extension)

    try:
        from relax_straggler import _C
    except ImportError as exc:
        raise ImportError(
            f"relax_straggler._C is not built or does not match the installed torch ({torch.__version__}): "
            f"{_BUILD}. Cause: {exc}"
        ) from exc
    return _C
