"""Layouts from the data: every reader places a rank by the dp_rank / stage its records
carry; context / sequence-data parallel (dsp), virtual pipelines (vpp), rank orders other
than Megatron's and partly recorded tensor-parallel groups are analysed, and the injected
slow worker is named; a layout that contradicts the records fails naming the row."""

from __future__ import annotations

import gzip
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from relax_straggler.analysis import AnalyzeConfig, analyze, build_summary
from relax_straggler.cli import main
from relax_straggler.readers import InputError, open_source

DP, PP, STEPS, MICROBATCHES = 4, 2, 6, 4
SLOW = (2, 1)  # the injected slow worker (dp_rank, stage), computes 2.5x slower
SLOWDOWN = 2.5
FWD_S, BWD_S = 0.010, 0.020


def _worker_ops(dp: int, pp: int, vpp: int, rng: np.random.Generator):
    """(step, optype, start_s, duration_s, seq_id, chunk, microbatch) of one worker: 1F1B-like
    forward then backward per microbatch and chunk, with 2 % jitter."""
    f = SLOWDOWN if (dp, pp) == SLOW else 1.0
    ops = []
    for step in range(STEPS):
        t = step * 10.0
        seq = {"forward-compute": 0, "backward-compute": 0}
        for mb in range(MICROBATCHES):
            for chunk in range(vpp):
                for name, base in (("forward-compute", FWD_S), ("backward-compute", BWD_S)):
                    d = base * f * (1 + 0.02 * rng.standard_normal()) / vpp
                    ops.append((step, name, t, d, seq[name], chunk, mb))
                    seq[name] += 1
                    t += d
        ops.append((step, "optimizer", t, 0.005 * (1 + 0.02 * rng.standard_normal()), 0, -1, -1))
    return ops


def _parquet(path, rank_of, vpp: int = 1, skip=lambda rank, dp, pp, slot: False, slots: int = 1):
    """Writes a per-op trace; rank_of(dp, pp, slot) numbers the ranks."""
    rng = np.random.default_rng(7)
    rows = []
    for dp in range(DP):
        for pp in range(PP):
            for slot in range(slots):
                rank = rank_of(dp, pp, slot)
                if skip(rank, dp, pp, slot):
                    continue
                for step, name, start, dur, seq, chunk, mb in _worker_ops(dp, pp, vpp, rng):
                    rows.append((dp, pp, rank, step, name, start, dur, seq, chunk,
                                 -1 if chunk < 0 else chunk * PP + pp, mb))
    names = ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration", "seq_id", "mc", "gmc", "mb_id")
    pq.write_table(pa.table({n: [r[i] for r in rows] for i, n in enumerate(names)}), path)


def _meta(path, **sizes):
    path.write_text("".join(f"{k}: {v}\n" for k, v in sizes.items()))


def _summary(path: str, **kw) -> dict:
    return build_summary(analyze(open_source(path, **kw), AnalyzeConfig()))


def _only_anomaly(summary: dict) -> dict:
    assert summary["verdict"]["status"] == "stragglers", summary["verdict"]
    assert len(summary["anomalies"]) == 1, summary["anomalies"]
    a = summary["anomalies"][0]
    assert (a["kind"], a["dp_rank"], a["pp_rank"]) == ("individual", *SLOW)
    assert set(a["stages"]) == {"forward", "backward"}
    assert a["mean_ratio"] == pytest.approx(SLOWDOWN, rel=0.08)
    return a


# A rank order that is not Megatron's: a fixed permutation of the 16 ranks.
_PERMUTED = np.random.default_rng(3).permutation(DP * PP * 2)


def _permuted_rank(dp: int, pp: int, cp: int) -> int:
    return int(_PERMUTED[cp + 2 * (dp + DP * pp)])


