"""NVIDIA Resiliency Ext's straggler Detector (pip nvidia-resiliency-ext) as a probe.

Release 0.4.1 (the newest for CPython 3.11) has it in `nvidia_resiliency_ext.straggler`,
0.7.0 (CPython 3.12 and later) in `nvidia_resiliency_ext.attribution.straggler`; both
are tried.

Each stage runs inside `Detector.detection_section(stage, profile_cuda=...)`: a host
perf_counter pair per section entry (every `profiling_interval`-th entry) and, with
profile_cuda, CUPTI kernel tracing started and stopped around it. With `report`, every
step calls `Detector.generate_report_if_interval_elapsed()`, which after 16 steps
agrees on an iteration interval over ranks and then, every interval, synchronizes the
device, summarizes sections and kernels and gathers scores to rank 0.

On a CPU-only torch only the sections can run (docs/PERFORMANCE.md says why, with the
file and line of each failure): `report` must be False there, so the CPU number is the
Detector's per-section cost without its periodic report. Detector.shutdown() crashes the
process without a GPU driver (CUPTI), so a CPU probe leaves the Detector initialized
when it closes and the next probe reconfigures it (profiling interval, empty sections,
a new report-interval tracker) instead of initializing it again.

The CUPTI extension (nvrx_cupti_module) links libcupti.so.12; when the system has none,
the copy in pip's nvidia-cuda-cupti-cu12 (nvidia/cuda_cupti/lib) is loaded first.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import logging
from pathlib import Path
from typing import Any, ContextManager, Optional

log = logging.getLogger(__name__)


def _preload_cupti() -> Optional[str]:
    """Loads pip's libcupti.so.12 globally if present; returns its path or None."""
    spec = importlib.util.find_spec("nvidia.cuda_cupti")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        lib = Path(root) / "lib" / "libcupti.so.12"
        if lib.exists():
            ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
            return str(lib)
    return None


PACKAGES = ("nvidia_resiliency_ext.straggler", "nvidia_resiliency_ext.attribution.straggler")


def _package() -> str:
    """The importable straggler package. Raises ImportError when none is."""
    errors = []
    for name in PACKAGES:
        try:
            importlib.import_module(name)
            return name
        except ImportError as exc:
            errors.append(str(exc))
    raise ImportError("; ".join(errors))


def unavailable_reason() -> Optional[str]:
    """None when the Detector can be initialized here, else why not (one line)."""
    try:
        _package()
    except ImportError as exc:
        return f"nvidia-resiliency-ext not installed ({exc}); see benchmarks/peers/install_nvrx.sh"
    try:
        importlib.import_module("nvrx_cupti_module")
    except ImportError:
        _preload_cupti()
        try:
            importlib.import_module("nvrx_cupti_module")
        except ImportError as exc:
            return f"its CUPTI extension cannot load: {exc}"
    return None


class NvrxProbe:
    """The Detector around each stage.

    profile_cuda: trace CUDA kernels with CUPTI inside sections (GPU only).
    report: call generate_report_if_interval_elapsed() every step (needs CUDA torch).
    profiling_interval: time every N-th entry of each section (the Detector's knob).
    report_time_interval_s: the Detector's target time between reports.
    Raises RuntimeError when unavailable_reason() is not None.
    """

    def __init__(self, profile_cuda: bool, report: bool, profiling_interval: int = 1,
                 report_time_interval_s: float = 1.0) -> None:
        reason = unavailable_reason()
        if reason is not None:
            raise RuntimeError(f"NVRx Detector unavailable: {reason}")
        package = _package()
        detector = importlib.import_module(package).Detector
        self._detector = detector
        self._profile_cuda = profile_cuda
        self._report = report
        self._reports = 0
        if detector.initialized:  # left by a CPU probe
            tracker = importlib.import_module(f"{package}.interval_tracker").ReportIntervalTracker
            detector.profiling_interval = profiling_interval
            detector.custom_sections = {}
            detector.report_interval_tracker = tracker(time_interval=report_time_interval_s,
                                                       profiling_interval=profiling_interval)
        else:
            detector.initialize(scores_to_compute="all", gather_on_rank0=True, profiling_interval=profiling_interval,
                                report_time_interval=report_time_interval_s)

    def section(self, stage: str) -> ContextManager[Any]:
        return self._detector.detection_section(stage, profile_cuda=self._profile_cuda)

    def workload(self, tokens: int) -> None:
        pass

    def end_step(self) -> None:
        if self._report and self._detector.generate_report_if_interval_elapsed() is not None:
            self._reports += 1

    def counters(self) -> dict[str, int]:
        """reports: reports generated (each one device synchronize and one gather)."""
        return {"reports": self._reports}

    def close(self) -> None:
        if self._profile_cuda or self._report:
            self._detector.shutdown()
