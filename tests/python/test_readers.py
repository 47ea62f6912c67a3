"""Readers: each format on a small fixture, the common output, and bad input reported with
file and line (or row), skipped by default and fatal with strict."""

from __future__ import annotations

import gzip
import json
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from relax_straggler.common.stages import STAGE_IDS
from relax_straggler.common.topology import Layout, Topology
from relax_straggler.readers import InputError, MinMaxStep, StepTimes, detect_format, open_source

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def fixture(name: str) -> str:
    return os.path.join(FIXTURES, name)


def col(name: str) -> int:
    return STAGE_IDS[name]


# --- format detection --------------------------------------------------------------------

@pytest.mark.parametrize("name, fmt", [
    ("megatron_all.log", "megatron-log"), ("straggler.jsonl", "straggler-jsonl"),
    ("timeline-small.json", "chrome-trace"), ("timeline-small.json.gz", "chrome-trace"),
])
def test_detect_format_by_name(name, fmt):
    assert detect_format(fixture(name)) == fmt


def test_detect_format_by_content(tmp_path):
    for src, fmt in (("timeline-small.json.gz", "chrome-trace"), ("straggler.jsonl", "straggler-jsonl"),
                     ("megatron_all.log", "megatron-log")):
        dst = tmp_path / f"renamed-{fmt}.dat"
        shutil.copy(fixture(src), dst)
        assert detect_format(str(dst)) == fmt


