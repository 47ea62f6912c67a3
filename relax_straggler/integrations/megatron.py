"""Megatron-Core integration: a `config.timers` adapter feeding the analyzer's stages.

Megatron-Core's schedules, p2p communication, gradient finalization and optimizer call
``config.timers(name, log_level=...).start()`` / ``.stop()`` whenever ``config.timers``
is set. `MegatronTimers` answers those calls: a name that means a stage
(relax_straggler.common.megatron_timers.live_stage) opens and closes that stage on sampled
steps (a relaxed atomic load otherwise), never synchronizing and never joining a
barrier (``barrier=`` is handed to the chained Timers only). It chains to the Timers object that was there, so Megatron-LM's own
timing and logging go on unchanged. Because the schedules only look at
``config.timers``, this reaches Megatron-Core's standard schedules and any schedule
built on its ``forward_step`` / ``backward_step`` (Relax's streaming schedules) without
patching Megatron-Core.

On sampled steps the compute and p2p timers (and the gradient sync) are also recorded as
per-op data (relax_straggler.live.op_records) for the live what-if replay, each rank tagged with
its (dp_rank, pp stage) from Megatron-Core's parallel state (docs/WHATIF.md, "Live").

`install()` puts it together for a Megatron training loop:

    analysis = install(model_chunks, optimizer, config=from_args(args))
    for it in range(iters):
        with analysis.train_step():    # swaps the adapters in, ends the step on exit
            train_step(...)
    analysis.uninstall()

Inside `train_step()` the adapters sit on the model config's and the optimizer
configs' ``timers``; outside it (evaluation, log-prob forwards) the previous values
are back, so nothing outside a training step is timed.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import math
import threading
from typing import Any, Callable, ContextManager, Iterator, Mapping, Optional, Protocol, Sequence, Union

import torch
import torch.distributed as dist

from relax_straggler._ext import ext
from relax_straggler.common.megatron_timers import live_stage
from relax_straggler.common.payload import DEFAULT_MAX_OPS, OP_TYPE_IDS
from relax_straggler.common.stages import stage_id
from relax_straggler.config import StragglerConfig
from relax_straggler.live.analyzer import Analyzer, AnalyzerAPI, NullAnalyzer
from relax_straggler.live.analyzer import install as install_analyzer
from relax_straggler.live.module_stages import ModuleStageHooks
from relax_straggler.live.op_records import OpRecorder

log = logging.getLogger(__name__)


class MegatronTimerAPI(Protocol):
    """One timer as Megatron's code uses it (what ``timers(name)`` returns): _StageView
    implements start / stop and hands the rest to the timer it chains to (or _NullTimer),
    _NullTimer does nothing. Times in s."""

    @abc.abstractmethod
    def start(self, barrier: bool = False) -> None:
        """Starts timing."""

    @abc.abstractmethod
    def stop(self, barrier: bool = False) -> None:
        """Stops timing."""

    @abc.abstractmethod
    def reset(self) -> None:
        """Forgets the time so far."""

    @abc.abstractmethod
    def elapsed(self, reset: bool = True, barrier: bool = False) -> float:
        """The time so far, s (then reset, unless reset=False)."""

    @abc.abstractmethod
    def active_time(self) -> float:
        """The time spent started, s."""

    @abc.abstractmethod
    def set_barrier_group(self, barrier_group: Any) -> None:
        """The group a barrier=True start or stop waits on."""


class _NullTimer(MegatronTimerAPI):
    """What an unmapped name gets when there is no Timers object to chain to."""

    def start(self, barrier: bool = False) -> None:
        pass

    def stop(self, barrier: bool = False) -> None:
        pass

    def reset(self) -> None:
        pass

    def elapsed(self, reset: bool = True, barrier: bool = False) -> float:
        return 0.0

    def active_time(self) -> float:
        return 0.0

    def set_barrier_group(self, barrier_group: Any) -> None:
        pass


_NULL_TIMER = _NullTimer()
_COMPUTE_OPS = frozenset(OP_TYPE_IDS[n] for n in ("forward-compute", "backward-compute"))


class _StageView:
    """One named timer: opens/closes a stage and forwards to the chained timer; a name of
    the per-op vocabulary (relax_straggler.common.payload.OP_TYPES) is also recorded as an op.

    Start: chained timer first (its barrier and synchronize stay outside our section);
    stop: ours first. Any other attribute (elapsed, reset, ...) is the chained timer's.
    """

    __slots__ = ("_timer", "_sid", "_inner", "_ops", "_code", "_numbered")

    def __init__(self, timer: Any, sid: int, inner: Any, ops: Optional[OpRecorder] = None, code: int = -1) -> None:
        self._timer = timer
        self._sid = sid
        self._inner = inner
        self._ops = ops if code >= 0 else None
        self._code = code
        self._numbered = code in _COMPUTE_OPS  # the k-th compute of a step is microbatch k

    def start(self, barrier: bool = False) -> None:
        if self._inner is not None:
            self._inner.start(barrier=barrier)
        self._timer.start(self._sid)
        if self._ops is not None:
            self._ops.start(self._code, numbered=self._numbered)

    def stop(self, barrier: bool = False) -> None:
        if self._ops is not None:
            self._ops.stop(self._code)
        self._timer.stop(self._sid)
        if self._inner is not None:
            self._inner.stop(barrier=barrier)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner if self._inner is not None else _NULL_TIMER, name)


class MegatronTimers:
    """The interface Megatron-Core expects of ``config.timers``, feeding stage sections.

    timer: an analyzer's StageTimer (``analyzer.timer``). inner: the Timers object to
    chain to (Megatron's ``Timers``) or None. ops: the analyzer's per-op recorder
    (``analyzer.ops``), or None to record no ops. stages: {timer name: stage} to use instead
    of the Megatron vocabulary (relax_straggler.common.megatron_timers.live_stage); every stage
    must be in relax_straggler.STAGES (ValueError otherwise).
    ``timers(name, log_level=None)`` returns a timer with start/stop(barrier=False);
    names outside `stages` get the chained timer (or a no-op one). log/write and any
    other Timers method go to the chained object, or do nothing without one.
    """

    def __init__(self, timer: Any, inner: Any = None, stages: Optional[Mapping[str, str]] = None,
                 ops: Optional[OpRecorder] = None) -> None:
        self._timer = timer
        self._inner = inner
        self._ops = ops
        if stages is None:
            self._stage_of: Callable[[str], Optional[str]] = live_stage
        else:
            for stage in stages.values():
                stage_id(stage)  # a bad stage fails here, not at the first call of its timer
            self._stage_of = dict(stages).get
        self._views: dict[str, Any] = {}

    @property
    def inner(self) -> Any:
        """The chained Timers object, or None."""
        return self._inner

    def __call__(self, name: str, log_level: Optional[int] = None) -> Any:
        view = self._views.get(name)
        if view is None:
            inner = self._inner(name, log_level=log_level) if self._inner is not None else None
            stage = self._stage_of(name)
            # `optimizer` is not recorded as an op: the recorder makes the step's tail that op.
            code = OP_TYPE_IDS.get(name, -1) if name != "optimizer" else -1
            view = (_StageView(self._timer, stage_id(stage), inner, self._ops, code)
                    if stage is not None else (inner or _NULL_TIMER))
            self._views[name] = view
        return view

    def log(self, *args: Any, **kwargs: Any) -> Any:
        return self._inner.log(*args, **kwargs) if self._inner is not None else None

    def write(self, *args: Any, **kwargs: Any) -> Any:
        return self._inner.write(*args, **kwargs) if self._inner is not None else None

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get("_inner")
        if inner is None:
            raise AttributeError(f"MegatronTimers has no {name!r} and chains to no Timers object")
        return getattr(inner, name)


_NULL_CONTEXT: ContextManager[None] = contextlib.nullcontext()


class MegatronAnalysisAPI(Protocol):
    """What install() returns, the analysis on (MegatronAnalysis) or off
    (NullMegatronAnalysis): a Megatron training loop written against it runs unchanged
    either way."""

    enabled: bool
    analyzer: AnalyzerAPI

    @abc.abstractmethod
    def adapter_for(self, inner: Any) -> Any:
        """What train_step() puts in place of the Timers object `inner`."""

    @abc.abstractmethod
    def train_step(self, step: Optional[int] = None) -> ContextManager[None]:
        """A context around one training step; step: the loop's own number of it."""

    @abc.abstractmethod
    def section(self, name: str) -> ContextManager[Any]:
        """A context timing stage `name`."""

    @abc.abstractmethod
    def set_workload(self, tokens: float) -> None:
        """This rank's tokens in the current step."""

    @abc.abstractmethod
    def add_workload(self, tokens: float) -> None:
        """Adds one microbatch's tokens to this rank's workload of the open step."""

    @abc.abstractmethod
    def uninstall(self) -> None:
        """Ends the analysis (every rank calls it)."""


class NullMegatronAnalysis(MegatronAnalysisAPI):
    """Analysis disabled: nothing registered, config.timers untouched, no-op scopes."""

    enabled = False
    analyzer = NullAnalyzer()

    def adapter_for(self, inner: Any) -> Any:
        return inner  # nothing is chained: the Timers object stays as it is

    def train_step(self, step: Optional[int] = None) -> ContextManager[None]:
        return _NULL_CONTEXT

    def section(self, name: str) -> ContextManager[None]:
        return _NULL_CONTEXT

    def set_workload(self, tokens: float) -> None:
        pass

    def add_workload(self, tokens: float) -> None:
        pass

    def uninstall(self) -> None:
        pass


class MegatronAnalysis(MegatronAnalysisAPI):
    """The analyzer attached to a Megatron training loop. Build it with install().

    analyzer: installed with model=None and optimizer=None (the timers give the stage
    boundaries; train_step() ends each step). model_config: the object whose
    ``timers`` the schedules read (``get_model_config(model[0])``). optimizer_configs:
    the optimizer configs whose ``timers`` the Megatron optimizer reads. module_stages:
    hook modules matched by module_patterns (default patterns when None) into the
    `attention` / `moe` stages, timed only inside train_step(). labels: where
    train_step(step=...) records the caller's step numbers, which name the reports.
    timer_slots: further (object, attribute name) places holding a Timers object that
    train_step() swaps too (Megatron-LM's global timers, read by ``get_timers()``).
    """

    enabled = True

    def __init__(self, analyzer: Analyzer, models: list[torch.nn.Module], model_config: Any,
                 optimizer_configs: list[Any], module_stages: bool,
                 module_patterns: Optional[Mapping[str, str]], labels: "StepLabels",
                 timer_slots: Sequence[tuple[Any, str]] = ()) -> None:
        self.analyzer = analyzer
        self._labels = labels
        self._steps = 0  # steps ended so far: the analyzer's step number of the open step
        configs = [model_config, *(c for c in optimizer_configs if c is not model_config)]
        self._slots = [(c, "timers") for c in configs] + list(timer_slots)
        self._adapters: dict[int, MegatronTimers] = {}
        self._in_step = False
        self._replaced_warned = False
        self._tokens = 0.0  # add_workload() total of the open step
        self._module_hooks: Optional[ModuleStageHooks] = None
        if module_stages:
            self._module_hooks = ModuleStageHooks(analyzer.timer, models, module_patterns, gate=self._stepping)

    def _stepping(self) -> bool:
        return self._in_step

    def adapter_for(self, inner: Any) -> MegatronTimers:
        """The adapter chained to `inner` (one per distinct chained object)."""
        if isinstance(inner, MegatronTimers):
            return inner
        adapter = self._adapters.get(id(inner))
        if adapter is None:
            adapter = self._adapters[id(inner)] = MegatronTimers(self.analyzer.timer, inner, ops=self.analyzer.ops)
        return adapter

    @contextlib.contextmanager
    def train_step(self, step: Optional[int] = None) -> Iterator[None]:
        """One training step: the adapters replace ``timers`` on the model and optimizer
        configs and in the other timer slots (chaining to what was there; one adapter per
        distinct Timers object), module stages are armed; on a normal exit
        the previous values come back and the analyzer's step ends. On an exception the
        values come back and the step is not ended (the exception ends the run).

        step: the training loop's own step number (e.g. Megatron-LM's, as its log names
        the step); the report of a sampled step then carries it in every sink (callback,
        JSONL, console, store, the verdict's since_step) instead of the analyzer's count of
        steps since install. Raises RuntimeError when a train_step() is already open."""
        if self._in_step:
            raise RuntimeError("relax_straggler: train_step() entered while a training step is already open")
        if step is not None and self.analyzer.timer.sampled:
            self._labels.put(self._steps, step)
        saved = [(owner, name, getattr(owner, name)) for owner, name in self._slots]
        for owner, name, inner in saved:
            setattr(owner, name, self.adapter_for(inner))
        swapped = [getattr(owner, name) for owner, name, _ in saved]
        self._tokens = 0.0
        self._in_step = True
        try:
            yield
        finally:
            self._in_step = False
            for (owner, name, inner), adapter in zip(saved, swapped):
                if getattr(owner, name) is not adapter and not self._replaced_warned:
                    # another profiler put its own timers there inside the step: its calls bypassed ours
                    self._replaced_warned = True
                    log.warning("relax_straggler: %s.%s was replaced inside a training step (by %s); the timers "
                                "called through it were not seen", type(owner).__name__, name,
                                type(getattr(owner, name)).__name__)
                setattr(owner, name, inner)
        if self._tokens > 0:
            self.analyzer.set_workload(self._tokens)
        self.analyzer.step()
        self._steps += 1

    def section(self, name: str) -> ContextManager[Any]:
        """`with analysis.section("data"):` for a stage the timers do not cover."""
        return self.analyzer.section(name)

    def set_workload(self, tokens: float) -> None:
        """This rank's tokens in the current step (see Analyzer.set_workload)."""
        self.analyzer.set_workload(tokens)

    def add_workload(self, tokens: float) -> None:
        """Adds one microbatch's tokens to this rank's workload of the open step; the
        total is the step's workload (ranks then compare per token). Ignored outside
        train_step() (evaluation, log-prob forwards). Raises ValueError for a negative
        or non-finite count."""
        if not (isinstance(tokens, (int, float)) and math.isfinite(tokens) and tokens >= 0):
            raise ValueError(f"add_workload: tokens must be a finite number >= 0, got {tokens!r}")
        if self._in_step:
            self._tokens += tokens

    def uninstall(self) -> None:
        """Removes the module hooks and the analyzer. Collective: every rank calls it."""
        if self._module_hooks is not None:
            self._module_hooks.remove()
        self.analyzer.uninstall()


class StepLabels:
    """Analyzer step -> the training loop's step number, for sampled steps only.

    Written on the training thread, read (and forgotten) on the report thread. Bounded:
    past `capacity` entries (reports dropped by a full queue) the oldest go.
    """

    def __init__(self, capacity: int) -> None:
        self._labels: dict[int, int] = {}
        self._capacity = capacity
        self._lock = threading.Lock()

    def put(self, analyzer_step: int, step: int) -> None:
        with self._lock:
            self._labels[analyzer_step] = step
            while len(self._labels) > self._capacity:
                del self._labels[min(self._labels)]

    def pop(self, analyzer_step: int) -> int:
        """The label of analyzer_step, or analyzer_step itself when none was given."""
        with self._lock:
            return self._labels.pop(analyzer_step, analyzer_step)


def _optimizer_configs(optimizer: Any) -> list[Any]:
    """The distinct config objects with a ``timers`` field of a Megatron optimizer
    (a ChainedOptimizer's own and each chained one's)."""
    configs: list[Any] = []
    for opt in [optimizer, *getattr(optimizer, "chained_optimizers", [])]:
        config = getattr(opt, "config", None)
        if config is not None and hasattr(config, "timers") and all(config is not c for c in configs):
            configs.append(config)
    return configs


def _device_events(config: StragglerConfig, models: Sequence[torch.nn.Module]) -> str:
    """'auto' resolved against the model's parameters (the analyzer sees no model here)."""
    if config.device_events != "auto":
        return config.device_events
    on_cuda = torch.cuda.is_available() and any(p.is_cuda for m in models for p in m.parameters())
    return "cuda" if on_cuda and ext().with_cuda else "cpu"


def _pipeline_rank() -> Optional[int]:
    """This rank's pipeline-parallel rank when Megatron-Core's parallel state is set up with
    PP > 1, else None."""
    try:
        from megatron.core import parallel_state
    except ImportError:
        return None
    if not parallel_state.model_parallel_is_initialized() or parallel_state.get_pipeline_model_parallel_world_size() <= 1:
        return None
    return int(parallel_state.get_pipeline_model_parallel_rank())


def _worker() -> Optional[tuple[int, int]]:
    """This rank's (data-parallel rank, pipeline stage) from Megatron-Core's parallel state,
    None when it is not set up."""
    try:
        from megatron.core import parallel_state
    except ImportError:
        return None
    if not parallel_state.model_parallel_is_initialized():
        return None
    return int(parallel_state.get_data_parallel_rank()), int(parallel_state.get_pipeline_model_parallel_rank())


def install(model: Union[torch.nn.Module, Sequence[torch.nn.Module]], optimizer: Any = None, *,
            config: Optional[StragglerConfig] = None, report_fn: Optional[Callable[[dict, int], None]] = None,
            group: Optional[dist.ProcessGroup] = None, model_config: Any = None,
            module_patterns: Optional[Mapping[str, str]] = None,
            comparison_group: Union[int, str, None] = "pipeline",
            timer_slots: Sequence[tuple[Any, str]] = ()) -> Union[MegatronAnalysis, NullMegatronAnalysis]:
    """Attaches straggler analysis to a Megatron-Core training loop.

    model: the model chunks (a module or a list; virtual pipeline chunks accumulate
    into the same stages). optimizer: the Megatron optimizer, whose configs' timers
    give the `optimizer` stage (None: no optimizer stage unless you add a section).
    config: None means enabled with defaults; disabled returns a NullMegatronAnalysis
    that touches nothing. model_config: the object holding ``timers`` for the
    schedules; default ``megatron.core.utils.get_model_config(model[0])``.
    module_patterns: {stage: class-name regex} for --straggler-enable-module-stages.
    report_fn and group: as relax_straggler.install. comparison_group: "pipeline" (the
    default) judges each rank against the other ranks (data-, tensor-, context-parallel
    peers) of its own pipeline stage when Megatron's parallel state has PP > 1 (the
    first and last stages do different work by design: embedding, loss), and reports the
    spread between stages as structural imbalance; an int is an explicit group id as in relax_straggler.install;
    None compares all ranks. timer_slots: (object, attribute name) places besides the
    configs' ``timers`` that hold a Timers object the step's code reads (Megatron-LM's
    ``global_vars._GLOBAL_TIMERS``); train_step() chains an adapter into each. Collective
    when torch.distributed is initialized: every rank calls it at the same point.
    Raises ValueError for a bad config or patterns, ImportError without megatron-core
    when model_config is not given.
    """
    config = config if config is not None else StragglerConfig(enabled=True)
    if not config.enabled:
        return NullMegatronAnalysis()
    models = [model] if isinstance(model, torch.nn.Module) else list(model)
    if not models:
        raise ValueError("relax_straggler: install() needs at least one model chunk")
    if model_config is None:
        from megatron.core.utils import get_model_config

        model_config = get_model_config(models[0])
    if not hasattr(model_config, "timers"):
        raise ValueError(f"relax_straggler: {type(model_config).__name__} has no `timers` field; pass the "
                         "Megatron-Core model config (get_model_config(model[0]))")
    analyzer_config = config.replace(enable_module_stages=False, device_events=_device_events(config, models),
                                     max_ops=DEFAULT_MAX_OPS if config.max_ops is None else config.max_ops)
    labels = StepLabels(capacity=4 * config.queue_size)
    analyzer = install_analyzer(None, None, config=analyzer_config, group=group, report_fn=report_fn,
                                step_label=labels.pop,
                                comparison_group=_pipeline_rank() if comparison_group == "pipeline" else comparison_group)
    worker = _worker()
    if worker is not None:
        analyzer.ops.set_worker(*worker)  # the what-if replay places each rank's ops on its worker
    # The analyzer is given no model: the module hooks are ours, gated to training steps.
    patterns = module_patterns if config.enable_module_stages else None
    analysis = MegatronAnalysis(analyzer, models, model_config, _optimizer_configs(optimizer),
                                config.enable_module_stages, patterns, labels, timer_slots)
    log.info("relax_straggler: analyzing Megatron training (%s events, every %d steps after %d)",
             analyzer_config.device_events, config.interval, config.warmup_steps)
    return analysis
