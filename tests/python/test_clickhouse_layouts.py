"""The table layouts ClickHouseStore reads and writes as it finds them: its own table and
the Megatron metrics layout (job_id, value, attributes JSON / Object / String)."""

from __future__ import annotations

import itertools
import math

import httpx
import pytest

from relax_straggler.readers.store_input import open_store_input
from relax_straggler.stores.base import STEP_METRIC, Sample, StoreError
from relax_straggler.stores.clickhouse import ClickHouseStore

_databases = itertools.count()
T0 = 1_790_000_000.0

MEGATRON = ("CREATE TABLE {db}.megatron_metrics (timestamp DateTime, job_id String, metric_name String, "
            "iteration UInt64, value Float64, attributes {attributes}) ENGINE = MergeTree "
            "PARTITION BY toDate(timestamp) ORDER BY (job_id, metric_name, iteration)")


def admin(engine, sql: str) -> str:
    response = httpx.post(f"http://127.0.0.1:{engine.port}/", content=sql.encode())
    assert response.status_code == 200, response.text
    return response.text


@pytest.fixture
def db(clickhouse_server):
    """(server, database) with the database created and empty."""
    name = f"test_layout_{next(_databases)}"
    admin(clickhouse_server, f"CREATE DATABASE {name}")
    return clickhouse_server, name


def rows(job: str, iterations: range, ranks: int, t0: float = T0) -> list[Sample]:
    out = []
    for it in iterations:
        for r in range(ranks):
            out.append(Sample(t0 + it, job, STEP_METRIC, r, it, (100.0 + r,), node=f'n"{r}\\', cluster="c1"))
            out.append(Sample(t0 + it, job, "forward-compute", r, it, (40.0 + r, 2.5), subname="mb\t1"))
    return out


def by_key(samples):
    return sorted(samples, key=lambda s: (s.iteration, s.rank, s.metric_name, s.subname))


def test_own_table_is_datetime64_with_day_partitions(db):
    engine, name = db
    store = ClickHouseStore(engine.url(name))
    store.write(rows("j", range(2), ranks=2))
    layout = store.layout()
    assert layout.datetime64
    ddl = admin(engine, f"SHOW CREATE TABLE {name}.megatron_metrics")
    assert "PARTITION BY toYYYYMMDD(timestamp)" in ddl
    assert by_key(store.samples("j", 0, 9)) == by_key(rows("j", range(2), ranks=2))
    store.close()


@pytest.mark.parametrize("attributes", ["String", "JSON"])
def test_the_megatron_layout_is_read_and_written_as_it_is(db, attributes):
    engine, name = db
    admin(engine, MEGATRON.format(db=name, attributes=attributes))
    store = ClickHouseStore(engine.url(name))
    written = rows("mega-1", range(3), ranks=2)
    store.write(written)  # the table is kept: no second CREATE
    assert by_key(store.samples("mega-1", 0, 9)) == by_key(written)  # whole seconds: DateTime
    its = store.iterations("mega-1")
    assert [(i.iteration, i.step_ms, i.ranks) for i in its] == [(0, 101.0, 2), (1, 101.0, 2), (2, 101.0, 2)]
    assert store.jobs() == ["mega-1"]
    # A row another writer put there: rank and node as attributes, one value.
    attrs = '{"rank": 3, "node": "host-3"}'
    admin(engine, f"INSERT INTO {name}.megatron_metrics VALUES ({int(T0) + 9}, 'mega-1', '{STEP_METRIC}', 9, 7.5, "
                  f"'{attrs}')")
    [row] = store.samples("mega-1", 9, 9)
    assert (row.rank, row.node, row.values, row.subname, row.timestamp) == (3, "host-3", (7.5,), "", T0 + 9)
    store.close()


def test_a_lost_megatron_table_is_not_created_again_in_another_layout(db):
    # Its other writers (a Megatron collector) could not write the store's own layout: the
    # store says so and writes again once the table is back, in its layout.
    engine, name = db
    admin(engine, MEGATRON.format(db=name, attributes="String"))
    store = ClickHouseStore(engine.url(name))
    store.write(rows("mega-2", range(1), ranks=2))
    admin(engine, f"DROP TABLE {name}.megatron_metrics")
    with pytest.raises(StoreError, match="megatron_metrics.*is gone; the store does not create it again in its own layout"):
        store.write(rows("mega-2", range(1, 2), ranks=2))
    assert "job_id" not in admin(engine, f"SELECT name FROM system.columns WHERE database = '{name}'")
    admin(engine, MEGATRON.format(db=name, attributes="String"))
    store.write(rows("mega-2", range(2, 3), ranks=2))
    assert [i.iteration for i in store.iterations("mega-2")] == [2]
    assert "job_id" in admin(engine, f"SELECT name FROM system.columns WHERE database = '{name}'")
    store.close()