def test_missing_file_and_unknown_format(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        open_source(str(tmp_path / "nope.log"))
    with pytest.raises(InputError, match="unknown format"):
        open_source(fixture("straggler.jsonl"), "csv")


# --- straggler.jsonl ---------------------------------------------------------------------

def test_jsonl_reads_steps_with_nan_for_null():
    src = open_source(fixture("straggler.jsonl"))
    steps = list(src.steps())
    assert [s.step for s in steps] == [0, 10, 20, 30, 40]
    s = steps[0]
    assert isinstance(s, StepTimes)
    assert s.ms.shape == (4, len(s.stages))
    assert s.ms[2, col("backward")] == 300.0
    assert np.isnan(s.ms[0, col("data")])
    assert s.p2p_ms is None and src.topology() is None


def test_jsonl_a_hang_answer_is_no_step_and_no_problem(tmp_path):
    good = open(fixture("straggler.jsonl")).read().splitlines()
    hang = json.dumps({"step": 4, "stages": [], "device_ms": [], "metrics": {
        "straggler/hang/answer": "rank 2 never entered all_reduce #6 of group default_pg (ranks 0-3)"}})
    path = tmp_path / "hang.jsonl"
    path.write_text("\n".join([good[0], hang, good[1]]) + "\n")
    src = open_source(str(path))
    assert [s.step for s in src.steps()] == [0, 10] and src.problems.total == 0


def test_jsonl_bad_lines_are_reported_with_line_numbers(tmp_path):
    good = open(fixture("straggler.jsonl")).read().splitlines()
    lines = [good[0], "{not json", json.dumps({"step": 5, "stages": ["warp"], "device_ms": [[1.0]]}),
             json.dumps({"step": 6, "stages": ["forward"], "device_ms": [[-1.0], [2.0]]}), good[0], good[1]]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    src = open_source(str(path))
    assert [s.step for s in src.steps()] == [0, 10]
    assert [p.line for p in src.problems.kept] == [2, 3, 4, 5]
    assert str(src.problems.kept[0]).startswith(f"{path}:2: not a JSON object")
    assert "unknown stage" in src.problems.kept[1].message
    assert "repeats" in src.problems.kept[3].message
    assert src.problems.counts == {"malformed": 1, "unknown_op": 1, "bad_value": 1, "duplicate": 1}
    with pytest.raises(InputError, match=rf"{path}:2: .*--strict"):
        list(open_source(str(path), strict=True).steps())


def test_jsonl_reports_must_keep_their_rank_count(tmp_path):
    good = open(fixture("straggler.jsonl")).read().splitlines()
    wide = json.dumps({"step": 99, "stages": ["forward"], "device_ms": [[1.0]] * 5})
    path = tmp_path / "wide.jsonl"
    path.write_text("\n".join([good[0], wide, good[1]]) + "\n")
    src = open_source(str(path))
    assert [s.step for s in src.steps()] == [0, 10]
    assert src.problems.kept[0].line == 2 and "first report had 4" in src.problems.kept[0].message


def test_jsonl_empty_file(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    with pytest.raises(InputError, match="empty file"):
        list(open_source(str(path)).steps())


# --- Megatron timer logs -----------------------------------------------------------------

def test_megatron_all_ranks_log():
    src = open_source(fixture("megatron_all.log"))
    steps = list(src.steps())
    assert src.topology() == Topology(dp=2, pp=2, tp=2)
    assert [s.step for s in steps] == [10, 20, 30, 40, 50, 60]
    s = steps[0]
    assert s.step_ms == 1210.0
    assert s.ranks.tolist() == list(range(8))
    assert s.ms[5, col("forward")] == pytest.approx(600.0)
    # forward-send only on pipeline stage 0 (ranks 0-3), forward-recv only on stage 1.
    assert np.isnan(s.p2p_ms[4:, 0]).all() and np.isfinite(s.p2p_ms[:4, 0]).all()
    assert np.isnan(s.p2p_ms[:4, 1]).all() and np.isfinite(s.p2p_ms[4:, 1]).all()
    assert src.names.excluded == {"forward-backward": 6 * 8}
    assert src.problems.total == 0


def test_megatron_minmax_log():
    src = open_source(fixture("megatron_minmax.log"))
    steps = list(src.steps())
    assert len(steps) == 3 and all(isinstance(s, MinMaxStep) for s in steps)
    assert steps[0].min_ms[col("forward")] == 100.0 and steps[0].max_ms[col("forward")] == 160.0
    assert steps[0].max_ms[col("communication/reduce_scatter")] == 60.0


def test_megatron_log_problems_name_the_line(tmp_path):
    text = open(fixture("megatron_all.log")).read().replace("     rank  3: 295.09", "     rank  3: fast", 1)
    text = text.replace("  optimizer:\n", "  mystery-timer:\n", 1)
    path = tmp_path / "bad.log"
    path.write_text(text)
    bad_line = text.splitlines().index("     rank  3: fast") + 1
    src = open_source(str(path))
    list(src.steps())
    messages = [str(p) for p in src.problems.kept]
    assert any(m.startswith(f"{path}:{bad_line}: malformed rank line") for m in messages), messages
    assert any("unknown op name 'mystery-timer'" in m for m in messages)
    with pytest.raises(InputError, match=f"{path}:{bad_line}:"):
        list(open_source(str(path), strict=True).steps())


def test_megatron_ranks_beyond_the_world_are_skipped(tmp_path):
    head, sep, tail = open(fixture("megatron_all.log")).read().partition("  forward-compute:\n")
    text = head + sep + tail.replace("     rank  7: ", "     rank 70: ", 1)  # the first block's forward
    path = tmp_path / "far.log"
    path.write_text(text)
    src = open_source(str(path))
    steps = list(src.steps())
    assert len(steps) == 6 and steps[0].ranks.size == 8
    assert src.problems.counts == {"layout": 1}
    assert "world size 8" in src.problems.kept[0].message


def test_megatron_log_without_blocks(tmp_path):
    path = tmp_path / "plain.log"
    path.write_text("hello\nworld\n")
    with pytest.raises(InputError, match="no Megatron timer block"):
        list(open_source(str(path), "megatron-log").steps())


# --- Chrome traces -----------------------------------------------------------------------

@pytest.mark.parametrize("name", ["timeline-small.json", "timeline-small.json.gz"])
def test_chrome_trace_lanes_named_after_the_events(name):
    src = open_source(fixture(name))
    steps = list(src.steps())
    assert src.topology() == Topology(dp=2, pp=2, tp=1)
    assert [s.step for s in steps] == [1, 2, 3, 4]
    s = steps[0]
    # rank = dp + 2 pp: worker dp 1 / pp 0 is rank 1, 2x slow.
    assert s.ms[:, col("forward")].tolist() == [100.0, 200.0, 100.0, 100.0]
    assert s.step_ms == pytest.approx(620.0)


def test_chrome_trace_object_form(tmp_path):
    events = json.load(open(fixture("timeline-small.json")))
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"displayTimeUnit": "ms", "traceEvents": events}))
    assert len(list(open_source(str(path)).steps())) == 4


def test_chrome_trace_truncated_gzip(tmp_path):
    data = open(fixture("timeline-small.json.gz"), "rb").read()
    path = tmp_path / "cut.json.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=rf"{path}:\d+: the gzip stream is damaged or truncated"):
        list(open_source(str(path)).steps())


