"""Hostile values in every reader: steps beyond int64, huge or non-integral ids, numbers of
thousands of digits, deep nesting, wrong column types and ids that would size the analysis
far beyond the input. Each is a reported skip naming file, line or row and field, or a
clean InputError naming them; never a traceback, never minutes of work."""

from __future__ import annotations

import json
import os
import re
import time
import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from relax_straggler.analysis import AnalyzeConfig, analyze
from relax_straggler.cli import main
from relax_straggler.common.topology import MAX_WORLD_SIZE, Topology
from relax_straggler.readers import InputError, open_source

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def _fixture_text(name: str) -> str:
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as f:
        return f.read()


def _analyze_json(path, capsys, *extra) -> tuple[int, dict, str]:
    code = main(["analyze", str(path), "--no-progress", "--format", "json", "--no-whatif", *extra])
    out = capsys.readouterr()
    return code, (json.loads(out.out) if out.out.strip() else {}), out.err


def _problems(summary: dict) -> list[str]:
    return summary["input"]["problems"]["first"]


# --- straggler.jsonl ---------------------------------------------------------------------

def _jsonl_lines() -> list[str]:
    """The straggler.jsonl fixture's 5 reports and 20 more (steps 50-240): two bad lines stay
    below the tenth of skipped records that leaves no verdict."""
    lines = _fixture_text("straggler.jsonl").splitlines()
    return lines + [lines[-1].replace('"step": 40,', f'"step": {step},') for step in range(50, 250, 10)]


@pytest.mark.parametrize("step", [str(10**20), str(2**63), "1" * 5001])
def test_jsonl_step_beyond_int64_is_a_reported_skip(tmp_path, capsys, step):
    lines = _jsonl_lines()
    lines[1] = lines[1].replace('"step": 10,', f'"step": {step},')
    path = tmp_path / "big-step.jsonl"
    path.write_text("\n".join(lines) + "\n")
    code, summary, err = _analyze_json(path, capsys)
    assert code == 0, err
    assert any(p.startswith(f"{path}:2: ") and "'step'" in p for p in _problems(summary)), _problems(summary)


def test_jsonl_deep_nesting_and_huge_times_are_reported_skips(tmp_path, capsys):
    lines = _jsonl_lines()
    lines[1] = "[" * 100_000
    lines[2] = lines[2].replace("300.0", "1" + "0" * 400)
    path = tmp_path / "nested.jsonl"
    path.write_text("\n".join(lines) + "\n")
    code, summary, err = _analyze_json(path, capsys)
    assert code == 0, err
    first = _problems(summary)
    assert first[0].startswith(f"{path}:2: ") and "nest" in first[0]
    assert first[1].startswith(f"{path}:3: device_ms[2]")


# --- Chrome traces -----------------------------------------------------------------------

def test_chrome_trace_deep_nesting_names_the_line(tmp_path, capsys):
    path = tmp_path / "nested.json"
    path.write_text("[\n" + "[" * 100_000)
    code, _, err = _analyze_json(path, capsys)
    assert code == 1 and f"{path}:2: " in err and "nest" in err


def test_chrome_trace_number_of_5001_digits_is_a_reported_skip(tmp_path, capsys):
    text = _fixture_text("timeline-small.json").replace('"ts": 2000000.0', '"ts": 1' + "0" * 5000, 1)
    path = tmp_path / "digits.json"
    path.write_text(text)
    line = next(i for i, x in enumerate(text.splitlines(), 1) if "0" * 5000 in x)
    code, summary, err = _analyze_json(path, capsys)
    assert code == 0, err
    assert _problems(summary)[0].startswith(f"{path}:{line}: event #12 (forward-compute): ts and dur")


def test_chrome_trace_hostile_event_values_are_reported_skips(tmp_path):
    text = _fixture_text("timeline-small.json")
    lines = text.splitlines()
    lines[1] = lines[1].replace('"step": 1}', f'"step": {2**63}}}')
    lines[2] = lines[2].replace('"ts": 1200000.0', '"ts": 1' + "0" * 400)
    lines[3] = lines[3].replace('"step": 1}', '"step": 1, "seq_id": "3"}')
    path = tmp_path / "hostile.json"
    path.write_text("\n".join(lines) + "\n")
    src = open_source(str(path))
    list(src.steps())
    by_line = {p.line: p.message for p in src.problems.kept}
    assert "args.step" in by_line[2] and "ts and dur" in by_line[3] and "args.seq_id" in by_line[4], by_line


