"""One rank per worker for the what-if replay (relax_straggler.whatif.loader.one_rank_per_worker):
where a worker (dp_rank, stage) has several tensor-parallel ranks, the slowest-computing one
is kept; with one rank each, or none known, the records are returned as they are."""

import numpy as np

from relax_straggler.readers import OpRecords
from relax_straggler.whatif import complete, loader
from relax_straggler.whatif.loader import one_rank_per_worker

NAMES = ["forward-compute", "backward-compute", "forward-send"]


def records(dp_rank, stage, rank, optype, duration) -> OpRecords:
    n = len(dp_rank)
    ints = lambda v, t=np.int32: np.asarray(v, dtype=t)  # noqa: E731
    return OpRecords(dp_rank=ints(dp_rank), stage=ints(stage), step=np.zeros(n, np.int64), optype=ints(optype),
                     start=np.arange(n, dtype=np.float64), duration=np.asarray(duration, np.float64),
                     seq_id=np.arange(n, dtype=np.int32), microbatch=np.full(n, -1, np.int32),
                     chunk=np.zeros(n, np.int32), optype_names=NAMES, rank=ints(rank, np.int64))


def test_a_worker_with_two_tensor_parallel_ranks_keeps_the_slower_computing_one():
    # Worker (0, 0) runs ranks 0 and 1; rank 1 computes 3 s in all, rank 0 2 s (its long
    # send is no compute). Worker (1, 0) runs rank 2 alone.
    rec = records(dp_rank=[0, 0, 0, 0, 0, 1], stage=[0] * 6, rank=[0, 0, 1, 1, 0, 2],
                  optype=[0, 1, 0, 1, 2, 0], duration=[1.0, 1.0, 1.5, 1.5, 9.0, 1.0])
    kept = one_rank_per_worker(rec)
    assert kept.rank.tolist() == [1, 1, 2]
    assert kept.duration.tolist() == [1.5, 1.5, 1.0]


def test_one_rank_each_or_none_known_leaves_the_records_as_they_are():
    one_each = records(dp_rank=[0, 1, 0, 1], stage=[0, 0, 1, 1], rank=[0, 1, 2, 3], optype=[0] * 4, duration=[1.0] * 4)
    assert one_rank_per_worker(one_each) is one_each
    unknown = records(dp_rank=[0, 1, 0, 1], stage=[0, 0, 1, 1], rank=[-1] * 4, optype=[0] * 4, duration=[1.0] * 4)
    assert one_rank_per_worker(unknown) is unknown


def test_the_check_works_a_chunk_at_a_time(monkeypatch):
    # Chunks of 2 records: the second rank of worker (0, 0) appears in the last chunk only.
    monkeypatch.setattr(complete, "_CHUNK", 2)
    rec = records(dp_rank=[0, 1, 0, 1, 0], stage=[0] * 5, rank=[0, 1, 0, 1, 5], optype=[0] * 5,
                  duration=[1.0, 1.0, 1.0, 1.0, 4.0])
    assert one_rank_per_worker(rec).rank.tolist() == [1, 1, 5]
    # A rank recorded on two workers (a reader would have reported it) is no fast answer either.
    odd = records(dp_rank=[0, 1, 0, 1], stage=[0] * 4, rank=[0, 1, 1, 1], optype=[0] * 4, duration=[1.0, 1.0, 2.0, 1.0])
    assert loader._one_rank_each(odd) is False
