"""`analyze --heatmap`: each rank's compute slowdown over time (PNG, matplotlib).

Rows are ranks (ordered by pipeline stage, data-parallel rank, tensor-parallel rank),
columns windows of steps, time running left to right; a cell is the rank's compute time
over the median of its data-parallel replicas in the same pipeline stage (with two, the other
one), the step value
`per_rank.compute_slowdown` averages (analysis/rank_timeline.py), averaged over the
window. One meaning, one fixed scale (common/slowdown_image.py): white as fast as its replicas,
dark red slow. A straggler that starts mid-run is a red band from its first window on; a
slow pipeline stage is pale (its ranks are compared within the stage: see the report's
imbalance findings). Collective times are not drawn: a long wait marks the ranks that
waited, not the slow one (docs/ARCHITECTURE.md invariant 7), and would need another
meaning of red.

Thousands of ranks or steps are aggregated as rank_timeline.py says, and the title says so.
"""

from __future__ import annotations

from relax_straggler.analysis.rank_timeline import TimelineGrid
from relax_straggler.common.slowdown_image import draw_slowdown, figure_for, hottest_row, save, set_ticks, wrapped

_TITLE_PT, _NOTE_PT = 10, 8


def timeline_figure(grid: TimelineGrid, source: str):
    """The heatmap of `grid` as a matplotlib Figure; `source` names the input in the title.
    Raises ValueError when the grid is empty (no per-rank step)."""
    rows, cols = grid.values.shape
    if rows == 0 or cols == 0:
        raise ValueError("no per-rank times to draw (min/max-only input)")
    fig, ax = figure_for(rows, cols)
    window = "each column one step" if grid.steps_per_window == 1 else \
        f"each column the mean over {grid.steps_per_window} steps"
    binned = "" if grid.ranks_per_row == 1 else \
        f"; each row {grid.ranks_per_row} ranks, the slowest of them in each step"
    fig.suptitle(wrapped(fig, f"{source}: compute slowdown per rank over {grid.steps} steps", _TITLE_PT),
                 fontsize=_TITLE_PT)
    ax.set_title(wrapped(fig, f"the rank's compute time / the median of its data-parallel replicas "
                              f"(same pipeline stage; with two, the other one); {window}{binned}; "
                              "white <= 1.0, grey: not recorded",
                         _NOTE_PT), fontsize=_NOTE_PT)
    steps = [str(int(first)) for first, _ in grid.window_steps]
    set_ticks(ax.xaxis, steps, 16, rotation=0, fontsize=8)
    ax.set_xlabel("step" if grid.steps_per_window == 1 else "step (first of the window)")
    set_ticks(ax.yaxis, grid.row_labels, 32, keep=hottest_row(grid.values), fontsize=7)
    ax.set_ylabel("rank (ordered pp, dp, tp)" if grid.ranks_per_row == 1 else
                  f"ranks, {grid.ranks_per_row} per row (ordered pp, dp, tp)")
    draw_slowdown(fig, ax, grid.values, "compute slowdown (x the replicas' reference)")
    return fig


def write_heatmap(grid: TimelineGrid, source: str, path: str) -> None:
    """Writes the heatmap of `grid` to `path` (PNG). Raises ValueError when the grid is
    empty, OSError when the file cannot be written."""
    save(timeline_figure(grid, source), path)