def test_chrome_trace_lane_with_a_huge_pipeline_rank_is_reported(tmp_path):
    text = _fixture_text("timeline-small.json")
    events = json.loads(text)
    events.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": 10,
                   "args": {"name": "PP rank 99999999999999999999, TP rank 0"}})
    path = tmp_path / "lane.json"
    path.write_text(json.dumps(events, indent=0))
    src = open_source(str(path))
    list(src.steps())
    assert any("PP rank" in p.message and str(MAX_WORLD_SIZE) in p.message.replace(",", "")
               for p in src.problems.kept), src.problems.kept


def test_chrome_trace_args_of_the_wrong_type_are_reported(tmp_path):
    events = json.loads(_fixture_text("timeline-small.json"))
    events.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": 0, "args": [1, 2]})
    path = tmp_path / "args.json"
    path.write_text(json.dumps(events))
    src = open_source(str(path))
    list(src.steps())
    assert src.problems.counts["malformed"] == 1


# --- parquet traces ----------------------------------------------------------------------

def _parquet(path, **override) -> str:
    cols = {"dp_rank": [0, 0, 1, 1] * 3, "stage": [0] * 12, "rank": [0, 0, 1, 1] * 3,
            "step": [1] * 4 + [2] * 4 + [3] * 4, "optype": ["forward-compute", "backward-compute"] * 6,
            "duration": [0.1, 0.2, 0.1, 0.3] * 3}
    cols.update(override)
    pq.write_table(pa.table(cols), path)
    return str(path)


def _read(path: str, **kw):
    src = open_source(path, **kw)
    list(src.steps())
    return src


@pytest.mark.parametrize("column, values, field", [
    ("rank", [0.0, 0, 1, 1] * 2 + [0, 0, 1.5, 1], "rank"),
    ("rank", pa.array([0, 0, 1, 1] * 2 + [0, 0, None, 1], pa.int64()), "rank"),
    ("step", pa.array([1] * 4 + [2] * 4 + [3] * 3 + [2**63], pa.uint64()), "step"),
    ("step", [1.0] * 4 + [2.0] * 4 + [3.0] * 3 + [1e20], "step"),
    ("dp_rank", [0, 0, 1, 1] * 2 + [0, 0, 1, 2**40], "dp_rank"),
])
def test_parquet_ids_must_be_integers_in_range(tmp_path, column, values, field):
    src = _read(_parquet(tmp_path / "ids.parquet", **{column: values}))
    row = 11 if column != "step" and column != "dp_rank" else 12
    assert [p.line for p in src.problems.kept] == [row], src.problems.kept
    assert f"{field} " in src.problems.kept[0].message


def test_parquet_string_durations_are_refused_naming_the_column(tmp_path):
    path = _parquet(tmp_path / "strings.parquet", duration=["0.1", "0.2", "0.1", "12.5"] * 3)
    with pytest.raises(InputError, match=f"{path}: column 'duration' of type string is not numeric"):
        _read(path)


def test_parquet_sparse_rank_is_refused_fast(tmp_path):
    # One corrupt rank just below the world limit used to cost a loop over 2^20 layouts.
    path = _parquet(tmp_path / "sparse.parquet", rank=[0, 0, 1, 1] * 2 + [0, 0, MAX_WORLD_SIZE - 1, MAX_WORLD_SIZE - 1])
    t0 = time.perf_counter()
    with pytest.raises(InputError, match=f"{path}:11: rank {MAX_WORLD_SIZE - 1} "):
        analyze(open_source(path), AnalyzeConfig())
    assert time.perf_counter() - t0 < 2.0


def test_parquet_sparse_worker_ids_are_refused(tmp_path):
    path = _parquet(tmp_path / "workers.parquet", dp_rank=[0, 0, 1, 1] * 2 + [0, 0, 1, 1],
                    stage=[0, 0, 0, 0] * 2 + [0, 0, 100000, 100000], rank=[0, 0, 1, 1] * 2 + [0, 0, 2, 2])
    with pytest.raises(InputError, match=f"{path}:11: stage 100000 "):
        analyze(open_source(path), AnalyzeConfig())


