"""StragglerConfig: the RFC flags (Relax RFC #334) plus the few knobs a deployment needs.

`add_arguments(parser)` adds one ``--straggler-*`` flag per field and `from_args(args)`
reads them back, so the argparse group mirrors this dataclass one to one. The RFC's six
flags keep the RFC's names and defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class StragglerConfig:
    """Analyzer settings. Times are in ms. Raises ValueError naming the flag on bad values."""

    enabled: bool = False  # --straggler-analysis (RFC)
    interval: int = 10  # --straggler-interval (RFC): sample every N-th step
    relative_threshold: float = 1.2  # --straggler-relative-threshold (RFC): slow if t >= ref * this
    absolute_ms_threshold: float = 5.0  # --straggler-absolute-ms-threshold (RFC): or t - ref >= this
    ref: str = "mean"  # --straggler-ref (RFC): mean or median over ranks
    enable_module_stages: bool = False  # --straggler-enable-module-stages (RFC): attention / moe stages
    warmup_steps: int = 10  # steps before the first sample (allocator and compile warm-up)
    noise_floor_ms: float = 1.0  # excess below this is never a straggler (0 = the bare RFC rule)
    metrics_rank: int = 0  # rank (within the analyzed group) that judges and reports
    jsonl_path: Optional[str] = None  # append one JSON line per report here
    store_url: Optional[str] = None  # write per-rank timers to this metrics store (file://, clickhouse://[?job=])
    console: bool = False  # print a table per report on the metrics rank
    queue_size: int = 64  # reports waiting for the sinks; beyond it reports are dropped and counted
    max_events: int = 4096  # event-pool slots per step (two per timed section)
    device_events: str = "auto"  # "auto" (CUDA events when CUDA is in use), "cuda" or "cpu"
    collective_timing: bool = True  # wrap process-group backends to time every collective
    window_every: int = 0  # run the window ensemble every N reports (0: off)
    window_size: int = 100  # reports the window holds
    window_vote_rule: str = "at_least"  # "at_least" (>= window_min_votes algorithms) or "most_votes"
    window_min_votes: int = 3  # algorithms (of 6) that must agree
    window_min_slowdown: float = 0.03  # a slow cluster is at least this much slower than the body
    attention_pattern: str = r"(Attention|Attn)$"  # module class names timed as `attention`
    moe_pattern: str = r"(MoELayer|MoE|SparseMoeBlock|SparseMoE|Experts)$"  # ... as `moe`

    def __post_init__(self) -> None:
        def bad(flag: str, why: str, value: object) -> ValueError:
            return ValueError(f"--straggler-{flag} {why}, got {value!r}")

        if not _is_int(self.interval) or self.interval < 1:
            raise bad("interval", "must be an integer >= 1", self.interval)
        if not _is_finite(self.relative_threshold) or self.relative_threshold < 1.0:
            raise bad("relative-threshold", "must be a finite number >= 1", self.relative_threshold)
        if not _is_finite(self.absolute_ms_threshold) or self.absolute_ms_threshold < 0:
            raise bad("absolute-ms-threshold", "must be a finite number >= 0", self.absolute_ms_threshold)
        if self.ref not in ("mean", "median"):
            raise bad("ref", "must be 'mean' or 'median'", self.ref)
        if not _is_int(self.warmup_steps) or self.warmup_steps < 0:
            raise bad("warmup-steps", "must be an integer >= 0", self.warmup_steps)
        if not _is_finite(self.noise_floor_ms) or self.noise_floor_ms < 0:
            raise bad("noise-floor-ms", "must be a finite number >= 0", self.noise_floor_ms)
        if not _is_int(self.metrics_rank) or self.metrics_rank < 0:
            raise bad("metrics-rank", "must be an integer >= 0", self.metrics_rank)
        if self.store_url is not None:
            from relax_straggler.monitor.sink import split_sink_url

            try:
                split_sink_url(self.store_url)
            except ValueError as exc:
                raise bad("store", f"is not a store URL ({exc})", self.store_url) from None
        if not _is_int(self.queue_size) or self.queue_size < 1:
            raise bad("queue-size", "must be an integer >= 1", self.queue_size)
        if not _is_int(self.max_events) or self.max_events < 2:
            raise bad("max-events", "must be an integer >= 2", self.max_events)
        if self.device_events not in ("auto", "cuda", "cpu"):
            raise bad("device-events", "must be 'auto', 'cuda' or 'cpu'", self.device_events)
        if not _is_int(self.window_every) or self.window_every < 0:
            raise bad("window-every", "must be an integer >= 0", self.window_every)
        if not _is_int(self.window_size) or self.window_size < 2:
            raise bad("window-size", "must be an integer >= 2", self.window_size)
        if self.window_vote_rule not in ("at_least", "most_votes"):
            raise bad("window-vote-rule", "must be 'at_least' or 'most_votes'", self.window_vote_rule)
        if not _is_int(self.window_min_votes) or not 1 <= self.window_min_votes <= 6:
            raise bad("window-min-votes", "must be an integer in [1, 6]", self.window_min_votes)
        if not _is_finite(self.window_min_slowdown) or self.window_min_slowdown < 0:
            raise bad("window-min-slowdown", "must be a finite number >= 0", self.window_min_slowdown)
        for flag, pattern in (("attention-pattern", self.attention_pattern), ("moe-pattern", self.moe_pattern)):
            try:
                re.compile(pattern)
            except (re.error, TypeError) as exc:
                raise bad(flag, f"must be a regular expression ({exc})", pattern) from None

    def module_patterns(self) -> dict[str, str]:
        """{module stage: class-name regex} for ModuleStageHooks."""
        return {"attention": self.attention_pattern, "moe": self.moe_pattern}

    def replace(self, **changes: object) -> "StragglerConfig":
        return dataclasses.replace(self, **changes)


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def add_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """Adds the ``--straggler-*`` flags to `parser` (one group); returns the group."""
    d = StragglerConfig()
    g = parser.add_argument_group("straggler analysis (relax_straggler)")
    g.add_argument("--straggler-analysis", action="store_true", help="Enable straggler analysis (off by default).")
    g.add_argument("--straggler-interval", type=int, default=d.interval, help="Sample every N-th step.")
    g.add_argument("--straggler-relative-threshold", type=float, default=d.relative_threshold,
                   help="A rank is slow in a stage if its time >= reference x this.")
    g.add_argument("--straggler-absolute-ms-threshold", type=float, default=d.absolute_ms_threshold,
                   help="... or if its time - reference >= this many ms.")
    g.add_argument("--straggler-ref", type=str, default=d.ref, help="Reference over ranks: mean or median.")
    g.add_argument("--straggler-enable-module-stages", action="store_true",
                   help="Also time attention and MoE modules as their own stages.")
    g.add_argument("--straggler-warmup-steps", type=int, default=d.warmup_steps,
                   help="Steps before the first sample.")
    g.add_argument("--straggler-noise-floor-ms", type=float, default=d.noise_floor_ms,
                   help="Never flag an excess over the reference below this many ms (0: bare RFC rule).")
    g.add_argument("--straggler-metrics-rank", type=int, default=d.metrics_rank,
                   help="Rank that judges and reports.")
    g.add_argument("--straggler-jsonl", dest="straggler_jsonl_path", type=str, default=d.jsonl_path,
                   help="Append one JSON line per report to this file.")
    g.add_argument("--straggler-store", dest="straggler_store_url", type=str, default=d.store_url,
                   help="Write per-rank stage times to this metrics store: file://DIR or "
                        "clickhouse://HOST:PORT/DB, optionally ?job=ID (default job: the launcher's run id).")
    g.add_argument("--straggler-console", action="store_true", help="Print a table per report.")
    g.add_argument("--straggler-queue-size", type=int, default=d.queue_size,
                   help="Reports waiting for the sinks before new ones are dropped (and counted).")
    g.add_argument("--straggler-max-events", type=int, default=d.max_events,
                   help="Timing events per step (two per section).")
    g.add_argument("--straggler-device-events", type=str, default=d.device_events,
                   help="auto, cuda or cpu timing events.")
    g.add_argument("--straggler-window-every", type=int, default=d.window_every,
                   help="Run the six-clusterer window ensemble every N reports (0: off).")
    g.add_argument("--straggler-window-size", type=int, default=d.window_size, help="Reports in the window.")
    g.add_argument("--straggler-window-vote-rule", type=str, default=d.window_vote_rule,
                   help="at_least (>= --straggler-window-min-votes algorithms agree) or most_votes.")
    g.add_argument("--straggler-window-min-votes", type=int, default=d.window_min_votes,
                   help="Algorithms that must agree before a rank is reported.")
    g.add_argument("--straggler-window-min-slowdown", type=float, default=d.window_min_slowdown,
                   help="Relative slowdown below which a slow cluster is ignored.")
    g.add_argument("--straggler-attention-pattern", type=str, default=d.attention_pattern,
                   help="Regex on module class names timed as the attention stage (with module stages).")
    g.add_argument("--straggler-moe-pattern", type=str, default=d.moe_pattern,
                   help="Regex on module class names timed as the moe stage (with module stages).")
    g.add_argument("--straggler-no-collective-timing", dest="straggler_collective_timing", action="store_false",
                   help="Do not wrap process-group backends (collectives are then not timed one by one).")
    return g


def from_args(args: argparse.Namespace) -> StragglerConfig:
    """Builds a StragglerConfig from flags added by add_arguments. Raises ValueError."""
    return StragglerConfig(
        enabled=args.straggler_analysis,
        interval=args.straggler_interval,
        relative_threshold=args.straggler_relative_threshold,
        absolute_ms_threshold=args.straggler_absolute_ms_threshold,
        ref=args.straggler_ref,
        enable_module_stages=args.straggler_enable_module_stages,
        warmup_steps=args.straggler_warmup_steps,
        noise_floor_ms=args.straggler_noise_floor_ms,
        metrics_rank=args.straggler_metrics_rank,
        jsonl_path=args.straggler_jsonl_path,
        store_url=args.straggler_store_url,
        console=args.straggler_console,
        queue_size=args.straggler_queue_size,
        max_events=args.straggler_max_events,
        device_events=args.straggler_device_events,
        collective_timing=args.straggler_collective_timing,
        window_every=args.straggler_window_every,
        window_size=args.straggler_window_size,
        window_vote_rule=args.straggler_window_vote_rule,
        window_min_votes=args.straggler_window_min_votes,
        window_min_slowdown=args.straggler_window_min_slowdown,
        attention_pattern=args.straggler_attention_pattern,
        moe_pattern=args.straggler_moe_pattern,
    )
