"""Rank x stage heatmap (PNG, matplotlib) in two panels with their own colour scales:

- compute stages (forward, backward, optimizer, data, attention, moe): the rank's mean time
  over the median rank of the stage, so 1.0 is typical, a bright row is a slow rank and a
  bright band of rows a slow pipeline stage;
- communication: the same ratio, apart, because a collective's time includes waiting for
  its peers (docs/ARCHITECTURE.md invariant 7): the fast ranks show the long times, and on
  one shared scale their waits (hundreds of times the median on the AR trace) would wash
  out every compute difference.

Rows are ordered by pipeline stage, then data-parallel rank, then tensor-parallel rank."""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after selecting the non-interactive backend)
import numpy as np  # noqa: E402
from matplotlib.colors import TwoSlopeNorm  # noqa: E402

from relax_straggler.stages import STAGES, is_communication  # noqa: E402


@dataclass(frozen=True)
class HeatmapGrids:
    """ranks: the per_rank entries in row order; compute (rows, len(compute_stages)) and
    communication (rows, len(comm_stages)): mean time / median rank of the stage, NaN
    where a rank did not run it."""

    ranks: list[dict]
    compute_stages: list[str]
    compute: np.ndarray
    comm_stages: list[str]
    communication: np.ndarray


def _relative(ranks: list[dict], stages: list[str]) -> np.ndarray:
    ms = np.array([[r["mean_ms"].get(s, np.nan) for s in stages] for r in ranks]).reshape(len(ranks), len(stages))
    with np.errstate(invalid="ignore", divide="ignore"):
        ref = np.nanmedian(np.where(ms > 0, ms, np.nan), axis=0) if stages else np.zeros(0)
        return ms / ref


def heatmap_grids(summary: dict) -> HeatmapGrids:
    """The two grids of summary["per_rank"]. Raises ValueError when it has no per-rank times."""
    ranks = sorted(summary["per_rank"], key=lambda r: (r["pp_rank"], r["dp_rank"], r["tp_rank"]))
    if not ranks:
        raise ValueError("no per-rank times to draw (min/max-only input)")
    present = {s for r in ranks for s in r["mean_ms"]}
    compute = [s for s in STAGES if s in present and not is_communication(s)]
    comm = [s for s in STAGES if s in present and is_communication(s)]
    return HeatmapGrids(ranks, compute, _relative(ranks, compute), comm, _relative(ranks, comm))


def _panel(fig, ax, grid: np.ndarray, stages: list[str], title: str, label: str) -> None:
    finite = grid[np.isfinite(grid)]
    top = max(2.0, float(finite.max())) if finite.size else 2.0
    image = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap="RdBu_r",
                      norm=TwoSlopeNorm(vmin=0.0, vcenter=1.0, vmax=top))
    ax.set_xticks(range(len(stages)), [s.replace("communication/", "comm/") for s in stages], rotation=40, ha="right")
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, label=label)


def write_heatmap(summary: dict, path: str) -> None:
    """Writes the heatmap of summary["per_rank"] to `path`. Raises ValueError when the
    summary has no per-rank times (min/max-only input), OSError when the file cannot be written."""
    g = heatmap_grids(summary)
    panels = [(g.compute, g.compute_stages, "compute: mean time / median rank", "x median of the stage")]
    if g.comm_stages:
        panels.append((g.communication, g.comm_stages, "communication (includes waiting for peers)",
                       "x median (long = waited)"))
    widths = [max(2.0, 1.1 * len(stages) + 1.5) for _, stages, _, _ in panels]
    height = min(20.0, 2.0 + 0.18 * len(g.ranks))
    fig, axes = plt.subplots(1, len(panels), figsize=(sum(widths) + 1.5, height), squeeze=False,
                             gridspec_kw={"width_ratios": widths})
    for ax, (grid, stages, title, label) in zip(axes[0], panels):
        _panel(fig, ax, grid, stages, title, label)
    step = max(1, len(g.ranks) // 40)
    axes[0][0].set_yticks(range(0, len(g.ranks), step),
                          [f"r{r['rank']} dp{r['dp_rank']} pp{r['pp_rank']}" for r in g.ranks[::step]], fontsize=7)
    for ax in axes[0][1:]:
        ax.set_yticks([])
    fig.suptitle(f"{summary['input']['path']}: {summary['input']['steps']} steps", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