def test_parquet_distinct_steps_and_ranks_are_refused_before_expanding(tmp_path):
    n = 1500  # every row its own step and rank: 2.25 M (step, rank) cells from 1,500 rows
    path = _parquet(tmp_path / "diagonal.parquet", dp_rank=list(range(n)), stage=[0] * n, rank=list(range(n)),
                    step=list(range(n)), optype=["forward-compute"] * n, duration=[0.1] * n)
    t0 = time.perf_counter()
    with pytest.raises(InputError, match=f"{path}: .*steps x .*ranks"):
        analyze(open_source(path), AnalyzeConfig())
    assert time.perf_counter() - t0 < 2.0


# --- Megatron logs -----------------------------------------------------------------------

def test_megatron_log_world_beyond_its_values_is_refused_fast(tmp_path):
    text = _fixture_text("megatron_all.log")
    for name, value in (("world_size", 1 << 20), ("tensor_model_parallel_size", 1),
                        ("pipeline_model_parallel_size", 1)):
        text = "\n".join(f"  {name} {'.' * 10} {value}" if x.strip().startswith(name + " ") else x
                         for x in text.splitlines())
    path = tmp_path / "world.log"
    path.write_text(text + "\n")
    t0 = time.perf_counter()
    with pytest.raises(InputError, match=f"{path}: .*1,048,576 ranks"):
        analyze(open_source(str(path)), AnalyzeConfig())
    assert time.perf_counter() - t0 < 2.0


@pytest.mark.parametrize("value", ["0", str(1 << 30)])
def test_megatron_log_bad_parallel_size_names_the_argument(tmp_path, value):
    text = _fixture_text("megatron_all.log").replace("tensor_model_parallel_size ...................... 2",
                                                      f"tensor_model_parallel_size ...................... {value}")
    path = tmp_path / "tp.log"
    path.write_text(text)
    with pytest.raises(InputError, match=f"{path}: argument tensor_model_parallel_size"):
        list(open_source(str(path)).steps())


# --- layouts -----------------------------------------------------------------------------

def test_topology_refuses_a_world_beyond_the_limit():
    with pytest.raises(ValueError, match="1,048,576"):
        Topology(dp=1 << 20, pp=2)


def test_parquet_optype_not_utf8_names_the_rows(tmp_path):
    # Damaged bytes inside a string column (found by benchmarks/fuzz_inputs.py).
    good = pa.array(["forward-compute", "backward-compute"] * 6)
    offsets, data = good.buffers()[1], bytearray(good.buffers()[2].to_pybytes())
    data[0] = 0x9A
    bad = pa.Array.from_buffers(pa.string(), len(good), [None, offsets, pa.py_buffer(bytes(data))])
    path = _parquet(tmp_path / "utf8.parquet", optype=bad)
    with pytest.raises(InputError, match=f"{path}:1: .*UTF-8"):
        _read(path)


def test_parquet_with_damaged_column_names_is_refused(tmp_path):
    # A byte flip inside the footer's column names (found by benchmarks/fuzz_inputs.py).
    path = _parquet(tmp_path / "names.parquet")
    data = bytearray(open(path, "rb").read())
    at = data.find(b"dp_rank")
    while at >= 0:  # every copy: the thrift schema and the column chunks' paths
        data[at + 3] = 0x9A
        at = data.find(b"dp_rank", at + 1)
    open(path, "wb").write(bytes(data))
    with pytest.raises(InputError, match=f"{path}: not a readable parquet file"):
        open_source(path)


# --- times near the float limit --------------------------------------------------------