def test_the_analysis_reader_reads_the_megatron_layout(db):
    engine, name = db
    admin(engine, MEGATRON.format(db=name, attributes="String"))
    ClickHouseStore(engine.url(name)).write(rows("mega-2", range(4), ranks=2))
    source = open_store_input(engine.url(name) + "?job=mega-2")
    steps = list(source.steps())
    assert len(steps) == 4


def test_a_table_without_a_place_for_rank_is_refused_for_writes_and_read_as_rank_0(db):
    engine, name = db
    admin(engine, f"CREATE TABLE {name}.megatron_metrics (timestamp DateTime, job_id String, metric_name String, "
                  "iteration UInt64, value Float64) ENGINE = MergeTree ORDER BY (job_id, metric_name, iteration)")
    store = ClickHouseStore(engine.url(name))
    with pytest.raises(StoreError, match=r"no column for rank, subname, node, cluster"):
        store.write(rows("j", range(1), ranks=1))
    admin(engine, f"INSERT INTO {name}.megatron_metrics VALUES ({int(T0)}, 'j', '{STEP_METRIC}', 4, 12.0)")
    assert [(s.rank, s.iteration, s.values) for s in store.samples("j", 0, 9)] == [(0, 4, (12.0,))]
    store.close()


def test_a_table_that_is_no_metrics_table_is_named(db):
    engine, name = db
    admin(engine, f"CREATE TABLE {name}.megatron_metrics (x UInt8) ENGINE = MergeTree ORDER BY x")
    with pytest.raises(StoreError, match=r"no column for timestamp, job, metric_name, iteration, values"):
        ClickHouseStore(engine.url(name)).iterations("j")


def test_a_large_answer_arriving_in_many_chunks_is_read_whole(db):
    engine, name = db
    store = ClickHouseStore(engine.url(name))
    written = [Sample(T0 + it, "big", STEP_METRIC, r, it, (float(r),), node=f"node-{r // 8}")
               for it in range(40) for r in range(512)]  # 20,480 rows: megabytes, many HTTP chunks
    store.write(written)
    assert sum(1 for _ in store.samples("big", 0, 39)) == len(written)
    store.close()


def test_the_monitor_names_the_straggler_of_a_megatron_layout_table(db, tmp_path):
    from conftest import wait_for
    from relax_straggler.common.topology import Topology
    from relax_straggler.monitor.feed import Injection, Synthetic, feed
    from relax_straggler.monitor.service import Monitor, MonitorConfig

    engine, name = db
    admin(engine, MEGATRON.format(db=name, attributes="JSON"))
    monitor = Monitor(MonitorConfig(engine.url(name), check_interval_s=0.1, state_path=str(tmp_path / "state.json")))
    try:
        monitor.register("mega-job", Topology(dp=16, pp=1, ranks_per_node=4))
        store = ClickHouseStore(engine.url(name))
        feed(Synthetic(ranks=16, iterations=50, step_ms=100, seed=3).steps(), store, "mega-job", speed=1e9,
             injections=[Injection.parse("5:forward:80:40")], ranks_per_node=4)
        store.close()
        monitor.poll_once()
        view = wait_for(lambda: (v := monitor.view("mega-job"))["status"] == "detected" and v, what="detected")
        assert view["slowdown_check"]["straggler_prediction"] == {"straggler_rank": 5, "straggler_node": "node-1"}
    finally:
        monitor.stop()


