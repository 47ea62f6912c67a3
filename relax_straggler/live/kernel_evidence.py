"""Kernel records of sampled steps, as per-stage evidence (docs/DESIGN.md, "Kernel records").

CUDA events time a stage section's stream: a section whose stream sat idle while the host
stalled reads like one whose kernels ran slowly. Kernel records tell them apart. With
``--straggler-kernel-stats`` the analyzer asks a KernelSource, on sampled steps only, what
the GPU did inside each stage: the time compute kernels ran (kernel_ms), the time nothing
ran on the section's stream (idle_ms) and the NCCL kernels' time (nccl_ms), which travel in
the gathered row (relax_straggler.common.payload.KERNEL_FIELDS) and let the confirmed verdict say
``device``, ``host`` or ``communication_link``.

Sources:
  SyntheticKernelSource  activity records and sections given by a function of the step, fed
                         through the engine's statistics (relax_straggler._core.kernels): tests
                         and demonstrations, on any build.
  CuptiKernelSource      CUPTI's activity records (csrc/cupti/cupti_collector.h), in a build with
                         CUDA and CUPTI only (relax_straggler._core.kernels.WITH_CUPTI), attributed
                         to the stage timer's own sections by correlation id: the collector observes
                         the timer's section begins and ends on sampled steps.
open_kernel_source(timer) picks what the build can do; where it can do nothing it warns once and the
analysis runs on events only (every kernel field NaN, the row's layout unchanged).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol, Sequence

import numpy as np

from relax_straggler._ext import core
from relax_straggler.common.metric_names import stage_prefix
from relax_straggler.common.payload import KERNEL_FIELDS
from relax_straggler.common.stages import STAGES, stage_id

log = logging.getLogger(__name__)

TOP_K = 5  # kernels kept per stage
# (kind: "kernel" | "memcpy" | "memset", start_ns, end_ns, stream_id, name or None), CUPTI's clock
Record = tuple[str, int, int, int, Optional[str]]
# (stage name, stream_id or ANY_STREAM, begin_ns, end_ns) on the records' clock
Section = tuple[str, int, int, int]


@dataclass(frozen=True)
class StageKernels:
    """What the kernel records of one sampled step say per stage, ms, in STAGES order; NaN
    where the step had no section of the stage. A stage run in several sections
    (microbatches) sums them. top: stage -> its top kernels (short name, ms, calls)."""

    kernel_ms: np.ndarray  # (len(STAGES),) compute (non-NCCL) kernels running
    idle_ms: np.ndarray  # nothing running on the section's stream: launch gaps, host stalls
    nccl_ms: np.ndarray  # NCCL kernels running
    top: dict[str, tuple[tuple[str, float, int], ...]]
    records: int  # records kept this step
    invalid_records: int  # zero or inverted timestamps, dropped
    dropped_records: int  # record buffer full, dropped
    unattributed_records: int  # inside no section

    def fields(self) -> np.ndarray:
        """(len(STAGES), len(KERNEL_FIELDS)) ms, as relax_straggler.common.payload.pack takes them."""
        return np.stack([self.kernel_ms, self.idle_ms, self.nccl_ms], axis=1)


def from_step_kernels(step_kernels: Any) -> StageKernels:
    """A StageKernels from the engine's StepKernels (KernelStats.summarize), whose sections'
    stage fields are stage ids."""
    n = len(STAGES)
    kernel, idle, nccl = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    tops: dict[int, dict[str, list[float]]] = {}
    for sec in step_kernels.sections:
        s = sec.stage
        kernel[s] = np.nansum([kernel[s], sec.compute_ms])
        idle[s] = np.nansum([idle[s], sec.idle_ms])
        nccl[s] = np.nansum([nccl[s], sec.nccl_ms])
        per_name = tops.setdefault(s, {})
        for k in sec.top:
            acc = per_name.setdefault(k.name, [0.0, 0])
            acc[0] += k.ms
            acc[1] += k.calls
    top = {STAGES[s]: tuple(sorted(((name, ms, int(calls)) for name, (ms, calls) in names.items()),
                                   key=lambda t: (-t[1], t[0]))[:TOP_K])
           for s, names in tops.items()}
    return StageKernels(kernel, idle, nccl, top, step_kernels.records, step_kernels.invalid_records,
                        step_kernels.dropped_records, step_kernels.unattributed_records)


def _native_sections(sections: Sequence[Section]) -> list[tuple[int, int, int, int]]:
    """(stage id, stream, begin, end) for the engine. Raises ValueError for an unknown stage."""
    return [(stage_id(stage), int(stream), int(begin), int(end)) for stage, stream, begin, end in sections]


class KernelSource(Protocol):
    """Where the analyzer gets kernel evidence. begin_step / end_step are called on sampled
    steps only, from the training thread, end_step after the stage timer's read."""

    name: str

    def begin_step(self, step: int) -> None:
        """A sampled step starts."""

    def end_step(self, step: int) -> Optional[StageKernels]:
        """The step's evidence, or None when nothing was measured."""

    def close(self) -> None:
        """Releases what the source holds (idempotent)."""


