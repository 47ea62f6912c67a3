"""megatron_metrics rows -> StepTimes (relax_straggler/readers/metrics_rows.py): a recorded
run fed into a store reads back as the file reader reads it, and bad rows are
reported by job, iteration, rank and timer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from relax_straggler.analysis import analyze, build_summary
from relax_straggler.monitor.feed import feed, recorded_steps
from relax_straggler.readers import InputError, Problems, open_source
from relax_straggler.readers.base import P2P_OPS
from relax_straggler.readers.metrics_rows import RowConverter, StoreSource
from relax_straggler.stores.base import Sample
from relax_straggler.stores.opener import open_store
from row_oracle import RowOracle
from relax_straggler.common.stages import STAGE_IDS

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("name", ["megatron_all.log", "straggler.jsonl"])
def test_a_fed_recording_reads_back_as_the_file(tmp_path, name):
    path = str(FIXTURES / name)
    store = open_store(f"file://{tmp_path}")
    stats = feed(recorded_steps(path), store, "rec", speed=1e9, ranks_per_node=4)
    original = list(open_source(path).steps())
    assert stats.iterations == len(original)
    source = StoreSource(store, "rec", 0, 10**9, topology=declared_topology(path))
    back = list(source.steps())
    assert [s.step for s in back] == [s.step for s in original]
    for a, b in zip(original, back):
        np.testing.assert_array_equal(a.ranks, b.ranks)
        np.testing.assert_allclose(a.ms, b.ms, equal_nan=True)
        assert (a.p2p_ms is None) == (b.p2p_ms is None)
        if a.p2p_ms is not None:
            np.testing.assert_allclose(a.p2p_ms, b.p2p_ms, equal_nan=True)
        expected_step = a.step_ms if np.isfinite(a.step_ms) else np.nanmax(np.nansum(a.ms, axis=1))
        assert b.step_ms == pytest.approx(expected_step)
    assert source.problems.total == 0
    assert source.nodes == {r: f"node-{r // 4}" for r in original[0].ranks.tolist()}


def declared_topology(path: str):
    source = open_source(path)
    for _ in source.steps():  # a Megatron log declares its layout as it goes
        pass
    return source.topology()


def test_analysis_of_the_store_matches_the_file(tmp_path):
    path = str(FIXTURES / "megatron_all.log")
    store = open_store(f"file://{tmp_path}")
    feed(recorded_steps(path), store, "rec", speed=1e9)
    topology = declared_topology(path)
    assert (topology.dp, topology.pp, topology.tp) == (2, 2, 2)
    from_file = build_summary(analyze(open_source(path)))
    from_store = build_summary(analyze(StoreSource(store, "rec", 0, 10**9, topology=topology)))
    assert from_store["verdict"] == from_file["verdict"]
    assert [(a["kind"], a["ranks"], a["stages"]) for a in from_store["anomalies"]] == \
        [(a["kind"], a["ranks"], a["stages"]) for a in from_file["anomalies"]]
    assert from_store["anomalies"], "the fixture has a straggler"


def row(it, rank, name, values, subname="", node=""):
    return Sample(1.0, "j", name, rank, it, tuple(values), subname=subname, node=node)


def test_rows_become_steps_with_sums_p2p_and_nodes():
    conv = RowConverter("j", Problems("test"))
    steps = list(conv.steps([
        row(0, 3, "forward-compute", [10.0], node="n1"), row(0, 1, "forward-compute", [4.0, 6.0], node="n0"),
        row(0, 1, "backward-compute", [20.0], subname="mb0"), row(0, 1, "backward-compute", [22.0], subname="mb1"),
        row(0, 3, "forward-send-backward-recv", [7.0]), row(0, 3, "interval-time", [100.0]),
        row(0, 1, "interval-time", [90.0]), row(0, 1, "forward-backward", [95.0]),
        row(0, 3, "straggler/attention", [3.0]), row(0, 3, "straggler/communication/alltoall", [2.0]),
        row(1, 1, "forward-compute", [11.0]),
    ]))
    assert [s.step for s in steps] == [0, 1]
    s = steps[0]
    assert s.ranks.tolist() == [1, 3] and s.step_ms == 100.0
    assert s.ms[0, STAGE_IDS["forward"]] == 10.0 and s.ms[0, STAGE_IDS["backward"]] == 42.0
    assert s.ms[1, STAGE_IDS["communication/recv"]] == 7.0
    assert s.ms[1, STAGE_IDS["attention"]] == 3.0 and s.ms[1, STAGE_IDS["communication/alltoall"]] == 2.0
    assert s.p2p_ms[1, P2P_OPS.index("backward-recv")] == 7.0 and np.isnan(s.p2p_ms[0]).all()
    assert np.isnan(steps[1].step_ms) and steps[1].p2p_ms is None
    assert conv.nodes == {3: "n1", 1: "n0"}
    assert conv.excluded == {"forward-backward": 1} and conv.records == 11


def test_bad_rows_are_reported_by_job_iteration_rank_and_timer():
    problems = Problems("store job j")
    conv = RowConverter("j", problems)
    steps = list(conv.steps([
        row(4, 0, "forward-compute", [10.0]), row(4, 1, "forward-compute", [10.0]),
        row(4, 1, "warp-drive", [1.0]), row(4, 0, "forward-compute", [11.0]), row(4, 2, "optimizer", [-1.0]),
        row(4, 3, "optimizer", []), row(4, 3, "straggler/warp", [1.0]), row(5, 1, "warp-drive", [1.0]),
    ]))
    assert len(steps) == 1 and steps[0].ranks.tolist() == [0, 1]
    assert dict(problems.counts) == {"unknown_op": 2, "duplicate": 1, "bad_value": 2}
    assert conv.unknown == {"warp-drive": 2, "straggler/warp": 1}
    messages = [str(p) for p in problems.kept]
    assert "job 'j' iteration 4 rank 1 timer 'warp-drive': unknown timer name" in messages[0]
    assert any("iteration 4 rank 0 timer 'forward-compute': a second row" in m for m in messages)
    assert any("iteration 4 rank 2 timer 'optimizer': values [-1.0]" in m for m in messages)


def test_strict_source_stops_at_the_first_problem(tmp_path):
    store = open_store(f"file://{tmp_path}")
    store.write([Sample(1.0, "j", "warp-drive", 0, 0, (1.0,))])
    with pytest.raises(InputError, match="warp-drive.*--strict"):
        list(StoreSource(store, "j", 0, 0, strict=True).steps())
    with pytest.raises(InputError, match="no usable row \\(1 rows read\\)"):
        list(StoreSource(store, "j", 0, 0).steps())


def test_stages_without_a_megatron_timer_round_trip(tmp_path):
    from relax_straggler.readers.base import StepTimes, empty_stage_row

    ms = empty_stage_row(3)
    for stage, value in (("forward", 10.0), ("attention", 4.0), ("moe", 2.5), ("communication/alltoall", 1.5),
                         ("communication/send", 0.5), ("communication/broadcast", 0.25)):
        ms[:, STAGE_IDS[stage]] = value
    step = StepTimes(step=7, ranks=np.arange(3), ms=ms, step_ms=30.0)
    store = open_store(f"file://{tmp_path}")
    feed([step], store, "odd", speed=1e9)
    names = {s.metric_name for s in store.samples("odd", 7, 7)}
    assert {"straggler/attention", "straggler/moe", "straggler/communication/send"} <= names
    back = list(StoreSource(store, "odd", 7, 7).steps())
    np.testing.assert_allclose(back[0].ms, ms, equal_nan=True)


# The numpy path over tables against the row-by-row reference (row_oracle.py) ----------------
MIXED_NAMES = ["forward-compute", "backward-compute", "optimizer", "interval-time", "forward-backward",
               "forward-send-backward-recv", "backward-recv", "straggler/attention", "warp-drive", "straggler/warp"]


def mixed_rows(seed: int, iterations: int = 12, ranks: int = 6) -> list[Sample]:
    """Rows of every kind a store holds, bad ones included: unknown and excluded names,
    repeated (rank, timer, subname), empty / negative / non-finite values, several values,
    subnames, nodes that change, iterations with no usable row."""
    rng = np.random.default_rng(seed)
    out = []
    for it in range(iterations):
        for _ in range(int(rng.integers(0, ranks * 5))):
            kind = rng.random()
            values = tuple(float(v) for v in np.round(rng.uniform(0, 50, int(rng.integers(1, 4))), 3))
            if kind < 0.04:
                values = ()
            elif kind < 0.08:
                values = (float(rng.choice([-1.0, float("nan"), float("inf")])),) + values
            out.append(Sample(1.0, "j", str(rng.choice(MIXED_NAMES)), int(rng.integers(0, ranks)), it, values,
                              subname=str(rng.choice(["", "", "mb0", "mb1"])),
                              node=str(rng.choice(["", "n0", "n1", "n2"]))))
    return out


def as_tables(samples: list[Sample], cuts: list[int]):
    """The rows as SAMPLE_SCHEMA tables cut at `cuts` (inside iterations too), each a slice
    of one big table, as a store's answer batches are."""
    from relax_straggler.stores.base import samples_to_table

    whole = samples_to_table(samples)
    bounds = [0, *sorted(set(cuts)), len(samples)]
    return [whole.slice(lo, hi - lo) for lo, hi in zip(bounds, bounds[1:])]