def test_chrome_trace_bad_events(tmp_path):
    events = json.load(open(fixture("timeline-small.json")))
    events[0]["dur"] = -5
    events[1]["name"] = "teleport"
    events.insert(2, dict(events[2]))  # duplicate
    path = tmp_path / "t.json"
    path.write_text("[\n" + ",\n".join(json.dumps(e) for e in events) + "\n]\n")
    src = open_source(str(path))
    list(src.steps())
    assert src.problems.counts == {"bad_value": 1, "unknown_op": 1, "duplicate": 1}
    assert [p.line for p in src.problems.kept] == [2, 3, 5]  # line 1 is "["


def test_chrome_trace_empty_and_unclosed(tmp_path):
    empty = tmp_path / "e.json"
    empty.write_text("")
    with pytest.raises(InputError, match="empty file"):
        list(open_source(str(empty)).steps())
    cut = tmp_path / "c.json"
    cut.write_text(open(fixture("timeline-small.json")).read()[:-4])
    with pytest.raises(InputError, match=f"{cut}:"):
        list(open_source(str(cut)).steps())


# --- parquet traces ----------------------------------------------------------------------

def _ops(rows: list[tuple]) -> pa.Table:
    names = ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration", "seq_id", "mc")
    return pa.table({n: [r[i] for r in rows] for i, n in enumerate(names)})


def _healthy(steps=(1, 2), dp=2, pp=2, slow=None) -> list[tuple]:
    rows = []
    for step in steps:
        for d in range(dp):
            for p in range(pp):
                rank = d + dp * p
                f = 2.0 if (d, p) == slow else 1.0
                rows.append((d, p, rank, step, "forward-compute", 0.0, 0.1 * f, 0, 0))
                rows.append((d, p, rank, step, "backward-compute", 0.2, 0.2 * f, 0, 0))
    return rows


def test_parquet_trace_sums_ops_to_ms(tmp_path):
    path = tmp_path / "trace-x.parquet"
    rows = _healthy(slow=(1, 1))
    rows.append((0, 0, 0, 1, "forward-compute", 0.5, 0.05, 1, 0))  # a second micro-batch
    pq.write_table(_ops(rows), path)
    src = open_source(str(path))
    steps = list(src.steps())
    assert src.topology() == Topology(dp=2, pp=2, tp=1)
    assert steps[0].ms[0, col("forward")] == pytest.approx(150.0)
    assert steps[0].ms[3, col("backward")] == pytest.approx(400.0)
    assert steps[0].step_ms == pytest.approx(600.0)


def _rank_major_and_step_major(tmp_path, ranks: int, steps: int):
    """The same per-op rows twice: in step order, and in rank order (every step of rank 0,
    then of rank 1: the files of a per-rank collector concatenated)."""
    rng = np.random.default_rng(5)
    rows = [(r, 0, r, s, name, s * 1.0, base * (1 + 0.1 * rng.random()))
            for s in range(steps) for r in range(ranks) for name, base in (("forward-compute", 0.1),
                                                                           ("backward-compute", 0.2))]
    names = ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration")
    paths = []
    for order, key in (("step", lambda x: (x[3], x[2])), ("rank", lambda x: (x[2], x[3]))):
        path = tmp_path / f"trace-{order}.parquet"
        ordered = sorted(rows, key=key)
        pq.write_table(pa.table({n: [r[i] for r in ordered] for i, n in enumerate(names)}), path)
        paths.append(str(path))
    return paths


def test_parquet_in_rank_order_reads_as_in_step_order_in_the_same_memory(tmp_path, monkeypatch):
    import tracemalloc

    from relax_straggler.readers import parquet_trace

    monkeypatch.setattr(parquet_trace, "BATCH_ROWS", 8)  # one rank's rows per batch in rank order
    peaks, read = [], []
    for path in _rank_major_and_step_major(tmp_path, ranks=14, steps=4):
        tracemalloc.start()
        read.append(list(open_source(path).steps()))
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    by_step, by_rank = read
    assert [s.step for s in by_rank] == [s.step for s in by_step] == [0, 1, 2, 3]
    for a, b in zip(by_step, by_rank):
        np.testing.assert_array_equal(a.ranks, b.ranks)
        np.testing.assert_allclose(a.ms, b.ms, equal_nan=True)
        assert a.step_ms == b.step_ms
    # Rank order used to double the step dimension at each new rank (14 ranks: 32,768 steps held).
    assert peaks[1] < 2 * peaks[0] + (1 << 20), peaks


