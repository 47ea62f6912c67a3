"""`analyze --heatmap`: each rank's compute slowdown over time. Structural checks: the time
axis, the straggler at its full ratio from the step it starts, the fixed colour scale from
1.0, values written on small grids, nothing outside the canvas, and a bounded image for
8,192 ranks, aggregated and said so; the bounded grid itself (rank_timeline.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from picture_checks import MAX_PX, assert_nothing_clipped, image_of, png_size

from relax_straggler.analysis import AnalyzeConfig, analyze
from relax_straggler.analysis.heatmap import timeline_figure
from relax_straggler.analysis.rank_timeline import RankTimeline
from relax_straggler.cli import main
from relax_straggler.common.topology import Topology
from relax_straggler.readers import open_source

DATA = Path(__file__).resolve().parents[1] / "data" / "whatif-traces"


def write_run(path: Path, ranks: int, reports: int, slow_rank: int, from_step: int, interval: int = 10) -> Path:
    """A straggler.jsonl run: forward 100, backward 200, optimizer 10 ms with +-2 % noise
    (seeded); from `from_step` on, `slow_rank`'s backward takes 3x (compute 2.29x its peers)."""
    rng = np.random.default_rng(7)
    with open(path, "w") as f:
        for k in range(reports):
            ms = np.array([100.0, 200.0, 10.0]) * rng.uniform(0.98, 1.02, (ranks, 3))
            if k * interval >= from_step:
                ms[slow_rank, 1] *= 3.0
            f.write(json.dumps({"step": k * interval, "time": float(k),
                                "stages": ["forward", "backward", "optimizer"],
                                "device_ms": np.round(ms, 3).tolist(), "tokens": None, "stragglers": {},
                                "likely_bottleneck": None, "metrics": {}}) + "\n")
    return path


def timeline_of(path: Path):
    return analyze(open_source(str(path)), AnalyzeConfig(), timeline=True).timeline.grid()


def test_analyze_heatmap_shows_the_straggler_from_the_step_it_starts(tmp_path):
    grid = timeline_of(write_run(tmp_path / "run.jsonl", ranks=4, reports=40, slow_rank=1, from_step=200))
    assert grid.values.shape == (4, 40) and (grid.ranks_per_row, grid.steps_per_window) == (1, 1)
    assert grid.window_steps[:, 0].tolist() == list(range(0, 400, 10))
    before, after = grid.values[:, :20], grid.values[:, 20:]
    assert np.all(np.abs(before - 1) < 0.05) and np.all(np.abs(after[[0, 2, 3]] - 1) < 0.05)
    assert np.all(after[1] > 2.2)  # (100 + 600 + 10) / 310 = 2.29: no healthy step dilutes it
    fig = timeline_figure(grid, "run.jsonl")
    ax = fig.axes[0]
    norm = image_of(fig).norm
    assert (norm.vmin, norm.vmax) == (1.0, pytest.approx(float(np.nanmax(grid.values))))
    assert ax.get_xlabel() == "step" and ax.get_xticklabels()[0].get_text() == "0"
    assert "r1 dp1 pp0" in [t.get_text() for t in ax.get_yticklabels()]
    assert len(ax.texts) == 160 and {t.get_text() for t in ax.texts} >= {"1.00"}  # values written on the grid
    assert_nothing_clipped(fig)


def test_analyze_heatmap_cli_writes_a_bounded_png(tmp_path, capsys):
    run, png = write_run(tmp_path / "run.jsonl", 4, 40, 1, 200), tmp_path / "h.png"
    assert main(["analyze", str(run), "--no-progress", "--heatmap", str(png)]) == 0
    width, height = png_size(png)
    assert 600 <= width <= MAX_PX[0] and 360 <= height <= MAX_PX[1]


