"""The live store sink (relax_straggler/reporters/store_sink.py) against a real ClickHouse server."""

from __future__ import annotations

import itertools
import logging
import math

import numpy as np
import pytest

import relax_straggler
from conftest import ClickHouseServer, free_port, require_chdb, wait_for
from relax_straggler import StragglerConfig
from relax_straggler.common.stages import STAGE_IDS
from relax_straggler.judge.report import Report
from relax_straggler.readers.metrics_rows import StoreSource
from relax_straggler.reporters.store_sink import StoreSink, report_rows
from relax_straggler.stores.base import STEP_METRIC, table_to_samples
from relax_straggler.stores.clickhouse import ClickHouseStore
from relax_straggler.stores.url import parse_writer_url
from test_install import make, train

_databases = itertools.count()


def fake_report(step: int, ranks: int = 4, slow_rank: int = -1) -> Report:
    """forward, backward, attention, communication/send; rank 1 ran no communication/send."""
    stages = ("forward", "backward", "attention", "communication/send")
    ms = np.array([[10.0 + r, 20.0, 5.0, 1.0] for r in range(ranks)])
    ms[1, 3] = np.nan
    if slow_rank >= 0:
        ms[slow_rank, 0] += 30.0
    return Report(step=step, stages=stages, device_ms=ms, judged_ms=ms, tokens=None, stragglers={},
                  likely_bottleneck=None, top_ranks={}, hints="")


@pytest.fixture
def ch_url(clickhouse_server):
    return clickhouse_server.url(f"test_sink_{next(_databases)}")


def test_report_rows_use_megatron_names_and_a_step_row_per_rank():
    t = report_rows(fake_report(7), "job-a", 1_790_000_000.5, ["n0", "n0", "n1", "n1"], cluster="c")
    rows = {(s.rank, s.metric_name): s for s in table_to_samples(t)}
    assert len(rows) == t.num_rows == 4 * 3 + 3 + 4  # rank 1 has no send row; one interval-time per rank
    assert rows[(2, "forward-compute")].values == (12.0,)
    assert rows[(2, "straggler/attention")].values == (5.0,)
    assert rows[(0, "straggler/communication/send")].values == (1.0,)
    assert (1, "straggler/communication/send") not in rows
    assert rows[(3, STEP_METRIC)].values == (13.0 + 20.0,)  # core stages only: forward + backward
    s = rows[(3, "backward-compute")]
    assert (s.job, s.iteration, s.node, s.cluster, s.subname, s.timestamp) == ("job-a", 7, "n1", "c", "", 1_790_000_000.5)


def test_sink_url_and_flag_are_checked():
    assert (parse_writer_url("clickhouse://h:1/db?job=run-7").url, parse_writer_url("clickhouse://h:1/db?job=run-7").job) \
        == ("clickhouse://h:1/db", "run-7")
    assert (parse_writer_url("file:///tmp/s").url, parse_writer_url("file:///tmp/s").job) == ("file:///tmp/s", None)
    with pytest.raises(ValueError, match="unknown parameter"):
        parse_writer_url("clickhouse://h:1/db?jobs=x")
    with pytest.raises(ValueError, match="--straggler-store"):
        StragglerConfig(enabled=True, store_url="http://h:1/")
    with pytest.raises(ValueError, match="'my run' cannot be registered with the monitor"):  # no API call reaches it
        parse_writer_url("file:///tmp/s?job=my%20run")


def test_training_writes_every_sampled_step_readable_by_the_analysis(ch_url):
    model, optimizer = make()
    analyzer = relax_straggler.install(model, optimizer, config=StragglerConfig(
        enabled=True, interval=1, warmup_steps=0, store_url=f"{ch_url}?job=train-1"))
    train(model, optimizer, analyzer, steps=6)
    analyzer.uninstall()  # drains the report pipeline, then flushes the sink
    counters = analyzer.counters()
    assert counters["store_failed_writes"] == 0 and counters["store_dropped_rows"] == 0
    store = ClickHouseStore(ch_url)
    try:
        its = store.iterations("train-1")
        assert [(i.iteration, i.ranks) for i in its] == [(s, 1) for s in range(6)]
        rows = list(store.samples("train-1", 0, 5))
        assert len(rows) == counters["store_written_rows"]
        names = {r.metric_name for r in rows}
        assert {"forward-compute", "backward-compute", "optimizer", "batch-generator", STEP_METRIC} <= names
        by_step = {}
        for r in rows:
            by_step.setdefault(r.iteration, {})[r.metric_name] = r.values[0]
        for i in its:  # interval-time is the sum of the core stages the rank ran
            core = [v for k, v in by_step[i.iteration].items() if k != STEP_METRIC and not k.startswith("straggler/")
                    and k not in ("grads-all-reduce", "grads-reduce-scatter", "params-all-gather")]
            assert i.step_ms == pytest.approx(sum(core))
        source = StoreSource(store, "train-1", 0, 5)
        steps = list(source.steps())
        assert [s.step for s in steps] == list(range(6)) and source.problems.total == 0
        assert all(math.isfinite(s.ms[0, STAGE_IDS["forward"]]) for s in steps)
    finally:
        store.close()


