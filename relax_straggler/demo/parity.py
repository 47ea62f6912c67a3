"""A/B loss parity: training with the analyzer on must be bitwise the training without it.

docs/ARCHITECTURE.md invariant 6 (observing never changes numerics), checked end to end. The same training
(same seed, same data order) runs several times in one process, one run after the other:

  reference   analyzer off (install() with enabled=False: a NullAnalyzer)
  control     analyzer off again: proves the baseline itself is deterministic; without
              it a difference found later could be the machine's, not the analyzer's
  interval k  analyzer on, sampling every k-th step from step 0, module stages on

Every run records each step's loss and, at the end, every tensor of the training state
(model parameters and buffers, optimizer state). Each run is compared with the reference
bit for bit (a float's bytes, so -0.0 != 0.0 and NaN == NaN with the same payload). Under
torch.distributed every rank runs and compares its own losses and state; the comparisons
are then merged over ranks, so the verdict is the job's.

The training comes from a factory, ``factory(seed) -> ParityTraining``, called once per
run after the global RNGs were seeded (torch, CUDA, numpy, random). docs/PARITY.md gives
the contract for user scripts; `relax_straggler.demo.demo_factory` is the demo GPT's.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np
import torch
import torch.distributed as dist

from relax_straggler.config import StragglerConfig
from relax_straggler.live.analyzer import Analyzer, NullAnalyzer
import relax_straggler

log = logging.getLogger(__name__)

AnyAnalyzer = Union[Analyzer, NullAnalyzer]

#: Exit codes of `ParityResult.exit_code` (and of `relax-straggler parity`; 2 is bad usage there).
EXIT_IDENTICAL, EXIT_DIFFERENT, EXIT_NONDETERMINISTIC = 0, 1, 3

DEFAULT_FACTORY_NAME = "parity_training"


@dataclass(frozen=True)
class ParityTraining:
    """One fresh training, as a factory returns it.

    model: what install() hooks (a module, a list of model chunks, or None).
    optimizer: its step() ends each analyzer step; None means `step` calls analyzer.step().
    step(analyzer, i) -> loss: runs training step i (0-based) and returns its loss, a
        floating tensor of any shape on any device (compared bit for bit; never .item()
        it inside the step for the harness's sake). `analyzer` is the run's analyzer or
        NullAnalyzer: use analyzer.section(...) and analyzer.set_workload(...) as the real
        script does.
    state() -> {name: tensor}: the tensors compared at the end of the run; None means
        every model's state_dict() and the optimizer's state tensors.
    """

    model: Union[torch.nn.Module, Sequence[torch.nn.Module], None]
    optimizer: Optional[torch.optim.Optimizer]
    step: Callable[[AnyAnalyzer, int], torch.Tensor]
    state: Optional[Callable[[], dict[str, torch.Tensor]]] = None


TrainingFactory = Callable[[int], ParityTraining]


@dataclass(frozen=True)
class RunComparison:
    """One run compared with the reference, merged over ranks.

    loss_mismatches: (rank, step) pairs whose loss bits differ. first_mismatch_step: the
    earliest such step, or None. max_loss_abs_diff: largest |loss - reference loss|
    (0.0 when identical). tensors_compared: state tensors compared per rank, summed.
    tensor_mismatches: "rank R: name" of every differing (or missing, or reshaped)
    state tensor, sorted. sampled_steps: steps the analyzer read (its timer's read
    points; 0 for an off run), summed over ranks. reports: reports the metrics rank
    received. step_s: each rank's wall time of every training step, s, in rank order
    (observing must never block a step: docs/PARITY.md).
    """

    name: str
    interval: Optional[int]
    steps: int
    sampled_steps: int
    reports: int
    loss_mismatches: int
    first_mismatch_step: Optional[int]
    max_loss_abs_diff: float
    tensors_compared: int
    tensor_mismatches: tuple[str, ...]
    max_tensor_abs_diff: float
    step_s: tuple[tuple[float, ...], ...] = ()

    @property
    def identical(self) -> bool:
        return self.loss_mismatches == 0 and not self.tensor_mismatches


@dataclass(frozen=True)
class ParityResult:
    """Every run of one parity check. control is None when it was not run."""

    steps: int
    seed: int
    world_size: int
    control: Optional[RunComparison]
    runs: tuple[RunComparison, ...]

    @property
    def deterministic(self) -> bool:
        """The baseline repeats itself bit for bit (True when no control run was made)."""
        return self.control is None or self.control.identical

    @property
    def passed(self) -> bool:
        return self.deterministic and all(r.identical for r in self.runs)

    @property
    def exit_code(self) -> int:
        """0 identical, 1 a run with the analyzer differs, 3 the baseline is not deterministic."""
        if not self.deterministic:
            return EXIT_NONDETERMINISTIC
        return EXIT_IDENTICAL if self.passed else EXIT_DIFFERENT

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "seed": self.seed,
            "world_size": self.world_size,
            "deterministic": self.deterministic,
            "passed": self.passed,
            "control": dataclasses.asdict(self.control) if self.control else None,
            "runs": [dataclasses.asdict(r) for r in self.runs],
        }


@dataclass(frozen=True)
class _Trace:
    """What one rank recorded in one run: per-step losses and wall times (s), the final state (CPU)."""

    losses: list[torch.Tensor]
    state: dict[str, torch.Tensor]
    sampled_steps: int
    reports: int
    step_s: list[float]


def seed_everything(seed: int) -> None:
    """Seeds torch (all devices), numpy's global generator and random."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def default_state(training: ParityTraining) -> dict[str, torch.Tensor]:
    """Every model's state_dict() and every tensor of the optimizer's state, by name."""
    out: dict[str, torch.Tensor] = {}
    models = training.model if isinstance(training.model, (list, tuple)) else [training.model]
    for i, model in enumerate(m for m in models if m is not None):
        prefix = f"model{i}." if len(models) > 1 else "model."
        for name, t in model.state_dict().items():
            out[prefix + name] = t
    if training.optimizer is not None:
        for pid, slots in training.optimizer.state_dict()["state"].items():
            for key, value in slots.items():
                if isinstance(value, torch.Tensor):
                    out[f"optimizer.state.{pid}.{key}"] = value
    return out


def run_training(factory: TrainingFactory, seed: int, steps: int, config: StragglerConfig) -> _Trace:
    """Builds a fresh training with `factory(seed)` and runs `steps` steps under an
    analyzer installed with `config` (enabled or not). Collective when distributed."""
    seed_everything(seed)
    training = factory(seed)
    if not isinstance(training, ParityTraining):
        raise TypeError(f"the parity factory must return a relax_straggler.demo.parity.ParityTraining, "
                        f"got {type(training).__name__}")
    reports = 0

    def count_report(metrics: dict, step: int) -> None:
        nonlocal reports
        reports += 1

    analyzer = relax_straggler.install(training.model, training.optimizer, config=config, report_fn=count_report)
    losses, step_s = [], []
    try:
        for i in range(steps):
            began = time.perf_counter()
            loss = training.step(analyzer, i)
            step_s.append(time.perf_counter() - began)
            if not (isinstance(loss, torch.Tensor) and loss.is_floating_point()):
                raise TypeError(f"step {i}: the step function must return the loss as a floating tensor, "
                                f"got {type(loss).__name__}")
            losses.append(loss.detach().clone())
    finally:
        analyzer.uninstall()  # flushes the report thread, so `reports` is final
    sampled = analyzer.timer.read_points if isinstance(analyzer, Analyzer) else 0
    state = training.state() if training.state is not None else default_state(training)
    return _Trace(losses=[t.cpu() for t in losses], state={k: v.detach().cpu().clone() for k, v in state.items()},
                  sampled_steps=int(sampled), reports=reports, step_s=step_s)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when a and b have the same dtype, shape and bytes."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(_bits(a), _bits(b))


def abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| in float64 over finite entries (inf when shapes differ, 0.0 if empty)."""
    if a.shape != b.shape:
        return math.inf
    if a.numel() == 0 or not (a.is_floating_point() or a.is_complex()):
        return 0.0 if torch.equal(a, b) else math.inf
    wide = torch.complex128 if a.is_complex() or b.is_complex() else torch.float64
    d = (a.to(wide) - b.to(wide)).abs()
    d = d[torch.isfinite(d)]
    return float(d.max()) if d.numel() else 0.0


def compare(name: str, interval: Optional[int], ref: _Trace, run: _Trace, rank: int) -> RunComparison:
    """One rank's comparison of `run` with `ref`."""
    mismatched_steps = [i for i, (a, b) in enumerate(zip(ref.losses, run.losses)) if not same_bits(a, b)]
    loss_diff = max((abs_diff(a, b) for a, b in zip(ref.losses, run.losses)), default=0.0)
    names = sorted(set(ref.state) | set(run.state))
    bad = [n for n in names if n not in ref.state or n not in run.state or not same_bits(ref.state[n], run.state[n])]
    tensor_diff = max((abs_diff(ref.state[n], run.state[n]) for n in bad if n in ref.state and n in run.state),
                      default=0.0)
    return RunComparison(
        name=name, interval=interval, steps=len(run.losses), sampled_steps=run.sampled_steps, reports=run.reports,
        loss_mismatches=len(mismatched_steps), first_mismatch_step=min(mismatched_steps, default=None),
        max_loss_abs_diff=loss_diff, tensors_compared=len(names),
        tensor_mismatches=tuple(f"rank {rank}: {n}" for n in bad), max_tensor_abs_diff=tensor_diff,
        step_s=(tuple(run.step_s),))


def merge(parts: Sequence[RunComparison]) -> RunComparison:
    """Merges the ranks' comparisons of one run (sums, minimum first step, maxima)."""
    firsts = [p.first_mismatch_step for p in parts if p.first_mismatch_step is not None]
    return dataclasses.replace(
        parts[0],
        sampled_steps=sum(p.sampled_steps for p in parts),
        reports=sum(p.reports for p in parts),
        loss_mismatches=sum(p.loss_mismatches for p in parts),
        first_mismatch_step=min(firsts, default=None),
        max_loss_abs_diff=max(p.max_loss_abs_diff for p in parts),
        tensors_compared=sum(p.tensors_compared for p in parts),
        tensor_mismatches=tuple(sorted(m for p in parts for m in p.tensor_mismatches)),
        max_tensor_abs_diff=max(p.max_tensor_abs_diff for p in parts),
        step_s=tuple(times for p in parts for times in p.step_s),
    )


def _merge_over_ranks(local: list[RunComparison]) -> list[RunComparison]:
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return local
    everyone: list[Optional[list[RunComparison]]] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, local)
    return [merge([ranks[i] for ranks in everyone]) for i in range(len(local))]