def assert_same_steps(a, b):
    assert [s.step for s in a] == [s.step for s in b]
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.ranks, y.ranks)
        assert x.ranks.dtype == y.ranks.dtype
        np.testing.assert_array_equal(x.ms, y.ms)  # bitwise: NaN where NaN, sums in the same order
        assert (x.p2p_ms is None) == (y.p2p_ms is None)
        if x.p2p_ms is not None:
            np.testing.assert_array_equal(x.p2p_ms, y.p2p_ms)
        np.testing.assert_equal(x.step_ms, y.step_ms)


@pytest.mark.parametrize("seed", range(8))
def test_the_table_path_gives_the_reference_steps_problems_and_counts(seed):
    samples = mixed_rows(seed)
    rng = np.random.default_rng(100 + seed)
    cuts = [int(c) for c in rng.integers(0, max(len(samples), 1), 5)]
    by_rows = RowOracle("j", Problems("store job j"))
    by_tables = RowConverter("j", Problems("store job j"))
    assert_same_steps(list(by_rows.steps(samples)), list(by_tables.table_steps(as_tables(samples, cuts))))
    assert [str(p) for p in by_tables.problems.kept] == [str(p) for p in by_rows.problems.kept]
    assert by_tables.problems.counts == by_rows.problems.counts and by_rows.problems.total > 0
    assert (by_tables.nodes, by_tables.unknown, by_tables.excluded, by_tables.records) == \
        (by_rows.nodes, by_rows.unknown, by_rows.excluded, by_rows.records)


def test_the_table_path_stops_at_the_same_first_problem_when_strict():
    samples = mixed_rows(3)
    messages = []
    for steps in (lambda: RowOracle("j", Problems("store job j", strict=True)).steps(samples),
                  lambda: RowConverter("j", Problems("store job j", strict=True)).table_steps(as_tables(samples, [7, 30]))):
        with pytest.raises(InputError, match="--strict") as info:
            list(steps())
        messages.append(str(info.value))
    assert messages[0] == messages[1]
