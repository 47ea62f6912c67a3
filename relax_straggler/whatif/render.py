"""Pictures of a what-if report: the dp_rank x stage heatmap of worker scores
min(S_dp, S_stage) (the study's Fig. 14: one hot cell = one bad worker, a hot column = a
bad stage, everything warm = a job-wide cause) and the simulated ideal timeline as a
Chrome trace for Perfetto."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

from relax_straggler.whatif.result import WhatIfReport


def write_heatmap(report: WhatIfReport, path: str | Path) -> None:
    """Writes a PNG: rows dp_rank, columns stage, colour = min(S_dp, S_stage)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dps, stages = sorted(report.by_dp_rank), sorted(report.by_stage)
    grid = np.array([[report.worker_score(d, s) for s in stages] for d in dps])
    fig, ax = plt.subplots(figsize=(max(4.0, 0.5 * len(stages) + 2), max(3.0, 0.3 * len(dps) + 1.5)))
    im = ax.imshow(grid, cmap="Reds", aspect="auto", vmin=min(1.0, float(grid.min())),
                   vmax=max(float(grid.max()), 1.0 + 1e-3))
    ax.set_xlabel("pp stage")
    ax.set_ylabel("dp_rank")
    step = max(1, len(stages) // 16), max(1, len(dps) // 32)
    ax.set_xticks(range(0, len(stages), step[0]), [str(s) for s in stages[::step[0]]])
    ax.set_yticks(range(0, len(dps), step[1]), [str(d) for d in dps[::step[1]]])
    ax.set_title(f"what-if slowdown S = {report.slowdown:.2f}x: worker score min(S_dp, S_stage)")
    fig.colorbar(im, ax=ax, label="slowdown kept by the worker's row/column")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


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
