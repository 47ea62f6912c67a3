"""StragglerConfig: the six established analysis flags plus the few knobs a deployment needs.

`add_arguments(parser)` adds one ``--straggler-*`` flag per field and `from_args(args)`
reads them back; both are derived from the fields (relax_straggler.common.dataclass_flags), so the
argparse group mirrors this dataclass one to one. The six established flags keep their
names and defaults; the thresholds' defaults and bounds are relax_straggler.common.thresholds'.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from dataclasses import dataclass
from typing import Optional

from relax_straggler.common import thresholds
from relax_straggler.common.dataclass_flags import add_field_flags, config_from_args, flag_field
from relax_straggler.common.validators import is_finite, is_int, require_int, require_window_size

_DEST_PREFIX = "straggler_"


@dataclass(frozen=True)
class StragglerConfig:
    """Analyzer settings. Times are in ms. Raises ValueError naming the flag on bad values.

    Each field is one ``--straggler-*`` flag; its help text below is the flag's help."""

    # The six established flags. A rank is slow in a stage if its time >= reference x
    # relative_threshold or its time - reference >= absolute_ms_threshold.
    enabled: bool = flag_field(False, "Enable straggler analysis (off by default).", name="analysis",
                               dest="straggler_analysis", action="store_true")
    interval: int = flag_field(10, "Sample every N-th step.")
    relative_threshold: float = flag_field(thresholds.RELATIVE_THRESHOLD,
                                           "A rank is slow in a stage if its time >= reference x this.")
    absolute_ms_threshold: float = flag_field(thresholds.ABSOLUTE_MS_THRESHOLD,
                                              "... or if its time - reference >= this many ms.")
    ref: str = flag_field("mean", "Reference over ranks: mean or median.")
    enable_module_stages: bool = flag_field(False, "Also time attention and MoE modules as their own stages.",
                                            action="store_true")
    # Deployment knobs.
    warmup_steps: int = flag_field(10, "Steps before the first sample.")  # allocator and compile warm-up
    noise_floor_ms: float = flag_field(
        1.0, "Never flag an excess over the reference below this many ms (0: the thresholds alone).")
    metrics_rank: int = flag_field(0, "Rank that judges and reports.")  # within the analyzed group
    jsonl_path: Optional[str] = flag_field(None, "Append one JSON line per report to this file.", name="jsonl")
    store_url: Optional[str] = flag_field(
        None, "Write per-rank stage times to this metrics store: file://DIR or "
              "clickhouse://HOST:PORT/DB, optionally ?job=ID (default job: the launcher's run id).", name="store")
    console: bool = flag_field(False, "Print verdict changes and confirmed stragglers on the metrics rank.",
                               action="store_true")
    quiet: bool = flag_field(False, "No start-up line, verdict changes or end-of-run summary through the "
                                    "relax_straggler logger on the metrics rank.", action="store_true")
    console_verbose: bool = flag_field(False, "With --straggler-console, also print the per-step table of every "
                                              "report.", action="store_true")
    confirm_reports: int = flag_field(3, "Sampled reports in a row a rank must be slow in before it is confirmed a "
                                         "straggler (straggler/verdict/*).")
    recover_reports: int = flag_field(2, "Reports in a row without evidence before a confirmed straggler is released "
                                                  "(recovered).")
    control_file: Optional[str] = flag_field(
        None, "Runtime control: a JSON command in this file ({\"enabled\": false}, {\"interval\": 20}, "
              "{\"relative_threshold\": 1.3}) is read by the metrics rank and applied on every rank at the same "
              "step.")
    control_every: int = flag_field(50, "Steps between the metrics rank's decisions to every rank (sample or "
                                        "hold, the control file's command, stop), each applied at least 16 steps "
                                        "after it was sent.")
    side_node_size: Optional[int] = flag_field(
        None, "Hierarchical side channel: ranks gather to a leader per node of this many consecutive ranks, "
              "leaders to the metrics rank through a tree (-1: the launcher's LOCAL_WORLD_SIZE; 0: one flat "
              "group; default: one flat group up to 256 analyzed ranks, above that the tree, nodes of "
              "LOCAL_WORLD_SIZE (8 where the launcher gives none), with lazy connections).")
    side_fanout: int = flag_field(8, "Hierarchical side channel: leaders per group at each level above the nodes.")
    side_lazy_init: bool = flag_field(
        False, "Create the side channel's Gloo groups with lazy connections (TORCH_GLOO_LAZY_INIT): a rank "
               "connects only to the peers it exchanges with, on first use.", action="store_true")
    queue_size: int = flag_field(64, "Reports waiting for the sinks before new ones are dropped (and counted).")
    max_events: int = flag_field(4096, "Timing events per step (two per section).")  # event-pool slots
    max_ops: Optional[int] = flag_field(
        None, "Per-op records kept per rank and sampled step for the live what-if, gathered with the stage row "
              "(16 float64 each): default 256 under the Megatron adapter, which records its microbatch ops, else "
              "0 (none; the row stays the stage row).")
    device_events: str = flag_field("auto", "auto, cuda or cpu timing events.")  # auto: CUDA events when CUDA is in use
    kernel_stats: bool = flag_field(
        False, "On sampled steps, also collect kernel records (CUPTI) and tell per stage the time kernels ran, the "
               "time the stream sat idle and the NCCL kernels' time (straggler/{stage}/kernel_ms, idle_ms); the "
               "confirmed verdict's cause then reads device, host or communication_link. Needs a CUDA build with "
               "CUPTI: elsewhere one warning, and stage times from events only.", action="store_true")
    collective_timing: bool = flag_field(
        True, "Do not wrap process-group backends (collectives are then not timed one by one).",
        name="no-collective-timing", action="store_false")
    hang_seconds: float = flag_field(
        60.0, "Seconds without a step ending, after the first, before each rank publishes how far each of its "
              "process groups got and the job is told which rank and collective hold it (0: no watchdog).")
    join_timeout_s: float = flag_field(
        60.0, "Seconds install() and uninstall() wait for every rank to call them before install() raises "
              "naming the missing ranks (uninstall() logs them).", name="join-timeout")
    window_every: int = flag_field(
        10, "Run the six-clusterer window ensemble every N reports, a witness of the confirmed verdict (0: off).")
    window_size: int = flag_field(50, "Reports in the window.")
    window_vote_rule: str = flag_field(
        "at_least", "at_least (>= --straggler-window-min-votes algorithms agree) or most_votes.")
    window_min_votes: int = flag_field(thresholds.WINDOW_MIN_VOTES,
                                       "Algorithms that must agree before a rank is reported.")  # of 6
    window_min_slowdown: float = flag_field(thresholds.WINDOW_MIN_SLOWDOWN,
                                            "Relative slowdown below which a slow cluster is ignored.")
    attention_pattern: str = flag_field(
        r"(Attention|Attn)$", "Regex on module class names timed as the attention stage (with module stages).")
    moe_pattern: str = flag_field(r"(MoELayer|MoE|SparseMoeBlock|SparseMoE|Experts)$",
                                  "Regex on module class names timed as the moe stage (with module stages).")

    def __post_init__(self) -> None:
        def bad(flag: str, why: str, value: object) -> ValueError:
            return ValueError(f"--straggler-{flag} {why}, got {value!r}")

        require_int(self.interval, "--straggler-interval", 1)
        for field in thresholds.FIELDS:
            why = thresholds.violation(field, getattr(self, field))
            if why is not None:
                raise bad(field.replace("_", "-"), why, getattr(self, field))
        if self.ref not in ("mean", "median"):
            raise bad("ref", "must be 'mean' or 'median'", self.ref)
        require_int(self.warmup_steps, "--straggler-warmup-steps", 0)
        if not is_finite(self.noise_floor_ms) or self.noise_floor_ms < 0:
            raise bad("noise-floor-ms", "must be a finite number >= 0", self.noise_floor_ms)
        require_int(self.metrics_rank, "--straggler-metrics-rank", 0)
        if self.store_url is not None:
            from relax_straggler.stores.url import parse_writer_url

            try:
                parse_writer_url(self.store_url)
            except ValueError as exc:
                raise bad("store", f"is not a store URL ({exc})", self.store_url) from None
        if self.side_node_size is not None:
            require_int(self.side_node_size, "--straggler-side-node-size", -1)
        require_int(self.side_fanout, "--straggler-side-fanout", 2)
        require_int(self.queue_size, "--straggler-queue-size", 1)
        require_int(self.max_events, "--straggler-max-events", 2)
        if self.max_ops is not None and (not is_int(self.max_ops) or self.max_ops == 1 or self.max_ops < 0):
            raise bad("max-ops", "must be 0 (none) or an integer >= 2", self.max_ops)
        if self.device_events not in ("auto", "cuda", "cpu"):
            raise bad("device-events", "must be 'auto', 'cuda' or 'cpu'", self.device_events)
        for flag, value in (("confirm-reports", self.confirm_reports), ("recover-reports", self.recover_reports),
                            ("control-every", self.control_every)):
            require_int(value, f"--straggler-{flag}", 1)
        if self.control_file is not None and (not isinstance(self.control_file, str) or not self.control_file):
            raise bad("control-file", "must be a file path", self.control_file)
        if not is_finite(self.hang_seconds) or self.hang_seconds < 0:
            raise bad("hang-seconds", "must be a finite number >= 0", self.hang_seconds)
        if not is_finite(self.join_timeout_s) or self.join_timeout_s <= 0:
            raise bad("join-timeout", "must be a finite number > 0", self.join_timeout_s)
        require_int(self.window_every, "--straggler-window-every", 0)
        require_window_size(self.window_size, "--straggler-window-size")
        if self.window_vote_rule not in ("at_least", "most_votes"):
            raise bad("window-vote-rule", "must be 'at_least' or 'most_votes'", self.window_vote_rule)
        if not is_int(self.window_min_votes) or not 1 <= self.window_min_votes <= 6:
            raise bad("window-min-votes", "must be an integer in [1, 6]", self.window_min_votes)
        if not is_finite(self.window_min_slowdown) or self.window_min_slowdown < 0:
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


def add_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """Adds the ``--straggler-*`` flags to `parser` (one group, one flag per field); returns the group."""
    group = parser.add_argument_group("straggler analysis (relax_straggler)")
    add_field_flags(group, StragglerConfig, prefix="--straggler-", dest_prefix=_DEST_PREFIX)
    return group


def from_args(args: argparse.Namespace) -> StragglerConfig:
    """Builds a StragglerConfig from flags added by add_arguments. Raises ValueError."""
    return config_from_args(StragglerConfig, args, dest_prefix=_DEST_PREFIX)
