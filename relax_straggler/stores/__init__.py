"""Metrics stores: per-rank Megatron timer rows (``megatron_metrics``) written by the live
sink, ingest and the feed, read by the monitor and ``analyze``.

    from relax_straggler.stores import open_store, parse_store_url
    store = open_store("file:///var/lib/straggler")      # or clickhouse://HOST:PORT/DB
    store.write_table(table)                             # SAMPLE_SCHEMA rows
    for it in store.iterations("job-7"): ...

base: the row (Sample), its columnar schema and the Store interface; url: the one URL parser;
opener: open_store; file, clickhouse: the two implementations. See docs/STORES.md.
"""

from relax_straggler.stores.base import STEP_METRIC, IterationTime, Sample, Store, StoreError, check_job_id
from relax_straggler.stores.opener import open_store
from relax_straggler.stores.url import StoreURL, parse_store_url, parse_writer_url

__all__ = ["STEP_METRIC", "IterationTime", "Sample", "Store", "StoreError", "StoreURL", "check_job_id",
           "open_store", "parse_store_url", "parse_writer_url"]
