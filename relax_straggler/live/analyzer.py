"""install() and the Analyzer it returns: the Python manager over the C++ stage timer.

One sampled step, end to end:
  begin_step -> hooks and section()s record events -> optimizer post-hook (or step())
  -> end_step reads the events once -> the row is packed and gathered asynchronously
  over the side Gloo group -> on the metrics rank the report thread has the judge judge it
  (relax_straggler.judge: the per-step rule, then the confirmed verdict across reports)
  and feeds the sinks. Every
  --straggler-control-every steps the metrics rank's decision (sample or hold, a runtime
  command, stop) reaches every rank, which apply it at the same step (relax_straggler.live.lockstep).
  The training thread never waits for a peer (but, one step's time at most, for a
  decision broadcast 16 steps earlier and not arrived yet) and never synchronizes.

uninstall() is bounded (SHUTDOWN_TIMEOUT_S by default) whatever a sink or a peer does, and
a peer's failure never raises into training or out of uninstall (docs/DESIGN.md, "Shutdown and faults").
"""

from __future__ import annotations

import abc
import contextlib
import logging
import math
import os
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Optional, Protocol, Sequence, Union

import torch
import torch.distributed as dist

from relax_straggler._ext import core, ext
from relax_straggler.common.payload import row_from_sample, unpack
from relax_straggler.common.side_failure import SideFailure
from relax_straggler.common.stages import MEASURED_STAGES, STAGES, check_section
from relax_straggler.config import StragglerConfig
from relax_straggler.judge.report import Report
from relax_straggler.live.aggregation import GatherUnavailable, LocalGather, PendingRows, SideGroupGather
from relax_straggler.live.collectives import CollectiveLayer
from relax_straggler.live.control import ControlCommand, ControlFile
from relax_straggler.live.gc_pauses import GcPauses
from relax_straggler.live.hooks import TrainingHooks
from relax_straggler.live.join import JoinTimeout, meet
from relax_straggler.live.kernel_evidence import KernelSource, open_kernel_source
from relax_straggler.live.lockstep import Decision, LocalLockstep, LockstepChannel, SideGroupFailed
from relax_straggler.live.module_stages import ModuleStageHooks
from relax_straggler.live.op_records import NULL_OPS, NullOpRecorder, OpRecorder, OpRecorderAPI
from relax_straggler.live.run_queue import RunQueueClock
from relax_straggler.live.side_channel import describe as describe_channel, open_side_channel
from relax_straggler.live.side_tree import TreeGather
from relax_straggler.live.stack_sampler import StackSampler
from relax_straggler.live.works import reason
from relax_straggler.reporters import ReportPipeline, RunSummary, Sink
from relax_straggler.reporters.factory import build_sinks, describe_outputs
from relax_straggler.reporters.narrator import Narrator, show_by_default

if TYPE_CHECKING:
    from relax_straggler.judge import Judge

log = logging.getLogger(__name__)

_NULL_SECTION: ContextManager[None] = contextlib.nullcontext()
SHUTDOWN_TIMEOUT_S = 5.0  # uninstall()'s default bound, seconds
_STAGE_NAMES = frozenset(STAGES) - frozenset(MEASURED_STAGES)  # the stages a section may time

Models = Union[torch.nn.Module, Sequence[torch.nn.Module], None]


def _workload(tokens: Any) -> float:
    """tokens as a float: an int, float, numpy scalar or one-element tensor, finite and > 0.
    Raises ValueError otherwise (the same with the analyzer on or off)."""
    value = math.nan
    if not isinstance(tokens, (bool, str, bytes)):
        try:
            value = float(tokens)
        except (TypeError, ValueError, RuntimeError):
            pass
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"set_workload: tokens must be a finite number > 0 (int, float, numpy or 1-element "
                         f"tensor), got {tokens!r}")
    return value


def _check_stage(name: str) -> None:
    check_section(name)  # raises the ValueError listing the stages


