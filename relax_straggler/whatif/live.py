"""The live what-if replay: one sampled step's gathered per-op rows (relax_straggler.common.payload,
recorded by relax_straggler.live.op_records) through the engine's what-if model, on the metrics
rank's report thread. docs/WHATIF.md, "Live".

It publishes straggler/whatif/* and straggler/dropped_ops (relax_straggler.common.metric_names;
their meanings: docs/METRICS.md): S of the step, its typical value and its noise from
report to report, this step's leading worker, the worker named once it leads beyond that
noise (relax_straggler.whatif.lead), what fixing it gives back, and the model's error.

Nothing under straggler/whatif/ is published for a step without per-op data, one where a
rank dropped ops, or one the model cannot represent (logged once): never a guess.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from relax_straggler.common.metric_names import DROPPED_OPS, WHATIF_PREFIX
from relax_straggler.common.payload import OP_FIELDS, OP_TYPES, unpack_ops
from relax_straggler.readers import OpRecords
from relax_straggler.whatif.errors import WhatIfInputError
from relax_straggler.whatif.lead import WhatIfLead
from relax_straggler.whatif.loader import one_rank_per_worker
from relax_straggler.whatif.result import analyze_records

log = logging.getLogger(__name__)

# Recorded op type -> the engine op types it stands for. A combined p2p op is both of its
# halves, each with the op's start and duration: the engine takes each half's transfer part
# from its pair (its end minus the later of the two starts), so the wait inside the combined
# op is not counted as transfer. The gradient sync plays the model's dp gradient-sync role.
_ENGINE_TYPES: dict[str, tuple[str, ...]] = {
    "forward-send-backward-recv": ("forward-send", "backward-recv"),
    "backward-send-forward-recv": ("backward-send", "forward-recv"),
    "all-grads-sync": ("grads-reduce-scatter",),
}
_F = {name: i for i, name in enumerate(OP_FIELDS)}
_ENGINE_NAMES = list(dict.fromkeys(e for n in OP_TYPES for e in _ENGINE_TYPES.get(n, (n,))))
_EXPAND_COUNT = np.array([len(_ENGINE_TYPES.get(n, (n,))) for n in OP_TYPES])
# (recorded type, k) -> the k-th engine type it stands for (-1 past its count).
_EXPAND = np.array([[_ENGINE_NAMES.index(e) for e in _ENGINE_TYPES.get(n, (n,))] + [-1] * (2 - len(_ENGINE_TYPES.get(n, (n,))))
                    for n in OP_TYPES])


def records_from_rows(rows: np.ndarray) -> OpRecords:
    """The what-if records of one step's per-op rows (ranks, op_row_len): combined p2p ops
    split, seq_id numbered per rank and op type in start order, starts on one clock (s from
    the earliest rank's first op). Empty records when no rank recorded an op. Raises
    ValueError for rows that are no per-op rows or an op type outside OP_TYPES."""
    g = unpack_ops(rows)
    valid = np.arange(g.ops.shape[1])[None, :] < g.num_ops[:, None]
    ops = g.ops[valid]  # (ops, fields), rank by rank
    owner = np.nonzero(valid)[0]  # row index of each op
    codes = ops[:, _F["optype"]]
    bad = (codes < 0) | (codes >= len(OP_TYPES)) | (codes != np.round(codes))
    if bad.any():
        raise ValueError(f"per-op row of rank {int(g.ranks[owner[np.argmax(bad)]])}: op type {codes[np.argmax(bad)]} "
                         f"is outside 0..{len(OP_TYPES) - 1}")
    codes = codes.astype(np.int64)
    # Each recorded op becomes one or two engine ops (a combined p2p op: both halves).
    expand_to = _EXPAND[codes]
    src = np.repeat(np.arange(len(codes)), _EXPAND_COUNT[codes])
    k = np.arange(len(src)) - np.repeat(np.cumsum(_EXPAND_COUNT[codes]) - _EXPAND_COUNT[codes], _EXPAND_COUNT[codes])
    optype = expand_to[src, k]
    who = owner[src]
    origin = float(np.min(g.t0_unix_s[g.num_ops > 0])) if len(ops) else 0.0
    start = ops[src, _F["start_s"]] + (g.t0_unix_s[who] - origin)
    # seq_id: the op's place among its rank's ops of its engine type, in start order.
    group = who * len(_ENGINE_NAMES) + optype
    order = np.lexsort((start, group))
    first = np.searchsorted(group[order], group[order], side="left")
    seq = np.empty(len(order), dtype=np.int64)
    seq[order] = np.arange(len(order)) - first
    used = np.unique(optype)  # the engine gets only the op types that occur
    step = int(g.steps[who[0]]) if len(who) else 0
    return OpRecords(dp_rank=g.dp_ranks[who].astype(np.int32), stage=g.stages[who].astype(np.int32),
                     step=np.full(len(src), step, dtype=np.int64),
                     optype=np.searchsorted(used, optype).astype(np.int32), start=start.astype(np.float64),
                     duration=ops[src, _F["duration_s"]].astype(np.float64), seq_id=seq.astype(np.int32),
                     microbatch=ops[src, _F["microbatch"]].astype(np.int32),
                     chunk=ops[src, _F["chunk"]].astype(np.int32), optype_names=[_ENGINE_NAMES[t] for t in used],
                     rank=g.ranks[who].astype(np.int64))


class LiveWhatIf:
    """Turns each sampled step's per-op rows into straggler/whatif/* metrics (report thread).

    threads: engine threads for the replay (1: the metrics rank's host is training too).
    A step that cannot be replayed is logged once (then at debug level) and yields only
    the straggler/dropped_ops counter.
    """

    def __init__(self, threads: int = 1) -> None:
        self._threads = threads
        self._warned = False
        self._lead = WhatIfLead()

    def metrics(self, op_rows: np.ndarray) -> dict[str, Any]:
        """The metrics of one step; {} when no per-op row travelled (op_rows has 0 columns).
        Never raises: whatever goes wrong is logged once and leaves straggler/whatif/ out."""
        if op_rows.shape[1] == 0:
            return {}
        try:
            g = unpack_ops(op_rows)
        except ValueError as e:
            self._skip("bad per-op rows: %s", e)
            return {}
        out: dict[str, Any] = {DROPPED_OPS: int(np.nansum(g.dropped_ops_total))}
        if not (g.num_ops > 0).any():
            return out
        if (g.dropped_ops > 0).any():
            self._skip("rank %d dropped %d ops of step %d (per-step buffer full); the step is not replayed",
                       int(g.ranks[np.argmax(g.dropped_ops)]), int(g.dropped_ops.max()), int(g.steps[0]))
            return out
        t0 = time.perf_counter()
        try:
            rec = one_rank_per_worker(records_from_rows(op_rows))
            report = analyze_records(rec, by_worker=False, top_fraction=0.0, threads=self._threads)
            workers = set(zip(rec.dp_rank.tolist(), rec.stage.tolist()))
            lead = self._lead.update(float(report.slowdown), {w: report.worker_score(*w) for w in workers})
            # The engine's top worker is the leader (highest score); named only when confirmed.
            named = lead.named if lead.named == tuple(report.top_workers[0]) else None
            top_rank, give_back = -1, 0.0
            if named is not None:
                kept = (rec.dp_rank == named[0]) & (rec.stage == named[1])
                top_rank, give_back = int(rec.rank[np.argmax(kept)]), float(report.m_w.rem)
            out.update({
                WHATIF_PREFIX + "slowdown": float(report.slowdown),
                WHATIF_PREFIX + "slowdown_typical": lead.typical,
                WHATIF_PREFIX + "slowdown_spread": lead.spread,
                WHATIF_PREFIX + "leader": f"dp {lead.leader[0]} / pp {lead.leader[1]}",
                WHATIF_PREFIX + "lead": lead.lead,
                WHATIF_PREFIX + "top_worker": "none" if named is None else f"dp {named[0]} / pp {named[1]}",
                WHATIF_PREFIX + "top_rank": top_rank,
                WHATIF_PREFIX + "give_back": give_back,
                WHATIF_PREFIX + "simulation_error": float(report.simulation_error),
                WHATIF_PREFIX + "elapsed_ms": (time.perf_counter() - t0) * 1e3,
            })
        except (ValueError, WhatIfInputError) as e:  # the model cannot represent this schedule
            self._skip("the what-if model cannot replay step %d: %s", int(g.steps[0]), e)
        except Exception:  # noqa: BLE001 - a replay failure must never stop the reports
            self._skip("the what-if replay of step %d failed", int(g.steps[0]), exc_info=True)
        return out

    def _skip(self, message: str, *args: Any, exc_info: bool = False) -> None:
        (log.debug if self._warned else log.warning)("relax_straggler: " + message, *args, exc_info=exc_info)
        self._warned = True