def test_a_dead_store_never_reaches_training(caplog):
    dead = f"clickhouse://127.0.0.1:{free_port()}/nothing"  # nothing listens there
    model, optimizer = make()
    analyzer = relax_straggler.install(model, optimizer, config=StragglerConfig(
        enabled=True, interval=1, warmup_steps=0, store_url=f"{dead}?job=lost"))
    with caplog.at_level(logging.WARNING, logger="relax_straggler.reporters.store_sink"):
        losses = train(model, optimizer, analyzer, steps=5)
        wait_for(lambda: analyzer.counters()["store_failed_writes"] >= 1, what="a failed write")
        analyzer._store_sink.close(timeout_s=0.5)  # bounded: what cannot be written is dropped
    assert len(losses) == 5 and all(math.isfinite(x) for x in losses)
    counters = analyzer.counters()
    assert counters["store_written_rows"] == 0 and counters["store_dropped_rows"] > 0
    assert any("training continues" in r.getMessage() for r in caplog.records)
    analyzer.uninstall()


def test_failures_are_buffered_bounded_counted_and_logged_rate_limited(caplog):
    dead = f"clickhouse://127.0.0.1:{free_port()}/nothing"
    rows_per_report = report_rows(fake_report(0), "j", 0.0, [""] * 4).num_rows
    sink = StoreSink(dead, "bounded", flush_interval_s=0.02, batch_rows=1, max_buffered_rows=3 * rows_per_report,
                     log_every_s=3600)
    with caplog.at_level(logging.WARNING, logger="relax_straggler.reporters.store_sink"):
        for step in range(10):
            sink.write(fake_report(step))  # never raises, never blocks on the store
        wait_for(lambda: sink.failed_writes >= 3, what="three failed writes")
        c = sink.counters()
        assert c["store_buffered_rows"] <= 3 * rows_per_report
        assert c["store_buffered_rows"] + c["store_dropped_rows"] == 10 * rows_per_report  # nothing unaccounted
        assert not sink.flush(timeout_s=0.2)
        sink.close(timeout_s=0.2)
    assert sink.counters()["store_dropped_rows"] == 10 * rows_per_report
    failures = [r for r in caplog.records if "failed write" in r.getMessage()]
    assert len(failures) == 1, [r.getMessage() for r in failures]  # one message per log_every_s


def test_rows_survive_a_store_restart(tmp_path):
    require_chdb()
    server = ClickHouseServer(tmp_path, free_port())
    server.start()
    sink = StoreSink(server.url("restart"), "survivor", flush_interval_s=0.05)
    store = ClickHouseStore(server.url("restart"))
    try:
        for step in range(3):
            sink.write(fake_report(step))
        assert sink.flush(timeout_s=30)
        server.stop()
        for step in range(3, 8):
            sink.write(fake_report(step, slow_rank=2))
        wait_for(lambda: sink.failed_writes >= 1, what="a failed write while the server is down")
        server.start()
        assert sink.flush(timeout_s=60), sink.counters()
        assert sink.counters()["store_dropped_rows"] == 0
        its = store.iterations("survivor")
        assert [i.iteration for i in its] == list(range(8))
        assert [i.step_ms for i in its] == [33.0] * 3 + [42.0 + 20.0] * 5  # rank 2 slow from step 3
    finally:
        sink.close(timeout_s=5)
        store.close()
        server.stop()


def test_the_embedded_store_takes_the_same_rows(tmp_path):
    sink = StoreSink(f"file://{tmp_path}/store?job=embedded", flush_interval_s=0.05)
    for step in range(3):
        sink.write(fake_report(step, slow_rank=0))
    assert sink.flush(timeout_s=30)
    sink.close()
    from relax_straggler.stores.opener import open_store

    store = open_store(f"file://{tmp_path}/store")
    try:
        assert [(i.iteration, i.step_ms, i.ranks) for i in store.iterations("embedded")] == [(s, 60.0, 4) for s in range(3)]
        source = StoreSource(store, "embedded", 0, 2)
        steps = list(source.steps())
        assert source.problems.total == 0 and source.unknown == {}  # straggler/<stage> names read back
        assert steps[0].ms[:, STAGE_IDS["attention"]].tolist() == [5.0] * 4
        assert np.isnan(steps[0].ms[1, STAGE_IDS["communication/send"]])
    finally:
        store.close()


def test_the_runs_own_sink_writes_the_end_row_at_close_another_does_not(tmp_path):
    from relax_straggler.stores import end_rows
    from relax_straggler.stores.opener import open_store

    ended = StoreSink(f"file://{tmp_path}/store?job=ended", flush_interval_s=0.05, nodes=["node-0"] * 4,
                      marks_end=True)
    cut = StoreSink(f"file://{tmp_path}/store?job=cut", flush_interval_s=0.05)
    for step in (10, 11, 12):
        ended.write(fake_report(step))
        cut.write(fake_report(step))
    ended.close()
    cut.close()  # a sink opened for one hang answer
    store = open_store(f"file://{tmp_path}/store")
    try:
        end = end_rows.latest_end(store.samples("ended", 0, 20))
        assert (end["reason"], end["last_step"], end["steps"]) == ("uninstall", 12, 3)
        assert [s.node for s in store.samples("ended", 12, 12) if s.metric_name == "straggler/end"] == ["node-0"]
        assert end_rows.latest_end(store.samples("cut", 0, 20)) is None
    finally:
        store.close()


def test_uninstall_ends_the_run_in_the_store(tmp_path):
    from relax_straggler.stores import end_rows
    from relax_straggler.stores.opener import open_store

    model, optimizer = make()
    analyzer = relax_straggler.install(model, optimizer, config=StragglerConfig(
        enabled=True, interval=1, warmup_steps=0, store_url=f"file://{tmp_path}/store?job=trained"))
    train(model, optimizer, analyzer, steps=4)
    analyzer.uninstall()
    store = open_store(f"file://{tmp_path}/store")
    try:
        last = store.iterations("trained")[-1].iteration
        end = end_rows.latest_end(store.samples("trained", 0, last))
        assert end is not None and end["reason"] == "uninstall" and end["last_step"] == last
    finally:
        store.close()
