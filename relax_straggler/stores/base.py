"""The metrics store's row and interface, shared by the sink, ingest, the feed and the monitor.

One row is one Megatron timer of one rank at one iteration, in the
``megatron_metrics`` layout Megatron timer stores use:

    timestamp  DateTime64 / float  s since the epoch, when the row was produced
    job        String              job id
    metric_name String             Megatron timer name (forward-compute, interval-time, ...)
    subname    String              qualifier ('' when none; for example a microbatch or the
                                   reduction 'max' of a minmax log)
    rank       Int32               global rank
    iteration  Int64               training iteration
    node       String              host name of the rank
    cluster    String              cluster name ('' when unknown)
    metric_values Array(Float64)   the timer's values, ms (one value per row in practice)

Stores are opened from a URL by relax_straggler.stores.opener.open_store:
``file://DIR`` (embedded, the default) or ``clickhouse://HOST:PORT/DB[?table=NAME]`` (a
ClickHouse server). Reads come as Samples (``samples``) or as SAMPLE_SCHEMA tables
(``table``, ``tables``: no Python object per row, what the readers of long ranges use).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Iterator, Protocol, Sequence

import pyarrow as pa


# The timer whose value is a rank's whole iteration (Megatron's interval-time, ms).
STEP_METRIC = "interval-time"
# Job ids the monitor's API serves: what Megatron / Slurm job names use; never a path. Stores
# take any non-empty id; the feed and ingest refuse the others, which no API call could reach.
JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}$"


def check_job_id(job: str) -> None:
    """Raises ValueError when the monitor's API cannot serve `job` (JOB_ID_PATTERN)."""
    if not re.fullmatch(JOB_ID_PATTERN, job):  # fullmatch: no trailing newline either
        raise ValueError(f"job id {job!r} cannot be registered with the monitor: use letters, digits and . _ : @ + -, "
                         "first a letter or digit, at most 128")


class StoreError(Exception):
    """The store cannot be reached or rejected a request; str() says which store and why.
    permanent: repeating the request cannot help (e.g. a user without the right to write)."""

    permanent = False


@dataclass(frozen=True)
class Sample:
    """One row of megatron_metrics (see the module docstring for units)."""

    timestamp: float
    job: str
    metric_name: str
    rank: int
    iteration: int
    values: tuple[float, ...]
    subname: str = ""
    node: str = ""
    cluster: str = ""


@dataclass(frozen=True)
class IterationTime:
    """One iteration of a job: step_ms = max over ranks of STEP_METRIC's first value, ms;
    last_timestamp = newest row of that iteration, s since the epoch; ranks = how many
    ranks reported STEP_METRIC."""

    iteration: int
    step_ms: float
    last_timestamp: float
    ranks: int


# The columnar form of a batch of rows (Store.write_table): one column per Sample field,
# metric_values as a list of float64 (ms). Writers with many rows per call (the feed, the
# benchmark's load generator, a metrics rank gathering 1,024 ranks) build this directly
# instead of one Sample object per row.
SAMPLE_SCHEMA = pa.schema([
    ("timestamp", pa.float64()),
    ("job", pa.string()),
    ("metric_name", pa.string()),
    ("subname", pa.string()),
    ("rank", pa.int32()),
    ("iteration", pa.int64()),
    ("node", pa.string()),
    ("cluster", pa.string()),
    ("metric_values", pa.list_(pa.float64())),
])


def samples_to_table(samples: Sequence[Sample]) -> pa.Table:
    """The rows as a SAMPLE_SCHEMA table (len(samples) rows)."""
    return pa.table({
        "timestamp": [s.timestamp for s in samples],
        "job": [s.job for s in samples],
        "metric_name": [s.metric_name for s in samples],
        "subname": [s.subname for s in samples],
        "rank": [s.rank for s in samples],
        "iteration": [s.iteration for s in samples],
        "node": [s.node for s in samples],
        "cluster": [s.cluster for s in samples],
        "metric_values": [list(s.values) for s in samples],
    }, schema=SAMPLE_SCHEMA)


def table_to_samples(table: pa.Table) -> Iterable[Sample]:
    """The rows of a SAMPLE_SCHEMA table as Samples, in table order."""
    cols = table.select(SAMPLE_SCHEMA.names).to_pydict()
    for ts, job, name, sub, rank, it, node, cluster, values in zip(*cols.values()):
        yield Sample(timestamp=ts, job=job, metric_name=name, rank=rank, iteration=it, values=tuple(values),
                     subname=sub, node=node, cluster=cluster)


class Store(Protocol):
    """What the sink, ingest, the feed and the monitor need from a store. Every method raises
    StoreError when the store is unreachable; callers retry (the monitor reconnects)."""

    url: str

    def write(self, samples: Sequence[Sample]) -> None:
        """Appends rows (one batch; atomic per call where the backend allows)."""
        ...

    def write_table(self, table: pa.Table) -> None:
        """Appends the rows of a SAMPLE_SCHEMA table (the columnar form of write(); same
        semantics). Raises ValueError when the table does not have SAMPLE_SCHEMA's columns."""
        ...

    def iterations(self, job: str, after_iteration: int = -1, since: float = 0.0) -> list[IterationTime]:
        """Iterations of `job` newer than `after_iteration` whose rows are not older than
        `since` (s since the epoch), ascending."""
        ...

    def samples(self, job: str, first_iteration: int, last_iteration: int, since: float = 0.0) -> Iterator[Sample]:
        """Every row of `job` with first_iteration <= iteration <= last_iteration and
        timestamp >= since, ordered by iteration then rank."""
        ...

    def table(self, job: str, first_iteration: int, last_iteration: int, since: float = 0.0) -> pa.Table:
        """The rows of samples() as one SAMPLE_SCHEMA table, in the same order (the range is
        held in memory; no Python object per row)."""
        ...

    def tables(self, job: str, first_iteration: int, last_iteration: int, since: float = 0.0) -> Iterator[pa.Table]:
        """The rows of samples() as SAMPLE_SCHEMA tables, in the same order, streamed where
        the store can (a table may end inside an iteration; readers of long ranges use this)."""
        ...

    def jobs(self, since: float = 0.0) -> list[str]:
        """Job ids with rows not older than `since`."""
        ...

    def job_problems(self, job: str) -> list[str]:
        """Damage found in `job`'s stored data that reads skip (messages naming the file and
        line or byte); [] when none, or when the store cannot be damaged that way."""
        ...

    def ping(self) -> None:
        """Returns when the store answers; raises StoreError otherwise."""
        ...

    def close(self) -> None:
        ...