def _near_limit(fmt: str, path) -> None:
    """4 steps x 4 ranks of forward / backward; rank 1's are 1e308 ms in step 2."""
    def ms(step, rank, stage):
        return 1e308 if (step, rank) == (2, 1) else (10.0 if stage == "forward" else 20.0) + rank
    if fmt == "straggler-jsonl":
        path.write_text("".join(json.dumps({"step": s, "stages": ["forward", "backward"],
                                            "device_ms": [[ms(s, r, "forward"), ms(s, r, "backward")]
                                                          for r in range(4)]}) + "\n" for s in range(4)))
    elif fmt == "megatron-log":
        path.write_text("".join(f" iteration {s}/ 4 |\ntimes across ranks (ms):\n" + "".join(
            f"  {name}-compute:\n" + "".join(f"     rank {r}: {ms(s, r, name)!r}\n" for r in range(4))
            for name in ("forward", "backward")) for s in range(4)))
    else:
        events = [{"ph": "M", "name": "thread_name", "pid": r, "tid": 0, "args": {"name": "PP rank 0, TP rank 0"}}
                  for r in range(4)]
        events += [{"ph": "X", "name": f"{name}-compute", "pid": r, "tid": 0, "ts": 1e6 * s,
                    "dur": ms(s, r, name) * 1e3, "args": {"step": s}}
                   for s in range(4) for r in range(4) for name in ("forward", "backward")]
        path.write_text(json.dumps(events))


@pytest.mark.parametrize("fmt, name", [("straggler-jsonl", "near.jsonl"), ("megatron-log", "near.log"),
                                       ("chrome-trace", "near.json")])
def test_times_near_the_float_limit_are_skipped_not_summed_to_inf(tmp_path, capsys, fmt, name):
    path = tmp_path / name
    _near_limit(fmt, path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an overflow warning is the symptom of a sum that reached inf
        code, summary, err = _analyze_json(path, capsys)
        assert main(["analyze", str(path), "--no-progress", "--no-whatif"]) in (0, 1)
    text = capsys.readouterr().out
    assert not re.search(r"\binf\b", text, re.IGNORECASE), text
    problems = summary["input"]["problems"]
    assert problems["total"] >= 1 and problems["records_skipped"] == problems["total"]
    assert any(bound in problems["first"][0] for bound in ("1e+14", "1e14", "1e+17")), problems["first"]
    assert all(v is not None for r in summary["per_rank"] for v in r["mean_ms"].values())


# --- long values in a Chrome trace -------------------------------------------------------


@pytest.fixture
def small_windows(monkeypatch):
    """Chrome trace windows of 512 characters and values of at most 4,096 parsed: the paths
    of a 100 MB string in a file of kilobytes."""
    from relax_straggler.readers import chrome_trace

    monkeypatch.setattr(chrome_trace, "CHUNK_BYTES", 512)
    monkeypatch.setattr(chrome_trace, "MAX_EVENT_CHARS", 4096)
    return chrome_trace.MAX_EVENT_CHARS


def test_chrome_trace_metadata_longer_than_an_event_is_passed_over(tmp_path, capsys, small_windows):
    events = _fixture_text("timeline-small.json")
    path = tmp_path / "long-meta.json"
    path.write_text('{"otherData": {"note": "' + 'x\\"{[' * 5000 + '"}, "traceEvents": ' + events + "}")
    code, summary, err = _analyze_json(path, capsys)
    assert code == 0, err
    plain = tmp_path / "plain.json"
    plain.write_text(events)
    assert _analyze_json(plain, capsys)[1]["anomalies"] == summary["anomalies"]
    assert summary["input"]["problems"]["total"] == 0


def test_chrome_trace_event_longer_than_the_limit_is_a_reported_skip(tmp_path, capsys, small_windows):
    events = json.loads(_fixture_text("timeline-small.json"))
    events[3]["args"]["stack"] = "y" * 3 * small_windows
    path = tmp_path / "long-event.json"
    path.write_text("[\n" + ",\n".join(json.dumps(e) for e in events) + "\n]")
    code, summary, err = _analyze_json(path, capsys)
    assert code == 0, err
    assert summary["input"]["problems"]["by_kind"] == {"oversized": 1}
    assert _problems(summary)[0].startswith(f"{path}:5: event #3 is 12,")
    assert summary["input"]["records"] == len(events)  # the skipped event was read
    path.write_text(path.read_text()[:2000 + 3 * small_windows // 2])  # cut inside the long string
    code, _, err = _analyze_json(path, capsys)
    assert code == 1 and f"{path}:5: the input ends inside a value" in err
