"""Each rank's compute slowdown over time, in a grid of bounded size, for `analyze --heatmap`.

The value of a rank in one step is the one `per_rank.compute_slowdown` averages over the
steps (analysis/engine.py): its compute ms over the sum of its pipeline stage's peer
references (the median of its data-parallel replicas; with two, the other one),
time-weighted over the compute stages; 1.0 is typical, 2.0 twice as slow as its replicas.

The grid is bounded whatever the run's length and size, so that the picture is:

- rows: ranks ordered by pipeline stage, data-parallel rank, tensor-parallel rank; with
  more than `max_rows` ranks, runs of `ranks_per_row` consecutive ranks share a row and
  the row holds, in each step, the largest value of its ranks (a lone slow rank stays
  visible; a row of healthy ranks reads a little over 1.0, the maximum of their noise);
- columns: windows of `steps_per_window` consecutive input steps (reports), the mean of
  the row's values over the window; when `max_windows` windows are full, neighbours are
  merged in pairs and the window doubles, so the columns always cover the whole run.

Memory: O(world + max_rows x max_windows); per step O(ranks in the step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from relax_straggler.common.topology import Topology


@dataclass(frozen=True)
class TimelineGrid:
    """The finished grid. values: (rows, windows) mean compute slowdown, NaN where no rank
    of the row was recorded in the window; row_labels: one per row ("r5 dp1 pp0", or
    "pp0 dp0-127" for a row of several ranks); window_steps: (windows, 2) the first
    and last step number of each window; ranks_per_row, steps_per_window: the bin sizes
    (1 = no aggregation); the last window may hold fewer steps."""

    values: np.ndarray
    row_labels: list[str]
    window_steps: np.ndarray
    ranks_per_row: int
    steps_per_window: int
    steps: int


class RankTimeline:
    """Accumulates per-step rank values into a (rows, windows) grid, as the module says.
    Raises ValueError when max_rows or max_windows is below 2 or max_windows is odd."""

    def __init__(self, topology: Topology, max_rows: int = 64, max_windows: int = 64) -> None:
        if max_rows < 2 or max_windows < 2 or max_windows % 2:
            raise ValueError(f"max_rows and max_windows must be >= 2 and max_windows even, got {max_rows}, "
                             f"{max_windows}")
        world = topology.world_size
        dp, pp, tp = topology.coords(np.arange(world))
        self._order = np.lexsort((tp, dp, pp))  # position -> rank
        self._coords = (dp, pp, tp)
        self.ranks_per_row = math.ceil(world / max_rows)
        position = np.empty(world, np.int64)
        position[self._order] = np.arange(world)
        self._row_of = position // self.ranks_per_row
        self._rows = math.ceil(world / self.ranks_per_row)
        self._row_starts = np.arange(0, world, self.ranks_per_row)
        self._all_rows = np.arange(self._rows)
        self._max_windows = max_windows
        self._sums = np.zeros((max_windows, self._rows))
        self._counts = np.zeros((max_windows, self._rows), np.int64)
        self._first: list[int] = []
        self._last: list[int] = []
        self._width = 1  # steps per window
        self._filled = 0  # steps in the last window
        self._seen = np.zeros(self._rows, bool)
        self.steps = 0

    def add(self, step: int, ranks: np.ndarray, values: np.ndarray) -> None:
        """Adds one step: values (len(ranks),) of global ranks `ranks`, NaN = no value."""
        if not self._first or self._filled == self._width:
            if len(self._first) == self._max_windows:
                self._merge_pairs()
            self._first.append(step)
            self._last.append(step)
            self._filled = 0
        if ranks.size == self._row_of.size:  # every rank (ascending, unique): rows are runs of positions
            rows = self._all_rows
            per_row = np.fmax.reduceat(values[self._order], self._row_starts)
        else:
            rows = self._row_of[ranks]
            per_row = np.full(self._rows, np.nan)
            np.fmax.at(per_row, rows, values)
        ok = np.isfinite(per_row)
        w = len(self._first) - 1
        self._sums[w, ok] += per_row[ok]
        self._counts[w] += ok
        self._last[w] = step
        self._seen[rows] = True
        self._filled += 1
        self.steps += 1

    def _merge_pairs(self) -> None:
        half = self._max_windows // 2
        self._sums[:half] = self._sums[0::2] + self._sums[1::2]
        self._counts[:half] = self._counts[0::2] + self._counts[1::2]
        self._sums[half:] = 0.0
        self._counts[half:] = 0
        self._first, self._last = self._first[0::2], self._last[1::2]
        self._width *= 2

    def grid(self) -> TimelineGrid:
        """The grid so far. Rows of single ranks never recorded are left out (a layout
        from --meta may name more ranks than the input holds); rows of several ranks are
        kept (NaN where none was recorded) so that the row ranges stay regular."""
        n = len(self._first)
        with np.errstate(invalid="ignore", divide="ignore"):
            values = np.where(self._counts[:n] > 0, self._sums[:n] / np.maximum(self._counts[:n], 1), np.nan).T
        rows = np.flatnonzero(self._seen) if self.ranks_per_row == 1 else np.arange(self._rows)
        return TimelineGrid(values=values[rows], row_labels=[self._label(r) for r in rows.tolist()],
                            window_steps=np.array([self._first, self._last], np.int64).T.reshape(n, 2),
                            ranks_per_row=self.ranks_per_row, steps_per_window=self._width, steps=self.steps)

    def _label(self, row: int) -> str:
        ranks = self._order[row * self.ranks_per_row:(row + 1) * self.ranks_per_row]
        dp, pp, tp = (c[ranks] for c in self._coords)
        if ranks.size == 1:
            tp_part = f" tp{int(tp[0])}" if self._coords[2].max() > 0 else ""
            return f"r{int(ranks[0])} dp{int(dp[0])} pp{int(pp[0])}{tp_part}"

        def span(name: str, c: np.ndarray) -> str:
            lo, hi = int(c.min()), int(c.max())
            return f"{name}{lo}" if lo == hi else f"{name}{lo}-{hi}"

        return f"{span('pp', pp)} {span('dp', dp)}"
