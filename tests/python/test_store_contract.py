"""The Store contract (relax_straggler/stores/base.py), run against every store of
tests/python/conftest.py (a store joins by adding its name to STORES there). Job ids
are unique per test, so a shared server needs no cleanup.
"""

from __future__ import annotations

import uuid

import pytest

from relax_straggler.stores.opener import open_store
from relax_straggler.stores.base import STEP_METRIC, Sample, samples_to_table


@pytest.fixture
def store(store_url):
    s = open_store(store_url)
    yield s
    s.close()


@pytest.fixture
def job():
    return f"contract-{uuid.uuid4().hex[:12]}"


T0 = 1_800_000_000.0


def rows(job: str, iterations, ranks: int = 4, ts: float = T0, slow_rank: int = -1) -> list[Sample]:
    out = []
    for it in iterations:
        for r in range(ranks):
            step = 100.0 + r + (50.0 if r == slow_rank else 0.0)
            node = f"node-{r // 2}"
            out.append(Sample(ts + it, job, STEP_METRIC, r, it, (step,), node=node, cluster="c1"))
            out.append(Sample(ts + it, job, "forward-compute", r, it, (30.0 + r,), subname="", node=node, cluster="c1"))
    return out


def test_iterations_are_step_maxima_ascending(store, job):
    store.write(rows(job, [2, 0, 1], slow_rank=3))
    its = store.iterations(job)
    assert [i.iteration for i in its] == [0, 1, 2]
    assert all(i.ranks == 4 for i in its)
    assert [i.step_ms for i in its] == [153.0, 153.0, 153.0]
    assert its[2].last_timestamp == pytest.approx(T0 + 2, abs=1e-3)
    assert [i.iteration for i in store.iterations(job, after_iteration=0)] == [1, 2]


def test_iterations_see_later_writes(store, job):
    store.write(rows(job, [0, 1]))
    assert [i.iteration for i in store.iterations(job)] == [0, 1]
    store.write(rows(job, [2]))
    assert [i.iteration for i in store.iterations(job, after_iteration=1)] == [2]
    assert store.iterations(job, after_iteration=2) == []


def test_since_hides_older_rows(store, job):
    store.write(rows(job, [0, 1], ts=T0 - 1000))
    store.write(rows(job, [2, 3], ts=T0))
    assert [i.iteration for i in store.iterations(job, since=T0)] == [2, 3]
    assert {s.iteration for s in store.samples(job, 0, 10, since=T0)} == {2, 3}
    assert job in store.jobs(since=T0)
    assert job not in store.jobs(since=T0 + 10_000)


def test_samples_in_range_ordered_by_iteration_then_rank(store, job):
    written = rows(job, range(5))
    store.write(written)
    got = list(store.samples(job, 1, 3))
    assert [(s.iteration, s.rank) for s in got] == sorted((s.iteration, s.rank) for s in got)
    assert {s.iteration for s in got} == {1, 2, 3}
    expected = {(s.iteration, s.rank, s.metric_name): s for s in written if 1 <= s.iteration <= 3}
    assert len(got) == len(expected)
    for s in got:
        e = expected[(s.iteration, s.rank, s.metric_name)]
        assert (s.job, s.values, s.node, s.cluster, s.subname) == (e.job, e.values, e.node, e.cluster, e.subname)
        assert s.timestamp == pytest.approx(e.timestamp, abs=1e-3)


def test_write_table_is_write(store, job):
    store.write_table(samples_to_table(rows(job, [0, 1], slow_rank=1)))
    assert [(i.iteration, i.step_ms, i.ranks) for i in store.iterations(job)] == [(0, 151.0, 4), (1, 151.0, 4)]


def test_reopened_store_sees_everything(store_url, job):
    first = open_store(store_url)
    first.write(rows(job, range(3)))
    first.close()
    second = open_store(store_url)
    try:
        assert [i.iteration for i in second.iterations(job)] == [0, 1, 2]
        assert len(list(second.samples(job, 0, 2))) == 3 * 4 * 2
    finally:
        second.close()


@pytest.mark.parametrize("field, bad", [("rank", -1), ("iteration", -5), ("values", ()),
                                        ("values", (float("nan"),)), ("metric_name", ""), ("job", ""),
                                        ("timestamp", float("inf")), ("timestamp", 2.0**32)])
def test_bad_rows_are_refused_naming_the_field(store, job, field, bad):
    good = rows(job, [0])[0]
    kwargs = {f: getattr(good, f) for f in ("timestamp", "job", "metric_name", "rank", "iteration", "values")}
    kwargs[field] = bad
    name = "metric_values" if field == "values" else field
    with pytest.raises(ValueError, match=f"{name}|{field}"):
        store.write([good, Sample(**kwargs)])


def test_unknown_job_is_empty(store, job):
    assert store.iterations(job) == []
    assert list(store.samples(job, 0, 100)) == []
    assert job not in store.jobs()


def test_ping(store):
    store.ping()


def test_the_end_of_run_row_is_a_row_every_store_takes(store, job):
    from relax_straggler.stores import end_rows

    store.write(rows(job, [0, 1]))
    store.write_table(end_rows.end_table(job, 1, 2, "uninstall", T0 + 5, "node-0"))
    assert [i.iteration for i in store.iterations(job)] == [0, 1]  # not an iteration
    end = end_rows.latest_end(store.samples(job, 0, 1))
    assert (end["reason"], end["last_step"], end["steps"]) == ("uninstall", 1, 2)