class SyntheticKernelSource:
    """Kernel evidence from `plan(step) -> (records, sections)` (Record and Section tuples),
    summarised by the engine's KernelStats exactly as CUPTI's records would be. plan may
    return None for a step without records. max_records bounds the per-step buffer."""

    name = "synthetic"

    def __init__(self, plan: Callable[[int], Optional[tuple[Sequence[Record], Sequence[Section]]]],
                 max_records: int = 1 << 16) -> None:
        self._plan = plan
        self._stats = core().kernels.KernelStats(max_records)

    def begin_step(self, step: int) -> None:
        self._stats.clear()

    def end_step(self, step: int) -> Optional[StageKernels]:
        planned = self._plan(step)
        if planned is None:
            return None
        records, sections = planned
        for kind, start, end, stream, name in records:
            self._stats.add(kind, int(start), int(end), int(stream), name)
        return from_step_kernels(self._stats.summarize(_native_sections(sections), TOP_K))

    def close(self) -> None:
        pass


class CuptiKernelSource:
    """CUPTI's kernel records of sampled steps, attributed to the sections of `timer` (a
    relax_straggler._C.StageTimer) by correlation id. The collector is the timer's section
    observer: at each section begin and end of a sampled step it notes the last correlation id
    issued in the process; at the step's end each kernel record goes to the section whose id
    range holds the id of the call that launched it, and the section's idle time is its CUDA
    event time (timer.last_sections) less the time kernels and copies ran. CUPTI is held on
    sampled steps only; when another tool holds it (torch.profiler, Nsight) the collector
    backs off, warns once and the step is not measured.

    collector: an object with CuptiCollector's begin_sampled_step, end_observed_step,
    section_observer, shutdown and mode (tests); default: a new
    relax_straggler._core.kernels.CuptiCollector. Raises RuntimeError when no collector is
    given and the build has no CUPTI."""

    name = "cupti"

    def __init__(self, timer: Any, collector: Any = None) -> None:
        if collector is None:
            kernels = core().kernels
            if not kernels.WITH_CUPTI:
                raise RuntimeError("relax_straggler._core was built without CUPTI (needs a CUDA torch and the "
                                   "toolkit's cupti.h and libcupti at build time)")
            collector = kernels.CuptiCollector()
        self._collector = collector
        self._timer = timer
        self._collecting = False
        self._closed = False
        timer.set_section_observer(collector.section_observer())

    def begin_step(self, step: int) -> None:
        self._collecting = self._collector.begin_sampled_step(_profiler_active())

    def end_step(self, step: int) -> Optional[StageKernels]:
        if not self._collecting:
            return None
        self._collecting = False
        summary = self._collector.end_observed_step(self._timer.last_sections, TOP_K)
        return None if summary is None else from_step_kernels(summary)

    @property
    def mode(self) -> str:
        """"kernels", "events only" or "unavailable" (the collector's mode)."""
        return self._collector.mode

    def close(self) -> None:
        """Stops observing the timer and releases CUPTI (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._timer.clear_section_observer()
        self._collector.shutdown()


def _profiler_active() -> bool:
    """Whether torch.profiler (or autograd's profiler) is running in this process."""
    try:
        from torch.autograd import profiler

        return bool(profiler._is_profiler_enabled)
    except (ImportError, AttributeError):
        return False


_warned: set[str] = set()


def open_kernel_source(timer: Any = None) -> Optional[KernelSource]:
    """The kernel source this build and process can run for --straggler-kernel-stats over the
    sections of `timer` (the analyzer's relax_straggler._C.StageTimer), or None (after one
    warning) when there is none: a build without CUPTI (a CPU build, or CUDA without the
    toolkit's CUPTI), no timer to observe, or a timer that times on the CPU (no CUDA model:
    no kernels to attribute)."""
    if not core().kernels.WITH_CUPTI:
        why = "this build has no CUPTI (a CPU build, or a CUDA build without the toolkit's CUPTI)"
    elif timer is None:
        why = "no stage timer to attribute kernel records to"
    elif timer.device != "cuda":
        why = "the stage timer times on the CPU (no CUDA model), so there are no kernels to attribute"
    else:
        return CuptiKernelSource(timer)
    if why not in _warned:
        _warned.add(why)
        log.warning("relax_straggler: --straggler-kernel-stats: %s; stage times come from events only and "
                    "%skernel_ms, idle_ms read NaN (not measured)", why, stage_prefix("{stage}"))
    return None
