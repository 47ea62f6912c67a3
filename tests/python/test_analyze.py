"""The analysis engine and the `relax-straggler analyze` command on small inputs: findings,
the JSON summary, the heatmap, exit codes and error messages (no tracebacks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from relax_straggler.analysis import AnalyzeConfig, analyze, build_summary
from relax_straggler.cli import main
from relax_straggler.common.topology import Topology
from relax_straggler.readers import InputError, open_source

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def fixture(name: str) -> str:
    return os.path.join(FIXTURES, name)


def summary_of(path: str, **kw) -> dict:
    return build_summary(analyze(open_source(path, **kw), AnalyzeConfig()))


def test_megatron_log_finds_the_slow_worker_with_its_tp_ranks():
    s = summary_of(fixture("megatron_all.log"))
    assert [(a["kind"], a["dp_rank"], a["pp_rank"], a["ranks"], a["stages"]) for a in s["anomalies"]] == [
        ("individual", 0, 1, [4, 5], ["forward"])]
    assert s["input"]["median_step_ms"] == pytest.approx(1235.0)
    assert {r["rank"] for r in s["per_rank"]} == set(range(8))


def test_jsonl_without_layout_compares_all_ranks():
    s = summary_of(fixture("straggler.jsonl"))
    assert [(a["kind"], a["ranks"], a["stages"]) for a in s["anomalies"]] == [("individual", [2], ["backward"])]
    assert any("no parallel layout" in line for line in s["limitations"])


def test_chrome_fixture_and_nodes():
    s = build_summary(analyze(open_source(fixture("timeline-small.json")), AnalyzeConfig(), ranks_per_node=2))
    a = s["anomalies"][0]
    assert (a["kind"], a["dp_rank"], a["pp_rank"], a["ranks"], a["nodes"]) == ("individual", 1, 0, [1], [0])


def test_minmax_log_is_inconclusive_and_says_why():
    s = summary_of(fixture("megatron_minmax.log"))
    assert s["verdict"]["status"] == "inconclusive"
    assert "forward" in s["verdict"]["summary"] and "no rank can be named" in s["verdict"]["summary"]
    stages = {x["stage"]: x for x in s["min_max"]["stages"]}
    assert stages["forward"]["spread"] and not stages["backward"]["spread"]
    assert stages["forward"]["widest_max_over_min"] == pytest.approx(1.6)
    assert any("no rank or node can be named" in line for line in s["limitations"])
    assert s["per_rank"] == [] and s["anomalies"] == []


def test_single_rank_cannot_be_analyzed(tmp_path):
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps({"step": 1, "stages": ["forward"], "device_ms": [[1.0]]}) + "\n")
    with pytest.raises(InputError, match="single rank"):
        analyze(open_source(str(path)), AnalyzeConfig())


def test_single_rank_parquet_trace_exits_1(tmp_path, capsys):
    path = tmp_path / "trace-one.parquet"
    pq.write_table(pa.table({"dp_rank": [0, 0], "stage": [0, 0], "rank": [0, 0], "step": [1, 2],
                             "optype": ["forward-compute"] * 2, "duration": [0.1, 0.1]}), path)
    assert main(["analyze", str(path)]) == 1
    assert "single rank" in capsys.readouterr().err


def test_rank_outside_the_given_topology(tmp_path):
    with pytest.raises(InputError, match="outside the topology"):
        analyze(open_source(fixture("straggler.jsonl"), topology=Topology(dp=2, pp=1)), AnalyzeConfig())


def test_summary_is_strict_json():
    s = summary_of(fixture("megatron_all.log"))
    json.dumps(s, allow_nan=False)


# --- the command ---------------------------------------------------------------------------

def test_cli_text_report(capsys):
    assert main(["analyze", fixture("megatron_all.log"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "STRAGGLERS" in out and "dp 0 / pp 1" in out and "Slowest ranks" in out


def test_cli_json_and_heatmap(tmp_path, capsys):
    png, js = tmp_path / "h.png", tmp_path / "s.json"
    assert main(["analyze", fixture("timeline-small.json.gz"), "--format", "json", "--heatmap", str(png),
                 "--json", str(js), "--ranks-per-node", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == json.loads(js.read_text())
    assert out["anomalies"][0]["ranks"] == [1]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_thresholds_are_options(capsys):
    # A relative threshold above the 2x slowdown hides the straggler.
    assert main(["analyze", fixture("timeline-small.json"), "--format", "json", "--relative-threshold", "2.5"]) == 0
    assert json.loads(capsys.readouterr().out)["anomalies"] == []


@pytest.mark.parametrize("args, code, message", [
    (["/no/such/file.log"], 1, "no such file"),
    (["{fx}/megatron_all.log", "--persistence", "0"], 2, "persistence must be in (0, 1]"),
    (["{fx}/megatron_all.log", "--dp", "0"], 2, "dp must be >= 1"),
    (["{fx}/straggler.jsonl", "--meta", "x.yaml"], 1, "--meta applies to trace files"),
])
def test_cli_errors_are_one_line_without_traceback(args, code, message, capsys):
    args = [a.format(fx=FIXTURES) for a in args]
    assert main(["analyze", *args, "--no-progress"]) == code
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_strict_stops_at_the_first_bad_line(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    lines = open(fixture("straggler.jsonl")).read().splitlines()
    lines += [lines[-1].replace('"step": 40,', f'"step": {step},') for step in (50, 60, 70, 80, 90)]
    path.write_text("\n".join(lines) + "\n{oops\n")  # 1 of 11 lines: below the tenth that leaves no verdict
    assert main(["analyze", str(path), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["input"]["problems"]["total"] == 1
    assert main(["analyze", str(path), "--strict"]) == 1
    assert f"{path}:11:" in capsys.readouterr().err


def test_cli_unreadable_file(tmp_path, capsys):
    path = tmp_path / "dir.log"
    path.mkdir()
    assert main(["analyze", str(path)]) == 1
    assert "is a directory" in capsys.readouterr().err


def test_cli_bad_parquet_columns(tmp_path, capsys):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"rank": np.arange(3), "duration": np.ones(3)}), path)
    assert main(["analyze", str(path)]) == 1
    assert "missing column(s) dp_rank, stage, step, optype" in capsys.readouterr().err


def test_pipeline_link_found_from_both_ends(tmp_path):
    # dp 1 x pp 3, compute balanced; every step the stage 0 -> 1 activation transfer takes
    # 200 ms on both ends (forward-send on pp 0, forward-recv on pp 1) against 10 ms elsewhere.
    rows = []
    for step in range(1, 5):
        for pp in range(3):
            rows += [(0, pp, pp, step, "forward-compute", 0.0, 0.1), (0, pp, pp, step, "backward-compute", 0.1, 0.2)]
            ops = {0: ("forward-send", "backward-recv"), 1: ("forward-send", "forward-recv", "backward-send",
                                                              "backward-recv"), 2: ("forward-recv", "backward-send")}
            for op in ops[pp]:
                slow = (pp, op) in ((0, "forward-send"), (1, "forward-recv"))
                rows.append((0, pp, pp, step, op, 0.3, 0.2 if slow else 0.01))
    names = ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration")
    path = tmp_path / "trace-link.parquet"
    pq.write_table(pa.table({n: [r[i] for r in rows] for i, n in enumerate(names)}), path)
    s = summary_of(str(path))
    assert [(a["kind"], a["ranks"], a["stages"], a["steps_flagged"]) for a in s["anomalies"]] == [
        ("link", [0, 1], ["p2p"], 4)]
    assert "between dp 0 / pp 0 and dp 0 / pp 1" in s["anomalies"][0]["evidence"][-1]
    assert any(line.startswith("dp = 1") for line in s["limitations"])


def test_a_verdict_needs_more_than_one_or_two_steps(tmp_path):
    # The first two iterations of the fixture (lines 1-162): the slow worker is there, but
    # "2 of 2 steps" is no persistence.
    with open(fixture("megatron_all.log")) as f:
        lines = f.readlines()[:162]
    path = tmp_path / "two_steps.log"
    path.write_text("".join(lines))
    s = summary_of(str(path))
    assert s["input"]["steps"] == 2
    assert s["verdict"]["status"] == "inconclusive" and s["verdict"]["reason"] == "too_few_steps"
    assert main(["analyze", str(path), "--no-progress", "--format", "json"]) == 1


def test_layout_flags_that_reject_most_rows_are_inconclusive():
    # ST is dp 2 x pp 4: declaring dp 3 rejects most rows; a "clean" verdict from the rest
    # would be a false negative.
    st = os.path.join(os.path.dirname(__file__), "..", "data", "whatif-traces", "trace-ST.parquet")
    assert main(["analyze", st, "--dp", "3", "--no-progress", "--format", "json"]) == 1
    assert main(["analyze", st, "--no-progress", "--format", "json"]) == 0


def test_dp2_worker_36_percent_slower_is_found(tmp_path):
    # The fixture's slow worker (ranks 4-5, forward 600 ms vs ~295) made only 1.36x slower:
    # against the other replica it is 1.36x; against the mean of both it would be ~1.15x.
    with open(fixture("megatron_all.log")) as f:
        text = f.read().replace("rank  4: 600.00", "rank  4: 400.00").replace("rank  5: 600.00", "rank  5: 400.00")
    path = tmp_path / "mild.log"
    path.write_text(text)
    s = summary_of(str(path))
    assert s["verdict"]["status"] == "stragglers", s["verdict"]
    assert [sorted(a["ranks"]) for a in s["anomalies"]] == [[4, 5]]


def test_analysis_runs_without_importing_torch():
    # The analysis needs only the torch-free engine (relax_straggler._core); loading torch
    # would cost its start-up seconds on every `relax-straggler analyze`.
    code = ("import sys\n"
            "from relax_straggler.cli import main\n"
            f"code = main(['analyze', {fixture('megatron_all.log')!r}, '--format', 'json'])\n"
            "assert code == 0, code\n"
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:5]\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["verdict"]


def test_a_wide_job_costs_numbers_per_rank_not_kilobytes_of_objects(tmp_path, monkeypatch):
    # 20,000 ranks x 4 steps through `analyze --format json`: reading, analysis, per-rank scores
    # and the JSON text peaked at 3.8 KB a rank (Python allocations; the indented JSON built
    # whole, a score object and an entry dict per rank), about 1 KB since.
    import tracemalloc

    ranks, rng = 20_000, np.random.default_rng(2)
    path = tmp_path / "wide.jsonl"
    with open(path, "w") as f:
        for step in range(4):
            device = np.round(rng.uniform(90, 110, (ranks, 2)), 1).tolist()
            f.write(json.dumps({"step": step, "stages": ["forward", "backward"], "device_ms": device}) + "\n")
    out = open(os.devnull, "w")
    monkeypatch.setattr("sys.stdout", out)
    tracemalloc.start()
    try:
        assert main(["analyze", str(path), "--format", "json", "--no-progress"]) == 0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        out.close()
    assert peak / ranks < 1800, f"{peak / ranks:.0f} bytes a rank"


def test_with_two_data_parallel_replicas_a_ranks_slowdown_is_over_the_other_one(tmp_path, capsys):
    # The median of two is their mean, which would halve a slowdown: rank 1, twice its peer's
    # time, reads 2.0 in the Slowest ranks as in its anomaly's evidence (not 1.33).
    path = tmp_path / "straggler.jsonl"
    path.write_text("".join(json.dumps({"step": s, "stages": ["forward", "backward"],
                                        "device_ms": [[10.0, 20.0], [20.0, 40.0]]}) + "\n" for s in range(20)))
    assert main(["analyze", str(path), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    slowdown = {r["rank"]: r["compute_slowdown"] for r in out["per_rank"]}
    assert slowdown == {0: pytest.approx(0.5), 1: pytest.approx(2.0)}
    (anomaly,) = out["anomalies"]
    assert anomaly["ranks"] == [1] and anomaly["mean_ratio"] == pytest.approx(slowdown[1])
    assert all("its data-parallel peer" in line for line in anomaly["evidence"] if "x its" in line)


def test_a_confirmed_straggler_the_verdict_released_says_when(tmp_path, capsys):
    # 4 ranks with 1 % jitter; rank 1's forward 2x for steps 5-14 only.
    rng = np.random.default_rng(5)
    lines = []
    for step in range(40):
        ms = np.stack([40.0 * np.exp(rng.normal(0, 0.01, 4)), 80.0 * np.exp(rng.normal(0, 0.01, 4))], axis=1)
        ms[1, 0] *= 2.0 if 5 <= step < 15 else 1.0
        lines.append(json.dumps({"step": step, "stages": ["forward", "backward"], "device_ms": ms.tolist()}))
    path = tmp_path / "straggler.jsonl"
    path.write_text("\n".join(lines) + "\n")
    assert main(["analyze", str(path), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (found,) = out["confirmed"]["stragglers"]
    assert (found["rank"], found["stage"], found["to_end"]) == (1, "forward", False)
    assert 14 <= found["last_step"] <= 16 and out["confirmed"]["final_status"] != "straggler"
    assert f"released after step {found['last_step']}" in out["verdict"]["summary"]
    assert main(["analyze", str(path), "--no-progress"]) == 0
    assert f"released after step {found['last_step']}" in capsys.readouterr().out


def test_the_headline_names_the_straggler_still_confirmed_at_the_end_first(tmp_path, capsys):
    # Rank 1's forward 2x for steps 5-30 (released), rank 2's from step 28 to the end.
    rng = np.random.default_rng(6)
    lines = []
    for step in range(45):
        ms = np.stack([40.0 * np.exp(rng.normal(0, 0.01, 4)), 80.0 * np.exp(rng.normal(0, 0.01, 4))], axis=1)
        ms[1, 0] *= 2.0 if 5 <= step <= 30 else 1.0
        ms[2, 0] *= 2.0 if step >= 28 else 1.0
        lines.append(json.dumps({"step": step, "stages": ["forward", "backward"], "device_ms": ms.tolist()}))
    path = tmp_path / "straggler.jsonl"
    path.write_text("\n".join(lines) + "\n")
    assert main(["analyze", str(path), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    found = out["confirmed"]["stragglers"]
    assert [(c["rank"], c["to_end"]) for c in found] == [(2, True), (1, False)]
    assert out["confirmed"]["final_status"] == "straggler"
    assert "confirmed straggler rank 2 in forward" in out["verdict"]["summary"]