def test_analyze_heatmap_of_8192_ranks_is_bounded_and_says_how_ranks_are_merged(tmp_path, capsys):
    run = write_run(tmp_path / "big.jsonl", ranks=8192, reports=8, slow_rank=5000, from_step=40)
    png = tmp_path / "b.png"
    grid = timeline_of(run)
    assert grid.ranks_per_row == 128 and grid.values.shape == (64, 8)
    hot = int(np.nanargmax(grid.values[:, -1]))
    assert grid.row_labels[hot] == "pp0 dp4992-5119" and grid.values[hot, -1] > 2.2
    assert np.nanmax(np.delete(grid.values, hot, axis=0)) < 1.1  # the slowest of 128 healthy ranks' noise
    fig = timeline_figure(grid, "big.jsonl")
    ax = fig.axes[0]
    assert "each row 128 ranks, the slowest of them in each step" in ax.get_title().replace("\n", " ")
    assert "pp0 dp4992-5119" in [t.get_text() for t in ax.get_yticklabels()]  # the hottest row is named
    assert not ax.texts  # 512 cells: colours only
    assert_nothing_clipped(fig)
    assert main(["analyze", str(run), "--no-progress", "--heatmap", str(png)]) == 0
    width, height = png_size(png)
    assert width <= MAX_PX[0] and height <= MAX_PX[1]


def test_rank_timeline_merges_windows_and_rows_to_stay_bounded():
    timeline = RankTimeline(Topology(dp=8, pp=2), max_rows=4, max_windows=8)
    ranks = np.arange(16)
    for step in range(100):
        values = np.ones(16)
        values[5] = 1.0 + step / 100  # rank 5 (dp 5, pp 0) slows down steadily
        values[12] = np.nan  # never recorded a value
        timeline.add(step, ranks, values)
    grid = timeline.grid()
    assert grid.ranks_per_row == 4 and grid.steps_per_window == 16 and grid.values.shape == (4, 7)
    assert grid.row_labels == ["pp0 dp0-3", "pp0 dp4-7", "pp1 dp0-3", "pp1 dp4-7"]
    assert grid.window_steps.tolist() == [[16 * k, min(16 * k + 15, 99)] for k in range(7)]
    # Row 1 holds rank 5: the mean over each window of the slowest of its ranks.
    expected = [np.mean([1.0 + s / 100 for s in range(16 * k, min(16 * k + 16, 100))]) for k in range(7)]
    assert grid.values[1] == pytest.approx(expected)
    assert np.all(grid.values[[0, 2, 3]] == 1.0)


@pytest.mark.parametrize("topology", [Topology(dp=100, pp=3, tp=2), Topology(dp=7, pp=5, tp=3)])
def test_rank_timeline_reads_every_rank_as_it_reads_some(topology):
    # A step of every rank takes the reduceat path, a step of some ranks ufunc.at: same rows.
    rng, world = np.random.default_rng(1), topology.world_size
    every, some = RankTimeline(topology, max_rows=16), RankTimeline(topology, max_rows=16)
    for step in range(10):
        values = rng.uniform(0.5, 3.0, world)
        values[rng.random(world) < 0.2] = np.nan
        kept = np.sort(rng.choice(world, world - 1, replace=False))
        full = np.full(world, np.nan)
        full[kept] = values[kept]
        every.add(step, np.arange(world), full)
        some.add(step, kept, values[kept])
    a, b = every.grid().values, some.grid().values
    assert a.shape == b.shape == (math.ceil(world / math.ceil(world / 16)), 10)
    assert np.array_equal(np.isnan(a), np.isnan(b)) and np.allclose(a, b, equal_nan=True)


def test_rank_timeline_refuses_odd_window_counts():
    with pytest.raises(ValueError, match="max_windows"):
        RankTimeline(Topology(dp=4, pp=1), max_windows=7)


def test_ar_heatmap_slow_worker_is_red_in_every_window(tmp_path, capsys):
    grid = timeline_of(DATA / "trace-AR.parquet")
    assert grid.values.shape == (16, 44)
    slow = grid.row_labels.index("r0 dp0 pp0 tp0")  # worker dp 0 / pp 0, the one recorded rank of it
    assert np.all(grid.values[slow] > 2.0)
    assert np.nanmax(np.delete(grid.values, slow, axis=0)) < 1.1
    png = tmp_path / "ar.png"
    assert main(["analyze", str(DATA / "trace-AR.parquet"), "--no-progress", "--no-whatif", "--heatmap",
                 str(png)]) == 0
    assert png_size(png)[0] <= MAX_PX[0]
