"""One rank of a small Gloo job that stops in a collective and writes its PyTorch Flight
Recorder dump (tests/python/test_flight_recorder.py).

    python fr_dump.py RANK WORLD RENDEZVOUS_FILE SCENARIO

Every rank runs three world all_reduces and one broadcast in a group of ranks 0 and 1
("pair"); then, by SCENARIO:
  skip     rank 1 never enters the fourth world all_reduce, which the others start
  desync   rank 2 starts a broadcast where the others start the fourth all_reduce
The fourth op is started asynchronously so the ranks that entered it do not block; each
rank then writes torch's own dump (torch._C._distributed_c10d._dump_fr_trace) to
$TORCH_FR_DUMP_TEMP_FILE<rank>, as torch's writer names it, and exits without tearing
the stuck group down.
"""

from __future__ import annotations

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _dump_fr_trace


def main() -> None:
    rank, world, rendezvous, scenario = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    t = torch.ones(8)
    for _ in range(3):
        dist.all_reduce(t)
    pair = dist.new_group([0, 1], group_desc="pair")
    if rank in (0, 1):
        dist.broadcast(t, 0, group=pair)
    if scenario == "skip":
        if rank != 1:
            dist.all_reduce(t, async_op=True)
    elif scenario == "desync":
        if rank == 2:
            dist.broadcast(torch.ones(8), 0, async_op=True)
        else:
            dist.all_reduce(t, async_op=True)
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    time.sleep(1.0)  # Gloo retires completed ops on its own threads, after wait() returns
    data = _dump_fr_trace(includeCollectives=True, includeStackTraces=False, onlyActive=False)
    with open(f"{os.environ['TORCH_FR_DUMP_TEMP_FILE']}{rank}", "wb") as f:
        f.write(data)
    os._exit(0)  # the stuck collective would hold a normal shutdown


if __name__ == "__main__":
    main()