def test_analyze_reads_a_megatron_table_filled_as_a_megatron_collector_fills_it(db, capsys):
    # The Megatron metrics table as it is created (JSON attributes, one partition per second)
    # and filled by a collector that knows nothing of the store: one JSONEachRow insert per
    # iteration, a row per timer and rank, rank and node as attribute keys.
    import json

    from relax_straggler.cli import main as cli_main

    engine, name = db
    admin(engine, MEGATRON.format(db=name, attributes="JSON").replace("PARTITION BY toDate(timestamp)",
                                                                         "PARTITION BY timestamp"))
    timers = {"forward-compute": 40.0, "backward-compute": 80.0, "optimizer": 5.0, "batch-generator": 1.0}
    for it in range(30):
        lines = []
        for rank in range(8):
            ms = dict(timers)
            if rank == 5 and it >= 10:
                ms["forward-compute"] *= 1.6
            ms = {k: v * (1 + 0.003 * ((rank * 7 + it * 3) % 5)) for k, v in ms.items()}
            ms["interval-time"] = sum(ms.values())
            for timer, value in ms.items():
                lines.append(json.dumps({"timestamp": int(T0) + it, "job_id": "mt-run", "metric_name": timer,
                                         "iteration": it, "value": round(value, 3),
                                         "attributes": {"rank": rank, "node": f"node-{rank // 4}"}}))
        response = httpx.post(f"http://127.0.0.1:{engine.port}/",
                              params={"query": f"INSERT INTO {name}.megatron_metrics FORMAT JSONEachRow"},
                              content="\n".join(lines).encode())
        assert response.status_code == 200, response.text
    assert cli_main(["analyze", f"{engine.url(name)}?job=mt-run", "--dp", "8", "--format", "json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert [a["ranks"] for a in summary["anomalies"]] == [[5]], summary["anomalies"]
    [anomaly] = summary["anomalies"]
    assert (anomaly["stages"], anomaly["steps_flagged"], anomaly["details"][0]["first_step"]) == (["forward"], 20, 10)


def test_a_column_dropped_and_added_back_is_written_again_by_the_same_store(db):
    engine, name = db
    store = ClickHouseStore(engine.url(name))
    store.write(rows("j", range(1), ranks=1))
    admin(engine, f"ALTER TABLE {name}.megatron_metrics DROP COLUMN node")
    with pytest.raises(StoreError, match="no column for node"):
        store.write(rows("j", range(1, 2), ranks=1))
    admin(engine, f"ALTER TABLE {name}.megatron_metrics ADD COLUMN node String")
    store.write(rows("j", range(2, 3), ranks=1))  # the columns are read again before a refusal
    assert [i.iteration for i in store.iterations("j")] == [0, 2]
    store.close()


def test_rows_a_megatron_table_cannot_keep_whole_are_refused_naming_the_field(db):
    engine, name = db
    admin(engine, f"CREATE TABLE {name}.megatron_metrics (timestamp DateTime, job_id String, metric_name String, "
                  "iteration UInt32, value Float64, rank UInt16, subname String, node String, cluster String) "
                  "ENGINE = MergeTree ORDER BY (job_id, metric_name, iteration)")
    store = ClickHouseStore(engine.url(name))
    with pytest.raises(StoreError, match=r"keeps one value per row .*row 0 has 3 values"):
        store.write([Sample(T0, "j", STEP_METRIC, 1, 0, (1.0, 2.0, 3.0))])
    with pytest.raises(StoreError, match=r"column rank is UInt16, which cannot hold rank 70000 of row 1"):
        store.write([Sample(T0, "j", STEP_METRIC, 1, 0, (1.0,)), Sample(T0, "j", STEP_METRIC, 70000, 0, (1.0,))])
    with pytest.raises(StoreError, match=r"column iteration is UInt32, which cannot hold iteration 5000000000"):
        store.write([Sample(T0, "j", STEP_METRIC, 1, 5_000_000_000, (1.0,))])
    assert store.jobs() == []  # nothing of a refused batch is written
    store.write([Sample(T0, "j", STEP_METRIC, 65535, 2**32 - 1, (1.0,))])  # the largest values that fit
    assert [(s.rank, s.iteration) for s in store.samples("j", 0, 2**32)] == [(65535, 2**32 - 1)]
    store.close()


def test_nullable_columns_of_a_megatron_table_read_null_as_not_measured(db):
    engine, name = db
    admin(engine, MEGATRON.format(db=name, attributes="Nullable(String)").replace("value Float64",
                                                                                 "value Nullable(Float64)"))
    admin(engine, f"INSERT INTO {name}.megatron_metrics VALUES ({int(T0)}, 'j', '{STEP_METRIC}', 1, 7.5, "
                  f"'{{\"rank\": 2}}'), ({int(T0)}, 'j', '{STEP_METRIC}', 2, NULL, NULL)")
    store = ClickHouseStore(engine.url(name))
    first, second = store.samples("j", 0, 9)
    assert (first.rank, first.values) == (2, (7.5,))
    assert second.rank == 0 and math.isnan(second.values[0])  # NULL: not measured
    its = store.iterations("j")
    assert its[0].step_ms == 7.5 and math.isnan(its[1].step_ms)
    store.close()


def test_a_table_recreated_with_other_column_types_is_read_again(db):
    engine, name = db
    store = ClickHouseStore(engine.url(name))
    store.write(rows("j", range(2), ranks=1))
    admin(engine, f"DROP TABLE {name}.megatron_metrics")
    admin(engine, MEGATRON.format(db=name, attributes="String"))  # whole seconds now: DateTime
    admin(engine, f"INSERT INTO {name}.megatron_metrics VALUES ({int(T0)}, 'j', '{STEP_METRIC}', 5, 9.0, "
                  f"'{{\"rank\": 1}}')")
    assert [(s.iteration, s.rank, s.values) for s in store.samples("j", 0, 9)] == [(5, 1, (9.0,))]
    assert [i.iteration for i in store.iterations("j")] == [5]
    store.close()
