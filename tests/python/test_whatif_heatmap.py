"""`whatif --heatmap`: the dp_rank x stage worker scores on the fixed colour scale from 1.0
to max(1.5, data) (a near-clean job stays pale), scores written on small grids, nothing
outside the canvas, and a bounded image for 8,192 dp ranks, aggregated and said so."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from picture_checks import MAX_PX, assert_nothing_clipped, image_of, png_size

from relax_straggler.cli import main
from relax_straggler.common.slowdown_image import MAX_ROWS
from relax_straggler.whatif.render import heatmap_figure, write_heatmap
from relax_straggler.whatif.result import GiveBack, WhatIfReport

DATA = Path(__file__).resolve().parents[1] / "data" / "whatif-traces"


def report_of(by_dp_rank: dict[int, float], by_stage: dict[int, float], slowdown: float) -> WhatIfReport:
    nothing = GiveBack(math.nan, math.nan, math.nan, math.nan, math.nan, math.nan)
    return WhatIfReport(slowdown=slowdown, simulation_error=1.0, steps=[], measured_step_s=[], replayed_step_s=[],
                        ideal_step_s=[], per_step={}, by_dp_rank=by_dp_rank, by_stage=by_stage, by_optype={},
                        by_worker={}, by_dp_rank_per_step={}, by_stage_per_step={}, by_optype_per_step={},
                        top_workers=[], m_w=nothing, m_s=nothing)


@pytest.mark.parametrize("name, top", [("AR", 1.97), ("ST", 1.5)])
def test_whatif_heatmap_uses_the_fixed_scale_and_fits_its_canvas(tmp_path, capsys, name, top):
    png = tmp_path / "w.png"
    assert main(["whatif", str(DATA / f"trace-{name}.parquet"), "--format", "json", "--heatmap", str(png)]) == 0
    out = json.loads(capsys.readouterr().out)
    width, height = png_size(png)
    assert width <= MAX_PX[0] and height <= MAX_PX[1]
    report = report_of({int(k): v for k, v in out["by_dp_rank"].items()},
                       {int(k): v for k, v in out["by_stage"].items()}, out["slowdown"])
    fig = heatmap_figure(report)
    norm = image_of(fig).norm
    assert norm.vmin == 1.0 and norm.vmax == pytest.approx(top, abs=0.01)  # ST's largest score is 1.18
    assert len(fig.axes[0].texts) == len(out["by_dp_rank"]) * len(out["by_stage"])
    assert_nothing_clipped(fig)


def test_whatif_heatmap_paints_a_near_clean_job_pale():
    clean = heatmap_figure(report_of({0: 1.038, 1: 1.01}, {0: 1.038, 1: 1.02}, 1.04))
    straggler = heatmap_figure(report_of({0: 1.98, 1: 1.0}, {0: 1.98, 1: 1.0}, 1.98))
    assert image_of(clean).norm(1.038) < 0.1 and image_of(straggler).norm(1.98) == pytest.approx(1.0)
    assert image_of(clean).norm.vmax == 1.5


def test_whatif_heatmap_of_8192_dp_ranks_is_bounded_and_says_how_ranks_are_merged(tmp_path):
    by_dp = {d: 1.0 + 0.01 * (d % 3) for d in range(8192)}
    by_dp[6001] = 1.9
    report = report_of(by_dp, {s: 1.9 for s in range(4)}, 1.9)
    fig = heatmap_figure(report)
    ax = fig.axes[0]
    assert image_of(fig).get_array().shape == (MAX_ROWS, 4)
    assert "each row 128 dp ranks: the largest score among them" in ax.get_title().replace("\n", " ")
    assert "5888-6015" in [t.get_text() for t in ax.get_yticklabels()]
    assert_nothing_clipped(fig)
    png = tmp_path / "w.png"
    write_heatmap(report, png)
    width, height = png_size(png)
    assert width <= MAX_PX[0] and height <= MAX_PX[1]  # was 480 x 295,092
