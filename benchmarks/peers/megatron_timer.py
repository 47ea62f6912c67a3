"""A Megatron-style synchronizing stage timer: the behaviour of Megatron-Core `Timers` at
log level 2, written for this benchmark.

Each start() and stop() first drains the device queue (torch.cuda.synchronize() when
the model is on CUDA), then reads the host clock, so every timed stage costs a pipeline
drain. Every `log_interval` steps each rank writes its elapsed ms per timer into row
`rank` of a zero-filled [world, timers] float tensor, all ranks all-gather it on the
training process group, the timers are reset, and rank 0 formats the (min, max) line
Megatron would print (logged at DEBUG here).

On a CPU-only machine there is no device queue to drain: synchronize() is a no-op and
the timer's cost is the host clock reads plus the periodic all-gather. Its real cost,
the drains, shows on a GPU (benchmarks/gpu/check.sh).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Iterator, Optional

import torch
import torch.distributed as dist

from peers import STAGES

log = logging.getLogger(__name__)

# torch 2.13 renamed all_gather_into_tensor (Megatron's _all_gather_base) all_gather_single.
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class SyncTimers:
    """Synchronizing timers for STAGES.

    device: "cpu" or a CUDA device (synchronized at every start/stop). log_interval:
    steps between all-gathers (>= 1). Raises ValueError for log_interval < 1.
    """

    def __init__(self, device: torch.device, log_interval: int = 10) -> None:
        if log_interval < 1:
            raise ValueError(f"log_interval must be >= 1, got {log_interval}")
        self._cuda = device.type == "cuda"
        self._log_interval = log_interval
        self._elapsed_s = {s: 0.0 for s in STAGES}
        self._index = {s: i for i, s in enumerate(STAGES)}
        self._step = 0
        self._syncs = 0
        self._gathers = 0
        distributed = dist.is_available() and dist.is_initialized()
        self._rank = dist.get_rank() if distributed else 0
        self._world = dist.get_world_size() if distributed else 1
        self._distributed = distributed
        # Gloo gathers CPU tensors; NCCL would need the tensor on the device.
        backend = dist.get_backend() if distributed else "gloo"
        self._gather_device = device if backend == "nccl" else torch.device("cpu")

    def _sync(self) -> None:
        if self._cuda:
            torch.cuda.synchronize()
        self._syncs += 1

    @contextlib.contextmanager
    def section(self, stage: str) -> Iterator[None]:
        self._sync()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self._elapsed_s[stage] += time.perf_counter() - t0

    def workload(self, tokens: int) -> None:
        pass

    def end_step(self) -> None:
        self._step += 1
        if self._step % self._log_interval == 0:
            self._log()

    def _log(self) -> Optional[torch.Tensor]:
        table = torch.zeros(self._world, len(STAGES), dtype=torch.float64, device=self._gather_device)
        for stage, s in self._elapsed_s.items():
            table[self._rank, self._index[stage]] = s * 1e3
        if self._distributed:
            out = torch.empty_like(table)
            _all_gather_flat(out.view(-1), table[self._rank].contiguous())
            table = out
        self._gathers += 1
        self._elapsed_s = {s: 0.0 for s in STAGES}
        if self._rank == 0 and log.isEnabledFor(logging.DEBUG):
            mins, maxs = table.min(dim=0).values, table.max(dim=0).values
            log.debug("step %d: %s", self._step, ", ".join(
                f"{s} ({float(mins[i]):.2f}, {float(maxs[i]):.2f})" for i, s in enumerate(STAGES)))
        return table

    def counters(self) -> dict[str, int]:
        """synchronize_calls (no-ops on CPU), gathers."""
        return {"synchronize_calls": self._syncs, "gathers": self._gathers}

    def close(self) -> None:
        pass
