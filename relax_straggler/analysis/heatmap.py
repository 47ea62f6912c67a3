"""Rank x stage heatmap (PNG, matplotlib): each cell is the rank's mean time in the stage
divided by the median over ranks of that stage, so 1.0 is typical, a bright row is a slow
rank and a bright band of rows a slow pipeline stage. Rows are ordered by pipeline stage,
then data-parallel rank, then tensor-parallel rank."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after selecting the non-interactive backend)
import numpy as np  # noqa: E402
from matplotlib.colors import TwoSlopeNorm  # noqa: E402

from relax_straggler.stages import STAGES  # noqa: E402


def write_heatmap(summary: dict, path: str) -> None:
    """Writes the heatmap of summary["per_rank"] to `path`. Raises ValueError when the
    summary has no per-rank times (min/max-only input), OSError when the file cannot be written."""
    ranks = sorted(summary["per_rank"], key=lambda r: (r["pp_rank"], r["dp_rank"], r["tp_rank"]))
    if not ranks:
        raise ValueError("no per-rank times to draw (min/max-only input)")
    present = {s for r in ranks for s in r["mean_ms"]}
    stages = [s for s in STAGES if s in present]
    ms = np.array([[r["mean_ms"].get(s, np.nan) for s in stages] for r in ranks])
    with np.errstate(invalid="ignore", divide="ignore"):
        ref = np.nanmedian(np.where(ms > 0, ms, np.nan), axis=0)
        rel = ms / ref
    finite = rel[np.isfinite(rel)]
    top = max(2.0, float(np.nanmax(finite))) if finite.size else 2.0
    height = min(20.0, 2.0 + 0.18 * len(ranks))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(stages) + 2.5), height))
    image = ax.imshow(rel, aspect="auto", interpolation="nearest", cmap="RdBu_r",
                      norm=TwoSlopeNorm(vmin=0.0, vcenter=1.0, vmax=top))
    ax.set_xticks(range(len(stages)), [s.replace("communication/", "comm/") for s in stages], rotation=40, ha="right")
    step = max(1, len(ranks) // 40)
    ax.set_yticks(range(0, len(ranks), step),
                  [f"r{r['rank']} dp{r['dp_rank']} pp{r['pp_rank']}" for r in ranks[::step]], fontsize=7)
    ax.set_title(f"{summary['input']['path']}: mean time / median rank, {summary['input']['steps']} steps", fontsize=9)
    fig.colorbar(image, ax=ax, label="x median of the stage")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