def test_parquet_bad_rows_name_the_row(tmp_path):
    rows = _healthy()
    rows[1] = rows[1][:6] + (float("nan"),) + rows[1][7:]
    rows[2] = rows[2][:6] + (-1.0,) + rows[2][7:]
    rows[3] = rows[3][:4] + ("warp-drive",) + rows[3][5:]
    rows.append(rows[0])  # duplicate of row 1, at row len(rows)
    path = tmp_path / "trace-bad.parquet"
    pq.write_table(_ops(rows), path)
    src = open_source(str(path))
    list(src.steps())
    assert [p.line for p in src.problems.kept] == [2, 3, 4, len(rows)]
    assert str(src.problems.kept[0]).startswith(f"{path}:2: duration must be")
    assert "unknown op name 'warp-drive'" in src.problems.kept[2].message
    assert "duplicate row" in src.problems.kept[3].message
    with pytest.raises(InputError, match=f"{path}:2: duration"):
        list(open_source(str(path), strict=True).steps())


def test_parquet_wrong_columns_and_empty(tmp_path):
    path = tmp_path / "cols.parquet"
    pq.write_table(pa.table({"rank": [0], "step": [1], "time": [0.1]}), path)
    with pytest.raises(InputError, match="missing column.*dp_rank"):
        open_source(str(path))
    empty = tmp_path / "empty.parquet"
    pq.write_table(_ops([]).cast(_ops(_healthy()).schema), empty)
    with pytest.raises(InputError, match="no usable operation rows"):
        list(open_source(str(empty)).steps())
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"PAR1 not really")
    with pytest.raises(InputError, match="not a readable parquet file"):
        open_source(str(garbage))


def test_parquet_rank_layout_must_be_consistent(tmp_path):
    rows = _healthy()
    rows[0] = (1,) + rows[0][1:]  # rank 0 claims dp_rank 1
    path = tmp_path / "trace-l.parquet"
    pq.write_table(_ops(rows), path)
    src = open_source(str(path), topology=Topology(dp=2, pp=2))
    list(src.steps())
    assert src.problems.counts == {"layout": 1}
    assert src.problems.kept[0].line == 1


def test_meta_beside_the_trace_is_used_and_checked(tmp_path):
    path = tmp_path / "trace-m.parquet"
    pq.write_table(_ops(_healthy()), path)
    (tmp_path / "meta-m.yaml").write_text("dp_size: 2\npp_size: 2\ntp_size: 1\nvpp_size: 1\nworld_size: 4\n")
    assert open_source(str(path)).topology() == Topology(dp=2, pp=2, tp=1)
    (tmp_path / "meta-m.yaml").write_text("dp_size: 2\npp_size: 2\ntp_size: 1\nvpp_size: 2\n")
    assert open_source(str(path)).topology() == Layout(dp=2, pp=2, tp=1, vpp=2)
    (tmp_path / "meta-m.yaml").write_text("dp_size: 2\npp_size: 2\ntp_size: 1\ndsp_size: 2\nworld_size: 4\n")
    with pytest.raises(InputError, match="world_size 4 != dp x pp x tp x dsp = 8"):
        open_source(str(path))


def test_gzip_of_chrome_fixture_is_valid():
    with gzip.open(fixture("timeline-small.json.gz"), "rt") as f:
        assert json.load(f) == json.load(open(fixture("timeline-small.json")))


@pytest.mark.parametrize("name, stage, p2p", [
    ("forward-compute", "forward", None), ("batch-generator", "data", None),
    ("all-grads-sync", "communication", None), ("grads-all-reduce", "communication/allreduce", None),
    ("layernorm-grads-all-reduce", "communication/allreduce", None),
    ("backward-send", "communication/send", "backward-send"),
    ("forward-send-backward-recv", "communication/recv", "backward-recv"),
])
def test_megatron_timer_names_map_onto_the_stage_set(name, stage, p2p):
    from relax_straggler.readers.base import P2P_OPS
    from relax_straggler.readers.megatron_names import timer_target

    target = timer_target(name)
    assert target.stage == col(stage)
    assert target.p2p == (None if p2p is None else P2P_OPS.index(p2p))


def test_parent_and_nested_timers_are_excluded_and_unknown_names_are_none():
    from relax_straggler.readers.megatron_names import EXCLUDED, timer_target

    assert timer_target("forward-backward") is EXCLUDED and timer_target("optimizer-inner-step") is EXCLUDED
    assert timer_target("warp-drive") is None