class AnalyzerAPI(Protocol):
    """What install() returns, the analysis on (Analyzer) or off (NullAnalyzer): a training
    loop written against it runs unchanged either way."""

    enabled: bool

    @abc.abstractmethod
    def section(self, name: str) -> ContextManager[Any]:
        """A context timing stage `name` (ValueError for an unknown stage)."""

    @abc.abstractmethod
    def set_workload(self, tokens: Any) -> None:
        """This rank's work in the current step (ValueError unless finite and > 0)."""

    @abc.abstractmethod
    def step(self) -> None:
        """Ends the current step."""

    @abc.abstractmethod
    def summary(self) -> Optional[RunSummary]:
        """The run summary (metrics rank only), else None."""

    @property
    @abc.abstractmethod
    def stopped_by(self) -> Optional[SideFailure]:
        """Why the analysis ended on this rank, None while it runs."""

    @abc.abstractmethod
    def inside(self) -> Optional[dict[str, Any]]:
        """What the training thread does inside the analyzer now, or None."""

    @property
    @abc.abstractmethod
    def ops(self) -> OpRecorderAPI:
        """The per-op recorder of sampled steps."""

    @property
    @abc.abstractmethod
    def timer(self) -> Any:
        """The relax_straggler._C.StageTimer, or None when nothing is timed."""

    @abc.abstractmethod
    def counters(self) -> dict[str, int]:
        """Every loss so far, as published under straggler/*."""

    @abc.abstractmethod
    def uninstall(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
        """Ends the analysis within timeout_s seconds (every rank calls it)."""


class NullAnalyzer(AnalyzerAPI):
    """The analyzer when disabled: registers nothing, records nothing (docs/ARCHITECTURE.md invariant 1). It
    still checks its arguments, so turning the analyzer on never raises a new error."""

    enabled = False
    ops = NULL_OPS  # the per-op recorder's API, recording nothing
    stopped_by = None  # nothing runs, so nothing stopped
    timer = None  # no stage timer

    def section(self, name: str) -> ContextManager[None]:
        if name not in _STAGE_NAMES:
            _check_stage(name)
        return _NULL_SECTION

    def step(self) -> None:
        pass

    def set_workload(self, tokens: Any) -> None:
        _workload(tokens)

    def summary(self) -> None:
        return None

    def inside(self) -> None:
        return None

    def counters(self) -> dict[str, int]:
        return {}  # nothing measured, nothing lost

    def uninstall(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
        pass


class Analyzer(AnalyzerAPI):
    """Straggler analysis attached to one training loop. Build it with install()."""

    enabled = True

    def __init__(self, models: list[torch.nn.Module], optimizer: Optional[torch.optim.Optimizer],
                 config: StragglerConfig, report_fn: Optional[Callable[[dict, int], None]],
                 group: Optional[dist.ProcessGroup], comparison_group: Optional[int] = None,
                 kernel_source: Optional[KernelSource] = None,
                 step_label: Optional[Callable[[int], int]] = None) -> None:
        C = ext()
        # The reports are judged by the engine (relax_straggler._core): a build without it
        # (one from before it existed) fails here, on every rank before any collective,
        # rather than on every report.
        core()
        self.config = config
        self._comparison_group = comparison_group
        self._step_label = step_label
        use_cuda = _use_cuda(config, models)
        self._timer = C.StageTimer(len(STAGES), config.interval, config.warmup_steps, config.max_events, use_cuda)
        self._sections = {name: self._timer.section(STAGES.index(name)) for name in sorted(_STAGE_NAMES)}
        self._step = 0
        self._tokens = math.nan
        self._lock = threading.Lock()
        self._paused = False  # runtime control: no step is sampled
        self._held = False  # the metrics rank's decision: this period samples nothing (it is behind)
        self._hold_logged = False
        self._stopped: Optional[SideFailure] = None  # why the analysis ended on this rank
        self._skipped_samples = 0  # steps that would have been sampled but for a hold
        self._step_began = time.monotonic()
        self._last_step_s = 0.0  # wall time of the previous step: the bound of a wait for a late decision
        # time.monotonic() since which the training thread is inside step(), None when it is not
        # (the hang watchdog reads it).
        self._inside_since: Optional[float] = None
        self._judge: Optional[Judge] = None  # the metrics rank's: judges each step's gathered rows

        self._collectives: Optional[CollectiveLayer] = None
        if dist.is_available() and dist.is_initialized():
            meet("install()", config.join_timeout_s)  # the side group below would wait for a missing rank for 30 min
            ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
            self._gather: Union[SideGroupGather, TreeGather, LocalGather] = open_side_channel(ranks, config)
            if config.collective_timing:
                try:
                    self._collectives = CollectiveLayer(self._timer, ranks, exclude=self._gather.groups)
                except RuntimeError as exc:  # a torch whose private group registry moved: time without it
                    log.warning("relax_straggler: %s; analysing without the collective layer (as with "
                                "--straggler-no-collective-timing)", exc)
        else:
            if config.metrics_rank != 0:
                raise ValueError(f"--straggler-metrics-rank {config.metrics_rank}: a single process has only rank 0")
            self._gather = LocalGather()
        # Per-op records for the live what-if; none (and no per-op row) unless asked for.
        self._ops = OpRecorder(self._timer, self._gather.rank, config.max_ops) if config.max_ops else NULL_OPS
        self._run_queue = RunQueueClock()  # host contention of sampled steps
        self._gc = GcPauses()  # garbage-collection pauses of every step, taken with each sampled row
        self._stacks = StackSampler()  # this rank's Python stack, once the metrics rank names it
        # Metrics rank: the rank to ask for its stack in the next decision (-1 none; written by
        # the report thread, read by the training thread) and the confirmed ranks already asked.
        self._stack_wanted = -1
        self._stack_asked: set[int] = set()
        # Kernel records of sampled steps; without a source every rank's kernel fields stay NaN.
        self._kernels: Optional[KernelSource] = None
        if config.kernel_stats:
            self._kernels = kernel_source if kernel_source is not None else open_kernel_source(self._timer)

        # The metrics rank's decisions, reaching every rank of the analyzed group.
        self._lockstep: Union[LockstepChannel, LocalLockstep, None] = None
        control_file = ControlFile(config.control_file) if config.control_file and self._gather.is_metrics_rank else None
        if not isinstance(self._gather, LocalGather):
            if self._gather.rank >= 0:
                self._lockstep = LockstepChannel(self._gather.group, self._gather.metrics_global_rank,
                                                 self._gather.global_rank, control_file, config.control_every)
        else:
            self._lockstep = LocalLockstep(control_file, config.control_every)

        self._uninstalled = False
        self._hang: Any = None
        self._publish_failures = 0  # sampled steps whose row could not be sent
        self._summary: Optional[RunSummary] = None
        self._pipeline: Optional[ReportPipeline] = None
        self._sinks: tuple[Sink, ...] = ()  # the metrics rank's
        self._store_sink: Any = None
        self._narrator: Optional[Narrator] = None
        self._alone = False  # uninstall() was not called on every rank in time: nothing waits for the side group
        if self._gather.is_metrics_rank:
            local = int(os.environ.get("LOCAL_WORLD_SIZE", "0"))  # torchrun numbers ranks node by node
            rank_to_node = [r // local for r in range(self._gather.world_size)] if local > 0 else None
            from relax_straggler.judge import Judge  # the engine's front: metrics rank only

            self._judge = Judge(config, rank_to_node)
            configured = build_sinks(config, report_fn)
            self._sinks = configured.sinks
            self._summary, self._store_sink, self._narrator = configured.summary, configured.store, configured.narrator
            # Given up at shutdown, the report thread stops waiting for a peer's row.
            self._pipeline = ReportPipeline(self._build_report, self._sinks, config.queue_size,
                                            release=self._gather.abandon)
        if config.hang_seconds > 0 and not isinstance(self._gather, LocalGather) and self._gather.rank >= 0:
            self._hang = _start_hang_watchdog(self, ranks, self._sinks if self._gather.is_metrics_rank else None)

        # Without the collective layer, the DDP gradient-sync wait after backward is the
        # communication stage; with it, the collectives themselves are.
        time_grad_sync = self._collectives is None and any(
            isinstance(m, torch.nn.parallel.DistributedDataParallel) for m in models)
        self._hooks = TrainingHooks(self._timer, models, optimizer, self.step, time_grad_sync)
        self._module_hooks = (ModuleStageHooks(self._timer, models, patterns=config.module_patterns())
                              if config.enable_module_stages else None)
        self._gc.install()  # last: a constructor that failed leaves no callback behind
        if self._narrator is not None:
            show_by_default()
            channel = "" if isinstance(self._gather, LocalGather) else describe_channel(config, self._gather.world_size)
            self._narrator.started(self._gather.world_size, config.metrics_rank, config.interval, config.warmup_steps,
                                   describe_outputs(config, report_fn), channel)
        self._begin_step(self._step)

    # public API ------------------------------------------------------------------------
    def section(self, name: str) -> ContextManager[Any]:
        """Context manager timing `name` (a stage of relax_straggler.common.stages.STAGES) on sampled steps.

        Raises ValueError for an unknown stage. Sections nest and accumulate within a step.
        """
        try:
            return self._sections[name]
        except KeyError:
            _check_stage(name)
            raise

    def set_workload(self, tokens: Any) -> None:
        """This rank's work in the current step (e.g. tokens: an int, float, numpy scalar or
        1-element tensor). When every rank gives it, workload stages are compared per token.
        Raises ValueError unless finite and > 0."""
        self._tokens = _workload(tokens)

    def step(self) -> None:
        """Ends the current step. Called by the optimizer post-hook; call it yourself only
        when install() was given optimizer=None."""
        with self._lock:
            now = time.monotonic()
            self._last_step_s, self._step_began = now - self._step_began, now
            self._inside_since = now
            try:
                sample = self._timer.end_step()
                if sample.sampled:
                    self._publish_sampled(sample)
                if (self._lockstep is not None and self._stopped is None
                        and self._step % self._lockstep.every == 0):
                    self._lockstep_step()
                self._step += 1
                self._tokens = math.nan
                if self._collectives is not None:
                    self._collectives.poll()  # groups created during the step
                step = self._step
                if self._paused or self._held or self._stopped is not None:
                    step = self._not_sampled(step)
                self._begin_step(step)
            finally:
                self._inside_since = None

    def _publish_sampled(self, sample: Any) -> None:
        kernel = self._kernel_fields(sample.step)
        try:
            self._publish(sample, kernel)
        except Exception:
            self._publish_failures += 1
            if self._publish_failures == 1:  # the rest are summarised at uninstall
                log.warning("relax_straggler: could not publish step %d; training continues (further "
                            "failures are counted)", sample.step, exc_info=True)

    def _not_sampled(self, step: int) -> int:
        """-1, the step the timer never samples, for `step` paused by the operator, held by
        the metrics rank or after the analysis stopped; counts the samples a hold skips."""
        if self._held and not self._paused and self._stopped is None:
            if step >= self.config.warmup_steps and step % self._timer.interval == 0:
                self._skipped_samples += 1
        return -1

    def summary(self) -> Optional[RunSummary]:
        """The run summary (metrics rank only; None elsewhere)."""
        return self._summary

    @property
    def stopped_by(self) -> Optional[SideFailure]:
        """Why the analysis ended on this rank (a side-group failure, named by the rank that
        saw it); None while it runs. Training is never affected."""
        return self._stopped

    def inside(self) -> Optional[dict[str, Any]]:
        """What the training thread has been doing inside the analyzer, when it is there
        now: {"what", "step", "for_s"}; else None. Safe from any thread (the hang watchdog)."""
        since = self._inside_since
        if since is None:
            return None
        return {"what": "ending the step", "step": self._step, "for_s": max(time.monotonic() - since, 0.0)}

    @property
    def ops(self) -> Union[OpRecorder, NullOpRecorder]:
        """Per-op records of sampled steps for the live what-if replay (docs/WHATIF.md, "Live"):
        ``with analyzer.ops.op("forward-compute", microbatch=i):``, ``ops.set_worker(dp_rank, stage)``;
        records nothing unless --straggler-max-ops (StragglerConfig.max_ops) is >= 2."""
        return self._ops

    @property
    def timer(self) -> Any:
        """The underlying relax_straggler._C.StageTimer (counters for tests and benchmarks)."""
        return self._timer

    def counters(self) -> dict[str, int]:
        """Every loss so far, as published under straggler/*."""
        return {
            "dropped_reports": self._pipeline.dropped_reports if self._pipeline else 0,
            "dropped_sections": self._timer.dropped_sections,
            "dropped_collectives": self._timer.dropped_collectives,
            "unmatched_stops": self._timer.unmatched_stops,
            "open_at_step_end": self._timer.open_at_step_end,
            "skipped_samples": self._skipped_samples,
            "control_refused": self._lockstep.refused if self._lockstep is not None else 0,
            **(self._store_sink.counters() if self._store_sink is not None else {}),
        }

    def uninstall(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
        """Removes every hook, delivers pending reports and releases the side group, within
        timeout_s seconds whatever a report sink or a peer does. Collective when
        distributed: every rank calls it; a rank gone or stopped costs at most the bound.
        Past the bound, the reports not yet delivered are dropped (one warning says how
        many) and no sink is called after this returns. Never raises for a peer's fault or
        a sink's (a full disk under the JSONL file is one warning); a second call does nothing.
        It first waits, at most min(config.join_timeout_s, timeout_s / 2), for every rank to
        reach uninstall(); a rank missing is logged as an error naming uninstall() and the
        missing ranks. On the metrics rank it then logs the run's summary (unless config.quiet)."""
        if self._uninstalled:
            return
        self._uninstalled = True
        deadline = time.monotonic() + timeout_s
        if self._publish_failures > 1:
            log.warning("relax_straggler: %d sampled steps could not be published", self._publish_failures)
        self._meet_at_uninstall(min(self.config.join_timeout_s, timeout_s / 2))
        try:
            if self._hang is not None:
                self._hang.stop(timeout_s=min(1.0, timeout_s / 5))
            self._hooks.remove()
            if self._collectives is not None:
                self._collectives.restore()
            if self._module_hooks is not None:
                self._module_hooks.remove()
            self._timer.begin_step(-1)  # step -1 is never sampled: sections become no-ops
            self._run_queue.close()
            self._gc.remove()
            self._stacks.close()
            if self._kernels is not None:
                self._call_kernels(lambda source: source.close())
            # The sinks get the bound less a reserve for the side group and their closing.
            reserve = min(1.0, timeout_s / 5)
            if self._pipeline is not None:
                self._pipeline.close(max(deadline - time.monotonic() - reserve, 0))
            self._close_side_group(deadline)
            for sink in self._sinks:
                try:  # half of what is left: the store's flush and its writer's join each take up to it
                    sink.close(max((deadline - time.monotonic()) / 2, 0))
                except Exception:  # a sink's failure is its own: the others close, uninstall returns
                    log.warning("relax_straggler: closing report sink %r failed; shutdown goes on", sink,
                                exc_info=True)
            if self._narrator is not None:
                self._narrator.finished(self._summary)
        finally:
            if self in _ACTIVE:
                _ACTIVE.remove(self)

    # internals -------------------------------------------------------------------------
    def _meet_at_uninstall(self, timeout_s: float) -> None:
        """Waits up to timeout_s for every rank to reach uninstall() (none once the analysis
        stopped: a peer is gone). A rank missing is logged as an error naming uninstall(),
        and the side group is then released without waiting for it; never raises."""
        if not isinstance(self._gather, SideGroupGather) or self._stopped is not None:
            return
        try:
            meet("uninstall()", timeout_s)
        except JoinTimeout as exc:
            self._alone = True
            log.error("%s; the analysis ends here without waiting for them", exc)
        except Exception as exc:  # the job's store is gone (its host rank exited): nothing to wait for
            self._alone = True
            log.warning("relax_straggler: uninstall() could not check that every rank called it: %s", reason(exc))

    def _lockstep_step(self) -> None:
        """At a decision step: notes what the side group's gathers say, applies the decision
        due (every rank alike) and launches the next one."""
        self._gather.poll()
        try:
            decision = self._lockstep.at_step(self._step, self._decide, self._last_step_s, self._stack_rank)
        except SideGroupFailed as exc:  # the metrics rank's decision did not come: a rank gone or stopped
            self._stop(exc.failure)
            return
        if decision is not None:
            self._take(decision)

    def _decide(self) -> tuple[bool, Optional[SideFailure]]:
        """The metrics rank's decision launched now, (hold, stop), for the period it will be
        applied to. Stop for the first failure seen here or asked for by another rank; hold
        while a gather from before the previous decision is unfinished (a rank that far
        behind) or the report queue is half full (the report thread behind). The first hold
        is logged once, with its reason."""
        stop = self._gather.failure or self._gather.requested
        oldest = self._gather.oldest_unfinished_step()
        behind = oldest is not None and oldest < self._step - self._lockstep.every
        backlog = self._pipeline is not None and 2 * self._pipeline.backlog >= self.config.queue_size
        if (behind or backlog) and not self._hold_logged:
            self._hold_logged = True
            why = (f"the rows of step {oldest} have not all arrived" if behind else
                   f"its report queue holds {self._pipeline.backlog} of {self.config.queue_size} reports")
            log.warning("relax_straggler: the metrics rank is behind (%s): sampling holds on every rank from step %d "
                        "until it caught up (counted in straggler/skipped_samples); training continues", why,
                        self._step + self._lockstep.depth * self._lockstep.every + 1)
        return behind or backlog, stop

    def _stack_rank(self) -> int:
        """The rank the next decision asks for its stack (metrics rank), -1 none; asked once."""
        rank, self._stack_wanted = self._stack_wanted, -1
        return rank

    def _take(self, decision: Decision) -> None:
        """Applies the metrics rank's decision from the next step on (every rank at the same step)."""
        if decision.stack_rank >= 0 and decision.stack_rank == self._gather.rank:
            self._stacks.arm()
        if decision.command is not None:
            self._apply(decision.command, self._step + 1)
        if decision.hold != self._held:
            self._held = decision.hold
            if self._gather.is_metrics_rank:
                log.info("relax_straggler: sampling %s from step %d on every rank",
                         "holds" if decision.hold else "resumes", self._step + 1)
        if decision.stop is not None:
            self._stop(decision.stop)

    def _stop(self, failure: SideFailure) -> None:
        """Ends the analysis on this rank (training goes on) with one warning naming the
        failure; this rank's own account of it, when it saw one, has the details."""
        own = self._gather.failure
        text = failure.describe()
        if own is not None and own.same(failure):
            text = own.describe()
        elif own is not None:
            text += f"; here, {own.describe()}"
        self._stopped = failure
        self._gather.stop(failure)
        log.warning("relax_straggler: the analysis stops on this rank from step %d: %s; training continues",
                    self._step + 1, text)

    def _close_side_group(self, deadline: float) -> None:
        """Waits for the side group's last collectives until `deadline`, then releases it;
        a failure there (a peer gone) is logged once, never raised. No wait once the
        analysis stopped (the group is broken)."""
        def left() -> float:
            return 0.0 if self._stopped is not None or self._alone else max(deadline - time.monotonic(), 0.0)

        clean = self._lockstep.close(left()) if isinstance(self._lockstep, LockstepChannel) else True
        try:
            self._gather.close(left(), clean=clean)
        except (RuntimeError, ValueError) as exc:  # e.g. the default group already destroyed
            log.warning("relax_straggler: the side group could not be released cleanly: %s", reason(exc))

    def _begin_step(self, step: int) -> None:
        timed = self._timer.begin_step(step)
        if timed:
            self._run_queue.start()
            self._gc.mark(step)
            if self._kernels is not None:
                self._call_kernels(lambda source: source.begin_step(step))
        # A stack sample holds the interpreter lock (and, on a crowded host, waits for a CPU
        # holding it): the step it falls in runs longer, so it samples steps the verdict does
        # not judge, but at interval 1 where every step is timed.
        if self._stacks.armed and (not timed or self._timer.interval == 1):
            self._stacks.step_began(self._last_step_s)

    def _kernel_fields(self, step: int) -> Any:
        """The kernel fields of the sampled step that just ended, or None (not measured)."""
        if self._kernels is None:
            return None
        evidence = self._call_kernels(lambda source: source.end_step(step))
        return None if evidence is None else evidence.fields()

    def _call_kernels(self, call: Callable[[KernelSource], Any]) -> Any:
        """call(source); a failing source is logged once and dropped: training continues on events only."""
        try:
            return call(self._kernels)
        except Exception:
            log.warning("relax_straggler: the kernel-record source %s failed; stage times come from events only "
                        "from now on", getattr(self._kernels, "name", "?"), exc_info=True)
            source, self._kernels = self._kernels, None
            with contextlib.suppress(Exception):
                source.close()
            return None

    def _publish(self, sample: Any, kernel: Any = None) -> None:
        row = row_from_sample(sample, self._tokens, self._gather.rank, self._comparison_group,
                              self._hooks.forward_passes, kernel, self._run_queue.elapsed_ms(),
                              self._gc.take(self._step), self._stacks.take(),
                              untimed=self._collectives is not None or isinstance(self._gather, LocalGather))
        request = None if self._gather.is_metrics_rank else self._gather.failure  # the metrics rank decides itself
        pending = self._gather.gather(row, self._ops.take_row(sample.step), sample.step, request)
        if pending is not None and self._pipeline is not None:
            self._pipeline.submit(pending, sample.step)

    def _apply(self, command: ControlCommand, from_step: int) -> None:
        """Applies a runtime-control command from step `from_step` on (every rank calls this
        at the same step with the same command)."""
        if command.enabled is not None:
            self._paused = not command.enabled
        if command.interval is not None:
            self._timer.set_interval(command.interval)
        if self._judge is not None:  # the metrics rank's: thresholds judge the steps from from_step on
            self._judge.control(from_step, command.changes())
        if self._gather.is_metrics_rank:
            log.info("relax_straggler: control: from step %d: %s", from_step, command.changes())

    def _build_report(self, pending: PendingRows, step: int) -> Optional[Report]:
        """Report thread: waits for the step's rows, has the judge judge them and asks a rank
        newly confirmed for its stack."""
        try:
            rows = pending.wait()
        except GatherUnavailable:
            return None  # the gather logged why (once); the step has no report
        label = step if self._step_label is None else self._step_label(step)
        report = self._judge.report(unpack(rows), pending.op_rows(), step, self.counters(), label=label)
        self._ask_for_stacks(report.verdict)
        return report

    def _ask_for_stacks(self, verdict: Any) -> None:
        """Report thread: a rank newly confirmed a straggler is asked for its stack in the next
        decision (the headline's first); a rank no longer confirmed may be asked again later."""
        confirmed = verdict.straggler_ranks
        self._stack_asked &= set(confirmed)
        new = [f.rank for f in verdict.findings if f.state == "straggler" and f.rank >= 0
               and f.rank not in self._stack_asked]
        if new and self._stack_wanted < 0:
            self._stack_wanted = new[0]
            self._stack_asked.add(new[0])


def _start_hang_watchdog(analyzer: Analyzer, ranks: list[int], sinks: Optional[Sequence[Sink]]) -> Any:
    """The hang watchdog of this rank (relax_straggler.hang), or None (one warning) when the
    job has no c10d store to publish through."""
    from relax_straggler.hang.channel import StoreChannel
    from relax_straggler.hang.publish import HangPublisher
    from relax_straggler.hang.watchdog import HangWatchdog

    config = analyzer.config
    channel = StoreChannel.from_default_group(timeout_s=min(10.0, max(1.0, config.hang_seconds / 4)))
    if channel is None:
        log.warning("relax_straggler: no c10d store to publish hang snapshots through; the hang watchdog is off")
        return None
    collectives = analyzer._collectives
    return HangWatchdog(rank=dist.get_rank(), ranks=ranks, metrics_rank=analyzer._gather.metrics_global_rank,
                        hang_s=config.hang_seconds, steps=lambda: analyzer._step,
                        progress=collectives.progress if collectives is not None else list, channel=channel,
                        publish=HangPublisher(sinks, config), inside=analyzer.inside).start()


def _configured_outputs(config: StragglerConfig, report_fn: Optional[Callable[..., None]]) -> list[str]:
    """The outputs and analysis options set in a config whose analysis is off, as flags."""
    named = [flag for flag, on in (("--straggler-jsonl", config.jsonl_path), ("--straggler-store", config.store_url),
                                   ("--straggler-console", config.console),
                                   ("--straggler-console-verbose", config.console_verbose),
                                   ("--straggler-control-file", config.control_file),
                                   ("--straggler-kernel-stats", config.kernel_stats)) if on]
    return named + (["report_fn"] if report_fn is not None else [])


def _use_cuda(config: StragglerConfig, models: list[torch.nn.Module]) -> bool:
    if config.device_events == "cpu":
        return False
    if config.device_events == "cuda":
        return True
    if not (torch.cuda.is_available() and ext().with_cuda):
        return False
    return any(p.is_cuda for m in models for p in m.parameters())


_ACTIVE: list[Analyzer] = []  # installed analyzers, newest last (the module-level section() uses it)


def install(model: Models, optimizer: Optional[torch.optim.Optimizer] = None, *,
            config: Optional[StragglerConfig] = None, report_fn: Optional[Callable[[dict, int], None]] = None,
            group: Optional[dist.ProcessGroup] = None, comparison_group: Optional[int] = None,
            kernel_source: Optional[KernelSource] = None,
            step_label: Optional[Callable[[int], int]] = None) -> Union[Analyzer, NullAnalyzer]:
    """Attaches straggler analysis to a training loop.

    model: a module or a list of model chunks (virtual pipeline), or None for manual
    sections only. optimizer: its step() ends each step; with None, call
    analyzer.step() once per step yourself. config: None means enabled with defaults;
    a config with enabled=False returns a NullAnalyzer and registers nothing.
    report_fn(metrics: dict, step: int): called on the metrics rank, off the training
    thread, once per sampled step, with the report's numbers (int and float values); a
    report_fn with a `details` parameter also gets the strings and lists (status, cause,
    hints, rank lists) as details=dict (relax_straggler.reporters.callback). group: the process group whose ranks are compared
    (default: the world), the same group on every process. Collective when
    torch.distributed is initialized: every rank of the default group calls install() at
    the same point. comparison_group: this rank's group id (0 <= id < 2**31) when ranks
    do different work by design, for example its pipeline-parallel rank: ranks are then
    judged only against their own group and the spread between groups is reported as
    structural imbalance (straggler/{stage}/imbalance_ratio). Give it on every rank or
    on none. kernel_source: where --straggler-kernel-stats (config.kernel_stats) gets kernel
    records (relax_straggler.live.kernel_evidence; e.g. a SyntheticKernelSource); default: what
    the build can run, none (one warning) where it has no CUPTI. step_label(step) -> the
    training loop's own number of a sampled step, given the analyzer's count of steps
    since install (called on the report thread of the metrics rank): every sink, the
    verdict's since_step and the summary then use it; default: that count.
    On the metrics rank it logs, through the `relax_straggler` logger (INFO; visible on
    stderr when the process configured no logging), one start-up line, the confirmed
    verdict's changes and the run's summary at uninstall(), unless config.quiet. A config
    with enabled=False but outputs set (jsonl_path, store_url, console, ...) or a report_fn
    logs one warning that nothing will be written.
    Raises JoinTimeout (a RuntimeError naming install() and the missing ranks) when not
    every rank of the default group calls install() within config.join_timeout_s seconds,
    ValueError for a bad config or comparison_group, or a kernel_source without
    config.kernel_stats, TypeError for an optimizer
    without step hooks, ImportError (with build instructions) when an extension is not
    built.
    A second analyzer installed while one is active is allowed (with a warning).
    """
    config = config if config is not None else StragglerConfig(enabled=True)
    if kernel_source is not None and not config.kernel_stats:
        raise ValueError("install: kernel_source is given but config.kernel_stats (--straggler-kernel-stats) is off")
    if not config.enabled:
        configured = _configured_outputs(config, report_fn)
        if configured and (not dist.is_available() or not dist.is_initialized() or dist.get_rank() == 0):
            log.warning("relax_straggler: %s given but the analysis is off, so nothing is measured or written: add "
                        "--straggler-analysis (StragglerConfig(enabled=True, ...))", ", ".join(configured))
        return NullAnalyzer()
    if _ACTIVE:
        log.warning("relax_straggler: another analyzer is already installed in this process; both will time "
                    "the same steps (uninstall() the first unless that is intended)")
    models = [] if model is None else [model] if isinstance(model, torch.nn.Module) else list(model)
    if optimizer is not None and not hasattr(optimizer, "register_step_pre_hook"):
        raise TypeError(f"{type(optimizer).__name__} has no register_step_pre_hook (torch.optim.Optimizer has): "
                        "pass optimizer=None and call analyzer.step() once per step")
    # The verdict takes group ids as int32.
    if comparison_group is not None and (isinstance(comparison_group, bool) or not isinstance(comparison_group, int)
                                         or not 0 <= comparison_group < 2**31):
        raise ValueError(f"comparison_group must be an integer in [0, 2**31) or None, got {comparison_group!r}")
    analyzer = Analyzer(models, optimizer, config, report_fn, group, comparison_group, kernel_source, step_label)
    _ACTIVE.append(analyzer)
    return analyzer


def section(name: str) -> ContextManager[Any]:
    """`with relax_straggler.section("data"):` on the installed analyzer; a no-op when none is."""
    return _ACTIVE[-1].section(name) if _ACTIVE else _NULL_SECTION
