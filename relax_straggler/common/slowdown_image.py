"""Slowdown grids drawn one way in every picture (matplotlib, PNG): `analyze --heatmap`
(analysis/heatmap.py) and `whatif --heatmap` (whatif/render.py).

One colour meaning: how many times slower than healthy. The scale is fixed, from 1.0
(white: as fast as the reference, or faster) to max(1.5, the largest value drawn) (dark
red), so a near-clean job stays pale whatever its own maximum and a 2x straggler is dark
in every picture; grey cells have no data. Small grids carry their values as text.

Sizes are bounded: callers aggregate rows beyond MAX_ROWS (and say how in the title), and
the figure is at most MAX_FIGURE_IN inches at DPI dots per inch. The layout is
constrained and long titles are wrapped, so no text falls outside the canvas.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after selecting the non-interactive backend)
import numpy as np  # noqa: E402
from matplotlib.colors import Normalize  # noqa: E402

SCALE_BOTTOM = 1.0
SCALE_MIN_TOP = 1.5
MAX_ROWS = 64
MAX_FIGURE_IN = (16.0, 11.0)
DPI = 100
_CELL_IN = (0.42, 0.24)  # preferred cell size: room for a value such as "1.23"
_ANNOTATE_MIN_CELL_IN = (0.3, 0.17)
_ANNOTATE_MAX_CELLS = 256  # beyond, a wall of numbers hides the picture
_NO_DATA = "#c8c8c8"
_LABEL_PT = 9


def colour_norm(values: np.ndarray) -> Normalize:
    """The fixed scale: SCALE_BOTTOM to max(SCALE_MIN_TOP, the largest finite value)."""
    finite = values[np.isfinite(values)]
    top = max(SCALE_MIN_TOP, float(finite.max())) if finite.size else SCALE_MIN_TOP
    return Normalize(vmin=SCALE_BOTTOM, vmax=top, clip=False)


def hottest_row(values: np.ndarray) -> tuple[int, ...]:
    """(row,) of the largest finite value of `values` (rows, cols), or () when none."""
    finite = np.where(np.isfinite(values), values, -np.inf)
    return (int(np.unravel_index(np.argmax(finite), values.shape)[0]),) if np.isfinite(finite).any() else ()


def max_per_bin(values: np.ndarray, size: int) -> np.ndarray:
    """(ceil(rows / size), cols): the largest finite value of each run of `size` rows (NaN
    where a run has none). values: (rows, cols)."""
    rows = values.shape[0]
    padded = np.full((math.ceil(rows / size) * size, values.shape[1]), np.nan)
    padded[:rows] = values
    blocks = padded.reshape(-1, size, values.shape[1])
    with np.errstate(invalid="ignore"):
        out = np.nanmax(np.where(np.isfinite(blocks), blocks, -np.inf), axis=1)
    return np.where(np.isfinite(out), out, np.nan)


def figure_for(rows: int, cols: int, margin_in: tuple[float, float] = (3.2, 2.2)):
    """A figure sized for a (rows, cols) grid plus `margin_in` (width, height) inches of
    labels, title and colour bar, at most MAX_FIGURE_IN; constrained layout."""
    width = min(MAX_FIGURE_IN[0], max(6.0, margin_in[0] + _CELL_IN[0] * cols))
    height = min(MAX_FIGURE_IN[1], max(4.0, margin_in[1] + _CELL_IN[1] * rows))
    fig, ax = plt.subplots(figsize=(width, height), dpi=DPI, layout="constrained")
    return fig, ax


def wrapped(fig, text: str, fontsize: float) -> str:
    """`text` wrapped to the figure's width (each line kept as given, long lines broken)."""
    chars = max(20, int(fig.get_figwidth() * 72 / (0.56 * fontsize)) - 4)
    return "\n".join(textwrap.fill(line, chars) for line in text.split("\n"))


def draw_slowdown(fig, ax, values: np.ndarray, colour_label: str):
    """Draws `values` (rows, cols) on `ax` on the fixed scale, with a colour bar labelled
    `colour_label` (wrapped to the bar's height), and the values as text on small grids (at
    most 256 cells, each large enough to hold its value). Call it last: it lays the figure
    out with the titles and tick labels already set. Returns the image."""
    cmap = plt.get_cmap("Reds").with_extremes(bad=_NO_DATA)
    norm = colour_norm(values)
    image = ax.imshow(values, aspect="auto", interpolation="nearest", cmap=cmap, norm=norm)
    bar = fig.colorbar(image, ax=ax, extend="min")
    fig.canvas.draw()  # the constrained layout places the axes and the colour bar
    bar_in = bar.ax.get_window_extent().height / fig.dpi
    bar.set_label(textwrap.fill(colour_label, max(12, int(bar_in * 72 / (0.56 * _LABEL_PT)))), fontsize=_LABEL_PT)
    if _cells_hold_text(fig, ax, values.shape):
        for (r, c), v in np.ndenumerate(values):
            if math.isfinite(v):
                ax.text(c, r, f"{v:.2f}" if v < 10 else f"{v:.1f}", ha="center", va="center", fontsize=7,
                        color="white" if norm(v) > 0.55 else "black")
    return image


def _cells_hold_text(fig, ax, shape: tuple[int, int]) -> bool:
    if shape[0] * shape[1] > _ANNOTATE_MAX_CELLS:
        return False
    box = ax.get_window_extent()
    cell_w, cell_h = box.width / fig.dpi / max(1, shape[1]), box.height / fig.dpi / max(1, shape[0])
    return cell_w >= _ANNOTATE_MIN_CELL_IN[0] and cell_h >= _ANNOTATE_MIN_CELL_IN[1]


def set_ticks(axis, labels: list[str], max_labels: int, keep: tuple[int, ...] = (), **kwargs) -> None:
    """About `max_labels` evenly spaced tick labels of `labels` (one per cell) on the
    matplotlib `axis` (ax.xaxis or ax.yaxis), and those of the cells `keep` (e.g. the
    hottest row), in place of their neighbours."""
    every = max(1, math.ceil(len(labels) / max_labels))
    ticks = set(range(0, len(labels), every))
    for k in keep:
        ticks -= set(range(k - every + 1, k + every))
        ticks.add(k)
    ticks = sorted(ticks)
    axis.set_ticks(ticks, [labels[t] for t in ticks], **kwargs)


def save(fig, path: str | Path) -> None:
    """Writes `fig` as PNG at DPI (its size as made: never grown past MAX_FIGURE_IN) and
    closes it. Raises OSError when the file cannot be written."""
    try:
        fig.savefig(path, dpi=DPI)
    finally:
        plt.close(fig)
