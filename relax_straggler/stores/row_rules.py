"""The rules every store holds a row to, one definition for the file and the ClickHouse
store: job and metric_name non-empty strings; subname, node, cluster strings; rank in
[0, 2^31); iteration >= 0; timestamp a finite time in [0, MAX_TIMESTAMP] s since the epoch
(ClickHouse's DateTime is a UInt32: before 2106); metric_values a non-empty list of finite
numbers (ms). A row one store takes, the other takes too, so a job moves between them.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

MAX_TIMESTAMP = 2**32 - 1


def check_table(table: pa.Table) -> None:
    """The rules over a SAMPLE_SCHEMA table, vectorized (nulls are bad values). Raises
    ValueError naming the first bad row and field."""
    values = table.column("metric_values")
    ts = table.column("timestamp")
    flat = pc.list_flatten(values)
    bad_value_rows = pc.list_parent_indices(values).filter(pc.invert(pc.is_finite(flat)).fill_null(True))

    def empty(name: str) -> pa.ChunkedArray:
        return pc.fill_null(pc.equal(pc.utf8_length(table.column(name)), 0), True)

    checks = [
        ("job", "must be a non-empty string", empty("job")),
        ("metric_name", "must be a non-empty string", empty("metric_name")),
        ("rank", "must be an integer in [0, 2^31)", pc.fill_null(pc.less(table.column("rank"), 0), True)),
        ("iteration", "must be an integer >= 0", pc.fill_null(pc.less(table.column("iteration"), 0), True)),
        ("timestamp", "must be a finite time in s since the epoch, before 2106",
         pc.fill_null(pc.invert(pc.and_(pc.is_finite(ts), pc.and_(pc.greater_equal(ts, 0),
                                                                  pc.less_equal(ts, MAX_TIMESTAMP)))), True)),
        ("metric_values", "must be a non-empty list of ms", pc.fill_null(pc.equal(pc.list_value_length(values), 0),
                                                                         True)),
    ]
    checks += [(name, "must be a string", pc.is_null(table.column(name))) for name in ("subname", "node", "cluster")]
    if len(bad_value_rows):
        checks.append(("metric_values", "must be finite numbers (ms)",
                       pc.is_in(pa.array(range(table.num_rows)), value_set=bad_value_rows)))
    for name, why, bad in checks:
        hits = pc.indices_nonzero(bad)
        if len(hits):
            i = hits[0].as_py()
            raise ValueError(f"row {i} (job {table.column('job')[i].as_py()!r}, "
                             f"rank {table.column('rank')[i].as_py()}, "
                             f"iteration {table.column('iteration')[i].as_py()}): {name} {why}, "
                             f"got {table.column(name)[i].as_py()!r}")
