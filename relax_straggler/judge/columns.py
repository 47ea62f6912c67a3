"""A report's columns laid out in every stage of STAGES, as the confirmed verdict takes them."""

from __future__ import annotations

import numpy as np

from relax_straggler.common.payload import KernelMatrix
from relax_straggler.common.stages import STAGES


def all_stages(ms: np.ndarray, stages: tuple[str, ...]) -> np.ndarray:
    """(ranks, len(STAGES)) ms: `ms` (ranks, len(stages)) in the columns of its stages, NaN in
    the others. The confirmed verdict is fed this: a report's stage subset changes whenever a
    collective or a section runs on some steps only, and a new layout would start it over."""
    out = np.full((ms.shape[0], len(STAGES)), np.nan)
    out[:, [STAGES.index(s) for s in stages]] = ms
    return out


def kernel_all_stages(kernel: KernelMatrix, stages: tuple[str, ...]) -> KernelMatrix:
    """`kernel` (ranks, len(stages)) in the columns of all STAGES, as all_stages does for times."""
    return KernelMatrix(all_stages(kernel.kernel_ms, stages), all_stages(kernel.idle_ms, stages),
                        all_stages(kernel.nccl_ms, stages))