def test_parquet_dsp2_with_a_non_megatron_rank_order(tmp_path):
    path = tmp_path / "trace-dsp.parquet"
    _parquet(path, _permuted_rank, slots=2)
    _meta(tmp_path / "meta-dsp.yaml", dp_size=DP, dsp_size=2, pp_size=PP, tp_size=1, vpp_size=1,
          world_size=DP * PP * 2)
    s = _summary(str(path))
    a = _only_anomaly(s)
    want = sorted(_permuted_rank(*SLOW, cp) for cp in range(2))
    assert a["ranks"] == want and a["recorded_ranks"] == want
    topo = s["input"]["topology"]
    assert (topo["dp"], topo["pp"], topo["tp"], topo["dsp"], topo["rank_order"]) == (DP, PP, 1, 2, "recorded")
    per_rank = {r["rank"]: (r["dp_rank"], r["pp_rank"]) for r in s["per_rank"]}
    assert per_rank[want[0]] == SLOW and len(per_rank) == DP * PP * 2
    assert s["input"]["problems"]["total"] == 0


def test_parquet_dsp2_without_meta_infers_the_workers_from_the_records(tmp_path):
    path = tmp_path / "trace-nometa.parquet"
    _parquet(path, _permuted_rank, slots=2)
    a = _only_anomaly(_summary(str(path)))
    assert a["ranks"] == sorted(_permuted_rank(*SLOW, cp) for cp in range(2))


def test_parquet_dsp2_megatron_order_keeps_the_formula(tmp_path):
    # Megatron's 'tp-cp-dp-pp' order with cp = 2: rank = cp + 2 (dp + dp_size pp).
    path = tmp_path / "trace-cp.parquet"
    _parquet(path, lambda dp, pp, cp: cp + 2 * (dp + DP * pp), slots=2)
    _meta(tmp_path / "meta-cp.yaml", dp_size=DP, dsp_size=2, pp_size=PP, tp_size=1, world_size=DP * PP * 2)
    s = _summary(str(path))
    assert _only_anomaly(s)["ranks"] == [2 * (SLOW[0] + DP * SLOW[1]), 2 * (SLOW[0] + DP * SLOW[1]) + 1]
    assert s["input"]["topology"]["rank_order"] == "megatron"


def test_parquet_vpp2(tmp_path):
    path = tmp_path / "trace-vpp.parquet"
    _parquet(path, lambda dp, pp, tp: dp + DP * pp, vpp=2)
    _meta(tmp_path / "meta-vpp.yaml", dp_size=DP, pp_size=PP, tp_size=1, vpp_size=2, world_size=DP * PP)
    s = _summary(str(path))
    assert _only_anomaly(s)["ranks"] == [SLOW[0] + DP * SLOW[1]]
    assert s["input"]["topology"]["vpp"] == 2 and s["input"]["problems"]["total"] == 0


def test_parquet_partial_tensor_parallel_group(tmp_path):
    # tp 4, but the trace records tp ranks 0 and 2 of most workers and only tp rank 0 of the slow one.
    path = tmp_path / "trace-tp.parquet"
    _parquet(path, lambda dp, pp, tp: tp + 4 * (dp + DP * pp), slots=4,
             skip=lambda rank, dp, pp, tp: tp in (1, 3) or ((dp, pp) == SLOW and tp != 0))
    _meta(tmp_path / "meta-tp.yaml", dp_size=DP, pp_size=PP, tp_size=4, world_size=DP * PP * 4)
    s = _summary(str(path))
    a = _only_anomaly(s)
    first = 4 * (SLOW[0] + DP * SLOW[1])
    assert a["ranks"] == list(range(first, first + 4)) and a["recorded_ranks"] == [first]
    assert s["input"]["ranks"] == DP * PP * 2 - 1


def test_parquet_partial_group_in_a_recorded_order(tmp_path):
    path = tmp_path / "trace-part.parquet"
    _parquet(path, _permuted_rank, slots=2, skip=lambda rank, dp, pp, cp: (dp, pp) == SLOW and cp == 1)
    _meta(tmp_path / "meta-part.yaml", dp_size=DP, dsp_size=2, pp_size=PP, tp_size=1, world_size=DP * PP * 2)
    a = _only_anomaly(_summary(str(path)))
    assert a["ranks"] == a["recorded_ranks"] == [_permuted_rank(*SLOW, 0)]


