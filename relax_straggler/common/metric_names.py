"""Every name the package publishes under ``straggler/``, in one table, with the constants and
helpers its writers and readers use instead of spelling a name.

Two tables:
  METRICS     the names of a report's metrics (report_fn, the JSONL, the console, TensorBoard),
              documented in docs/METRICS.md; a name is published only in the reports the
              entry's meaning says
  STORE_ROWS  the metric_name of the rows this package writes into a metrics store beside
              Megatron's timers, documented in docs/STORES.md

A name is a plain name or a pattern whose ``{stage}`` is a name of
relax_straggler.common.stages.STAGES and whose ``{rank}`` is a global rank. Names never change
meaning; new ones may be added (docs/ARCHITECTURE.md, "Data contract").
tests/python/test_metric_names.py holds the docs, the writers and the rest of the package
to the tables.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MetricName:
    """One published name. name: the name or its pattern (``straggler/{stage}/max_ms``);
    unit: ms, s, x (a ratio), count, rank, step, text, ...; meaning: one line."""

    name: str
    unit: str
    meaning: str


PREFIX = "straggler/"


def stage_prefix(stage: str) -> str:
    """``straggler/{stage}/``: the prefix of a stage's per-step metrics (the METRICS entries
    ``straggler/{stage}/...``)."""
    return f"{PREFIX}{stage}/"


# The report's own names (relax_straggler.judge.report.build_report).
LIKELY_BOTTLENECK = PREFIX + "likely_bottleneck"
HINTS = PREFIX + "hints"
NUM_STRAGGLERS = PREFIX + "num_stragglers"
MISMATCHED_RANKS = PREFIX + "mismatched_ranks"
DRIFTED_RANKS = PREFIX + "drifted_ranks"
UNUSABLE_TIMES = PREFIX + "unusable_times"
COMMUNICATION_BLAMED_RANK = PREFIX + "communication/blamed_rank"
COMMUNICATION_WAIT_MS = PREFIX + "communication/wait_ms"
COMMUNICATION_LATE_ARRIVALS = PREFIX + "communication/late_arrivals"
COMMUNICATION_COLLECTIVES = PREFIX + "communication/collectives"

# Loss counters (Analyzer.counters' keys, published as PREFIX + the key).
COUNTERS = ("dropped_reports", "dropped_sections", "dropped_collectives", "unmatched_stops", "open_at_step_end",
            "skipped_samples", "control_refused", "store_written_rows", "store_dropped_rows", "store_failed_writes",
            "store_buffered_rows")

# The confirmed verdict (relax_straggler.judge.confirm.VerdictResult.metrics).
VERDICT_STATUS = PREFIX + "verdict/status"
VERDICT_RANK = PREFIX + "verdict/rank"
VERDICT_STAGE = PREFIX + "verdict/stage"
VERDICT_CAUSE = PREFIX + "verdict/cause"
VERDICT_SINCE_STEP = PREFIX + "verdict/since_step"
VERDICT_CONFIDENCE = PREFIX + "verdict/confidence"
VERDICT_RATIO = PREFIX + "verdict/ratio"

# The window ensemble (relax_straggler.window.detector.WindowResult.metrics): WINDOW_PREFIX + its field.
WINDOW_PREFIX = PREFIX + "window/"

# The live what-if (relax_straggler.whatif.live).
WHATIF_PREFIX = PREFIX + "whatif/"
DROPPED_OPS = PREFIX + "dropped_ops"

# The hang answer (relax_straggler.hang): HANG_PREFIX + its field.
HANG_PREFIX = PREFIX + "hang/"
HANG_DETECTED = HANG_PREFIX + "detected"
HANG_KIND = HANG_PREFIX + "kind"
HANG_ANSWER = HANG_PREFIX + "answer"

# Store rows: the metric_name of the rows of a stage without a Megatron timer is
# stage_row_name(stage) (relax_straggler.common.megatron_timers.stage_timer_name), and these.
VERDICT_METRIC = PREFIX + "verdict"  # the confirmed verdict's headline (relax_straggler.stores.verdict_rows)
FINDING_METRIC = PREFIX + "verdict/finding"  # one of its findings
HANG_METRIC = PREFIX + "hang"  # a hang answer (relax_straggler.stores.hang_rows)
END_METRIC = PREFIX + "end"  # the end of a run (relax_straggler.stores.end_rows)


def stage_row_name(stage: str) -> str:
    """``straggler/{stage}``: the store rows of a stage that no Megatron timer names."""
    return PREFIX + stage


def _stage(field: str, unit: str, meaning: str) -> MetricName:
    return MetricName(stage_prefix("{stage}") + field, unit, meaning)


def _window(field: str, unit: str, meaning: str) -> MetricName:
    return MetricName(WINDOW_PREFIX + field, unit, meaning)


def _whatif(field: str, unit: str, meaning: str) -> MetricName:
    return MetricName(WHATIF_PREFIX + field, unit, meaning)


def _hang(field: str, unit: str, meaning: str) -> MetricName:
    return MetricName(HANG_PREFIX + field, unit, meaning)


_COUNTER_MEANINGS = {
    "dropped_reports": "reports dropped because the report queue was full (lifetime)",
    "dropped_sections": "sections not timed because the event pool was full (lifetime)",
    "dropped_collectives": "collectives or waits not timed because the event pool was full (lifetime)",
    "unmatched_stops": "section ends without a start (lifetime)",
    "open_at_step_end": "sections still open when the step ended (lifetime)",
    "skipped_samples": "steps not sampled because the metrics rank held sampling (lifetime)",
    "control_refused": "runtime-control commands refused as malformed (lifetime)",
    "store_written_rows": "with --straggler-store: rows the store accepted (lifetime)",
    "store_dropped_rows": "with --straggler-store: rows dropped, the store failing too long (lifetime)",
    "store_failed_writes": "with --straggler-store: writes the store refused or could not take (lifetime)",
    "store_buffered_rows": "with --straggler-store: rows waiting to be written",
}

METRICS: tuple[MetricName, ...] = (
    _stage("local_ms", "ms", "the metrics rank's own time in the stage"),
    _stage("mean_ms", "ms", "mean over the ranks that ran the stage"),
    _stage("ref_ms", "ms", "the reference of the rule: mean or median"),
    _stage("max_ms", "ms", "the longest time of any rank"),
    _stage("slowdown_ratio", "x", "max_ms / ref_ms"),
    _stage("relative_score", "0..1", "the top rank's score, lower is slower"),
    _stage("top_rank", "rank", "compute: the slowest rank; communication: the rank that arrived last"),
    _stage("num_stragglers", "count", "ranks flagged in the stage"),
    _stage("imbalance_ratio", "x", "with comparison groups: the largest group's mean over the smallest's"),
    _stage("kernel_ms", "ms", "with --straggler-kernel-stats: the top rank's time with compute kernels running"),
    _stage("idle_ms", "ms", "with --straggler-kernel-stats: the top rank's time with its stream idle"),
    _stage("nccl_ms", "ms", "with --straggler-kernel-stats: the top rank's time with NCCL kernels running"),
    MetricName(LIKELY_BOTTLENECK, "stage", "the stage whose imbalance costs most, or none"),
    MetricName(HINTS, "text", "one readable line"),
    MetricName(NUM_STRAGGLERS, "count", "distinct ranks flagged in any stage"),
    MetricName(UNUSABLE_TIMES, "count", "measured times that were no time (infinite or negative)"),
    MetricName(MISMATCHED_RANKS, "count", "ranks whose step counter differed from the metrics rank's"),
    MetricName(DRIFTED_RANKS, "count", "ranks whose training forward passes differ from their peers'"),
    *(MetricName(PREFIX + name, "count", _COUNTER_MEANINGS[name]) for name in COUNTERS),
    MetricName(COMMUNICATION_BLAMED_RANK, "rank", "the rank that arrived last in most compared collectives"),
    MetricName(COMMUNICATION_WAIT_MS, "ms", "mean over ranks of the time each waited for late arrivals"),
    MetricName(COMMUNICATION_LATE_ARRIVALS, "count", "collectives in which blamed_rank arrived last"),
    MetricName(COMMUNICATION_COLLECTIVES, "count", "collectives compared across ranks"),
    MetricName(DROPPED_OPS, "count", "per-op records not kept because a rank's buffer was full (lifetime)"),
    _whatif("slowdown", "x", "S: the step's replayed time over its ideal replay"),
    _whatif("slowdown_typical", "x", "median slowdown over the recent reports that named no worker"),
    _whatif("slowdown_spread", "x", "its noise from report to report: 1.4826 x the median |S_i - S_(i-1)| / sqrt(2)"),
    _whatif("leader", "text", "this step's worker whose ops cost most, dp D / pp S"),
    _whatif("lead", "x", "the leader's score minus the runner-up's"),
    _whatif("top_worker", "text", "the worker named over several reports, or none"),
    _whatif("top_rank", "rank", "the rank recorded for the named worker; -1 when none"),
    _whatif("give_back", "fraction", "of the lost time, what fixing the named worker gives back"),
    _whatif("simulation_error", "x", "measured step time over the replayed one"),
    _whatif("elapsed_ms", "ms", "time spent building and replaying the model"),
    _window("anomaly_ranks", "list of ranks", "ranks the ensemble reports as slow over the window"),
    _window("num_anomalies", "count", "their number"),
    _window("votes/{rank}", "count", "algorithms that called the rank slow"),
    _window("stages/{rank}", "text", "the stages that drove the vote for an anomaly rank"),
    _window("link_suspects", "list of ranks", "ranks whose communication is slow without being late"),
    _window("anomaly_nodes", "list of nodes", "nodes of the anomaly ranks"),
    _window("imbalance/{stage}", "x", "with comparison groups: the slowest group's mean over the fastest's"),
    _window("steps", "count", "steps analysed"),
    _window("elapsed_ms", "ms", "the analysis time"),
    MetricName(VERDICT_STATUS, "state", "the job's state this report"),
    MetricName(VERDICT_RANK, "rank", "the confirmed straggler; -1 unless the status is straggler"),
    MetricName(VERDICT_STAGE, "stage", "the stage of the headline finding, or none"),
    MetricName(VERDICT_CAUSE, "cause", "the headline finding's inferred cause (relax_straggler.judge.confirm.CAUSES)"),
    MetricName(VERDICT_SINCE_STEP, "step", "when the headline finding entered its state"),
    MetricName(VERDICT_CONFIDENCE, "0..1", "share of the recent reports that agree with the state"),
    MetricName(VERDICT_RATIO, "x", "the headline finding's ratio"),
    MetricName(HANG_DETECTED, "1", "present (and 1) only in the hang answer"),
    MetricName(HANG_KIND, "kind", "lagging, missing, desync, analyzer or none"),
    _hang("rank", "rank", "the rank that holds the group; -1 for desync and none"),
    _hang("group", "text", "the group the others wait in"),
    _hang("group_ranks", "text", "its global ranks"),
    _hang("op", "text", "the op the others wait in"),
    _hang("seq", "count", "its number in the group's sequence of collectives"),
    _hang("waiting_ranks", "count", "members waiting in it"),
    _hang("waited_s", "s", "the least of their waits"),
    _hang("last_completed", "text", "the holder's most recent completed op"),
    _hang("no_snapshot_ranks", "ranks", "ranks that published nothing"),
    _hang("stalled_s", "s", "the longest time without a step end"),
    _hang("step", "step", "the newest step ended"),
    MetricName(HANG_ANSWER, "text", "the findings in words"),
)

STORE_ROWS: tuple[MetricName, ...] = (
    MetricName(stage_row_name("{stage}"), "ms", "a stage's time where no Megatron timer names the stage"),
    MetricName(VERDICT_METRIC, "row", "the confirmed verdict's headline of a report"),
    MetricName(FINDING_METRIC, "row", "one finding of the confirmed verdict"),
    MetricName(HANG_METRIC, "row", "a hang answer"),
    MetricName(END_METRIC, "row", "the normal end of a run"),
)
