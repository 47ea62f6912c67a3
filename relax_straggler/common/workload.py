"""Per-token comparison of ranks doing unequal work (dynamic batch sizes), shared by the
live report and the offline analysis."""

from __future__ import annotations

import numpy as np

from relax_straggler.common.stages import WORKLOAD_STAGES


def normalize_workload(device_ms: np.ndarray, stages: tuple[str, ...], tokens: np.ndarray) -> np.ndarray:
    """Scales the workload stages (WORKLOAD_STAGES) of `device_ms` (ranks, len(stages)) ms
    to the mean token count: t x mean(tokens) / tokens_r, so ranks are compared per token in
    ms a reader recognizes. tokens: (ranks,), finite and > 0 for every rank. Returns a copy."""
    scale = float(np.mean(tokens)) / tokens
    out = device_ms.copy()
    for j, stage in enumerate(stages):
        if stage in WORKLOAD_STAGES:
            out[:, j] *= scale
    return out