def test_contradicting_layout_fails_naming_the_row(tmp_path):
    path = tmp_path / "trace-bad.parquet"
    _parquet(path, _permuted_rank, slots=2)
    # The meta file says pp 1 (8 ranks): every stage-1 row and every rank >= 8 contradicts it.
    _meta(tmp_path / "meta-bad.yaml", dp_size=DP, dsp_size=2, pp_size=1, tp_size=1)
    table = pq.read_table(path)
    bad = (table.column("stage").to_numpy() == 1) | (table.column("rank").to_numpy() >= DP * 2)
    first_bad = int(np.argmax(bad)) + 1
    with pytest.raises(InputError, match=rf"{path}:{first_bad}: dp_rank, stage or rank outside the declared layout"):
        list(open_source(str(path), strict=True).steps())
    assert main(["analyze", str(path), "--no-progress", "--format", "json"]) == 1  # most rows rejected
    # A worker with more recorded ranks than tp x dsp slots (dp 8 x pp 2 x tp 1 holds every rank id).
    _meta(tmp_path / "meta-bad.yaml", dp_size=2 * DP, pp_size=PP, tp_size=1, world_size=DP * PP * 2)
    src = open_source(str(path))
    with pytest.raises(InputError, match=rf"{path}:\d+: rank \d+ is one rank too many for worker"):
        list(src.steps())


def test_a_rank_that_changes_worker_is_named(tmp_path):
    path = tmp_path / "trace-move.parquet"
    _parquet(path, _permuted_rank, slots=2)
    table = pq.read_table(path)
    stage = table.column("stage").to_numpy().copy()
    stage[10] = 1 - stage[10]
    table = table.set_column(table.column_names.index("stage"), "stage", pa.array(stage, pa.int64()))
    pq.write_table(table, path)
    with pytest.raises(InputError, match=rf"{path}:11: rank \d+ changes \(dp_rank, stage\)"):
        list(open_source(str(path), strict=True).steps())


def _chrome(path, vpp: int = 2, cp: int = 2):
    """A Chrome trace: pid = dp_rank, lanes 'PP rank P, TP rank 0, DSP rank C', model_chunk args."""
    rng = np.random.default_rng(11)
    events, tid = [], 0
    for dp in range(DP):
        for pp in range(PP):
            for c in range(cp):
                tid += 1
                events.append({"ph": "M", "name": "thread_name", "pid": dp, "tid": tid,
                               "args": {"name": f"PP rank {pp}, TP rank 0, DSP rank {c}, compute"}})
                for step, name, start, dur, seq, chunk, mb in _worker_ops(dp, pp, vpp, rng):
                    events.append({"ph": "X", "name": name, "pid": dp, "tid": tid, "ts": start * 1e6,
                                   "dur": dur * 1e6, "args": {"step": step, "model_chunk": max(chunk, 0),
                                                              "mb_id": mb, "seq_id": seq}})
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)


def test_chrome_trace_dsp2_vpp2(tmp_path):
    path = tmp_path / "timeline-c.json.gz"
    _chrome(path)
    _meta(tmp_path / "meta-c.yaml", dp_size=DP, dsp_size=2, pp_size=PP, tp_size=1, vpp_size=2,
          world_size=DP * PP * 2)
    s = _summary(str(path))
    base = 2 * (SLOW[0] + DP * SLOW[1])
    assert _only_anomaly(s)["ranks"] == [base, base + 1]
    assert s["input"]["problems"]["total"] == 0
    # Without the meta file the DSP lanes still give two ranks per worker.
    (tmp_path / "meta-c.yaml").unlink()
    s = _summary(str(path))
    assert _only_anomaly(s)["ranks"] == [base, base + 1] and s["input"]["topology"]["dsp"] == 2