def run_parity(factory: TrainingFactory, *, steps: int = 30, intervals: Sequence[int] = (1, 10), seed: int = 0,
               control: bool = True, module_stages: bool = True,
               base_config: Optional[StragglerConfig] = None) -> ParityResult:
    """Runs the reference, the control (if `control`) and one analyzer-on run per interval,
    and compares each with the reference bit for bit.

    steps >= 1 training steps per run; intervals: sampling intervals (>= 1) of the on
    runs, whose first sample is step 0. base_config: settings of the on runs other than
    enabled, interval, warmup and module stages (default: StragglerConfig()). Collective
    when torch.distributed is initialized: every rank calls it with the same arguments.
    Raises ValueError on bad arguments; whatever the factory or step function raises.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if not intervals or any(not isinstance(k, int) or k < 1 for k in intervals):
        raise ValueError(f"intervals must be integers >= 1, got {list(intervals)}")
    distributed = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    base = base_config or StragglerConfig()
    off = base.replace(enabled=False)

    log.info("parity: reference run (analyzer off), %d steps", steps)
    ref = run_training(factory, seed, steps, off)
    local: list[RunComparison] = []
    if control:
        log.info("parity: control run (analyzer off again)")
        local.append(compare("off (control)", None, ref, run_training(factory, seed, steps, off), rank))
    for k in intervals:
        log.info("parity: analyzer on, interval %d", k)
        on = base.replace(enabled=True, interval=k, warmup_steps=0, enable_module_stages=module_stages)
        local.append(compare(f"on, interval {k}", k, ref, run_training(factory, seed, steps, on), rank))
    merged = _merge_over_ranks(local)
    return ParityResult(steps=steps, seed=seed, world_size=world, control=merged[0] if control else None,
                        runs=tuple(merged[1:] if control else merged))


def load_factory(spec: str) -> TrainingFactory:
    """Loads a user factory from "path/to/script.py" or "path/to/script.py:name"
    (default name: parity_training). The script is imported as a module, so its
    `if __name__ == "__main__":` block does not run. Raises FileNotFoundError for a
    missing file and AttributeError / TypeError for a missing or non-callable factory."""
    path_s, _, name = spec.partition(":")
    name = name or DEFAULT_FACTORY_NAME
    path = Path(path_s)
    if not path.is_file():
        raise FileNotFoundError(f"parity script {path_s!r} not found")
    module_spec = importlib.util.spec_from_file_location(f"relax_straggler_parity_user_{path.stem}", path)
    if module_spec is None or module_spec.loader is None:
        raise ImportError(f"cannot import {path_s!r} as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    factory = getattr(module, name, None)
    if factory is None:
        raise AttributeError(f"{path_s} has no {name!r}: define `def {name}(seed: int) -> ParityTraining` "
                             "(docs/PARITY.md)")
    if not callable(factory):
        raise TypeError(f"{path_s}:{name} is not callable")
    return factory
