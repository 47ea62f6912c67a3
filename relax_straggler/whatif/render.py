"""Pictures of a what-if report: the dp_rank x stage heatmap of worker scores
min(S_dp, S_stage) (the study's Fig. 14: one hot cell = one bad worker, a hot column = a
bad stage, everything warm = a job-wide cause) on the fixed slowdown scale shared with
`analyze --heatmap` (relax_straggler/common/slowdown_image.py), and the simulated ideal timeline
as a Chrome trace for Perfetto."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np

from relax_straggler.whatif.result import WhatIfReport


def heatmap_figure(report: WhatIfReport):
    """The dp_rank x stage grid of min(S_dp, S_stage) as a matplotlib Figure, on the fixed
    slowdown scale of relax_straggler.common.slowdown_image (white 1.0: nothing lost). More than
    MAX_ROWS dp ranks (or stages) are merged into runs of consecutive ids, each cell the
    largest score of its run, and the title says so."""
    from relax_straggler.common.slowdown_image import (MAX_ROWS, draw_slowdown, figure_for, hottest_row, max_per_bin,
                                                set_ticks, wrapped)

    dps, stages = sorted(report.by_dp_rank), sorted(report.by_stage)
    grid = np.array([[report.worker_score(d, s) for s in stages] for d in dps], dtype=float)
    grid = grid.reshape(len(dps), len(stages))
    dp_run, stage_run = math.ceil(len(dps) / MAX_ROWS), math.ceil(len(stages) / MAX_ROWS)
    grid = max_per_bin(max_per_bin(grid, dp_run).T, stage_run).T
    fig, ax = figure_for(*grid.shape)
    merged = [f"each row {dp_run} dp ranks"] if dp_run > 1 else []
    merged += [f"each column {stage_run} stages"] if stage_run > 1 else []
    note = ("S_dp (S_stage): the job's slowdown with every other dp rank (stage) ideal; "
            "white <= 1.0: nothing lost" + (f"; {', '.join(merged)}: the largest score among them" if merged else ""))
    fig.suptitle(wrapped(fig, f"what-if slowdown S = {report.slowdown:.2f}x: worker score min(S_dp, S_stage)", 10),
                 fontsize=10)
    ax.set_title(wrapped(fig, note, 8), fontsize=8)
    set_ticks(ax.xaxis, _id_runs(stages, stage_run), 16, fontsize=8)
    set_ticks(ax.yaxis, _id_runs(dps, dp_run), 32, keep=hottest_row(grid), fontsize=8)
    ax.set_xlabel("pp stage")
    ax.set_ylabel("dp_rank")
    draw_slowdown(fig, ax, grid, "slowdown kept by the worker's dp rank and stage (x)")
    return fig


def _id_runs(ids: list[int], run: int) -> list[str]:
    """Tick labels of `ids` taken `run` at a time: "7", or "0-127"."""
    chunks = [ids[i:i + run] for i in range(0, len(ids), run)]
    return [str(c[0]) if len(c) == 1 else f"{c[0]}-{c[-1]}" for c in chunks]


def write_heatmap(report: WhatIfReport, path: str | Path) -> None:
    """Writes heatmap_figure(report) as a PNG. Raises OSError when it cannot be written."""
    from relax_straggler.common.slowdown_image import save

    save(heatmap_figure(report), path)


def write_ideal_timeline(report: WhatIfReport, names: list[str], path: str | Path) -> None:
    """Writes the replay with ideal durations as a Chrome trace (ts/dur in us, pid = dp_rank,
    tid = stage, args step / seq_id; steps laid end to end). `.gz` paths are gzipped."""
    model = report.model
    start, end = model.timeline(True)
    dps, steps = list(model.dp_ranks), list(model.steps)
    slot_stage, slot_optype, slot_seq = model.slot_stage, model.slot_optype, model.slot_seq
    n_slots, n_dp = len(slot_stage), len(dps)
    start = start.reshape(len(steps), n_slots, n_dp)
    end = end.reshape(len(steps), n_slots, n_dp)
    events: list[dict] = []
    for d in dps:
        events.append({"name": "process_name", "ph": "M", "pid": d, "args": {"name": f"dp_rank {d}"}})
        for s in sorted(set(slot_stage)):
            events.append({"name": "thread_name", "ph": "M", "pid": d, "tid": s, "args": {"name": f"PP rank {s}"}})
    offset = 0.0
    for k, st in enumerate(steps):
        for slot in range(n_slots):
            for lane, d in enumerate(dps):
                events.append({"name": names[slot_optype[slot]], "ph": "X", "pid": d, "tid": slot_stage[slot],
                               "ts": (offset + start[k, slot, lane]) * 1e6,
                               "dur": (end[k, slot, lane] - start[k, slot, lane]) * 1e6,
                               "args": {"step": st, "seq_id": slot_seq[slot]}})
        offset += float(end[k].max())
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wt") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