def _megatron_log(path, cp: int = 2, vpp: int = 2):
    """A Megatron log with context_parallel_size = cp, virtual pipelines, Megatron's rank order."""
    world = DP * PP * cp
    lines = [f"using world size: {world}, data-parallel size: {DP}, context-parallel size: {cp}, "
             f"tensor-model-parallel size: 1, pipeline-model-parallel size: {PP}",
             "------------------------ arguments ------------------------",
             f"  context_parallel_size ........................... {cp}",
             f"  pipeline_model_parallel_size .................... {PP}",
             "  tensor_model_parallel_size ...................... 1",
             "  timing_log_option ............................... all",
             f"  virtual_pipeline_model_parallel_size ............ {vpp}",
             f"  world_size ...................................... {world}",
             "-------------------- end of arguments ---------------------"]
    rng = np.random.default_rng(5)
    for it in range(1, STEPS + 1):
        lines.append(f" [2024-05-01 10:00:{it:02d}] iteration {it * 10:8d}/ {STEPS * 10:8d} | elapsed time per "
                     "iteration (ms): 1300.0 |")
        lines.append("times across ranks (ms):")
        for name, base in (("forward-compute", 300.0), ("backward-compute", 600.0), ("optimizer", 20.0)):
            lines.append(f"  {name}:")
            for rank in range(world):
                dp, pp = (rank // cp) % DP, rank // (cp * DP)
                f = SLOWDOWN if (dp, pp) == SLOW and name != "optimizer" else 1.0
                lines.append(f"     rank {rank:2d}: {base * f * (1 + 0.02 * rng.standard_normal()):.2f}")
    path.write_text("\n".join(lines) + "\n")


def test_megatron_log_with_context_parallel_and_virtual_pipeline(tmp_path):
    path = tmp_path / "train.log"
    _megatron_log(path)
    s = _summary(str(path))
    base = 2 * (SLOW[0] + DP * SLOW[1])
    assert _only_anomaly(s)["ranks"] == [base, base + 1]
    topo = s["input"]["topology"]
    assert (topo["dp"], topo["dsp"], topo["vpp"], topo["world_size"]) == (DP, 2, 2, DP * PP * 2)


def test_a_corrupt_huge_rank_is_skipped_naming_its_row(tmp_path):
    # One rank value of 2**40 in a trace without a layout: that row is skipped and reported, not allocated for.
    src = os.path.join(os.path.dirname(__file__), "..", "data", "whatif-traces", "trace-ST.parquet")
    table = pq.read_table(src)
    ranks = table.column("rank").to_pylist()
    ranks[7] = 2**40
    bad = tmp_path / "trace-huge.parquet"
    pq.write_table(table.set_column(table.schema.get_field_index("rank"), "rank", pa.array(ranks, pa.int64())), bad)
    source = open_source(str(bad))
    result = analyze(source)
    assert [str(p) for p in source.problems.kept] == [
        f"{bad}:8: rank 1099511627776 is not an integer in [0, 1,048,575]"]
    assert result.topology.world_size == 8


@pytest.mark.parametrize("command", ["analyze", "whatif"])
def test_dsp_layout_given_by_flags_as_by_the_meta_file(tmp_path, capsys, command):
    # dp x dsp x pp with dsp 2, as the study's SE job (dp 32 x dsp 2 x pp 2): no meta file beside.
    path = tmp_path / "trace-flags.parquet"
    _parquet(path, lambda dp, pp, cp: cp + 2 * (dp + DP * pp), slots=2)
    extra = ["--no-whatif", "--no-progress"] if command == "analyze" else ["--no-by-worker"]
    flags = ["--dp", str(DP), "--pp", str(PP), "--tp", "1", "--dsp", "2"]
    assert main([command, str(path), "--format", "json", *flags, *extra]) == 0
    by_flags = json.loads(capsys.readouterr().out)
    _meta(tmp_path / "meta-flags.yaml", dp_size=DP, dsp_size=2, pp_size=PP, tp_size=1)
    assert main([command, str(path), "--format", "json", *extra]) == 0
    by_meta = json.loads(capsys.readouterr().out)
    if command == "analyze":
        assert by_flags["input"]["topology"] == by_meta["input"]["topology"]
        assert by_flags["input"]["topology"]["dsp"] == 2 and by_flags["input"]["topology"]["declared"]
        a = _only_anomaly(by_flags)
        assert a["ranks"] == [2 * (SLOW[0] + DP * SLOW[1]) + cp for cp in range(2)]
    else:
        assert by_flags["slowdown"] == by_meta["slowdown"] and by_flags["input"]["problems"]["total"] == 0
    # A dsp the records contradict (one slot per worker, two recorded) names the row.
    assert main([command, str(path), "--format", "json", *flags[:-1], "1", *extra]) == 1
    assert "one rank too many for worker" in capsys.readouterr().err
