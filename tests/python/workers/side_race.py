"""Worker of test_side_group: gathers that the second rank joins about one poll period of the
metrics rank's report thread late, as pipeline stages reach a sampled step's end at
different times. Rank 1 sleeps U(0.9, 1.1) x the poll period before each of GATHERS gathers;
rank 0 waits for each one's rows as the report thread does. Rank 0 writes
{"gathers", "unavailable": gathers whose rows were reported lost, "failed": the side
group's failure or null}.
Usage (under torchrun, 2 ranks): side_race.py OUTPUT_JSON GATHERS"""

import json
import random
import sys
import time

import numpy as np
import torch.distributed as dist

from relax_straggler.common.payload import ROW_LEN
from relax_straggler.live import aggregation
from relax_straggler.live.aggregation import GatherUnavailable, SideGroupGather


def main() -> None:
    out, gathers = sys.argv[1], int(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    side = SideGroupGather([0, 1], metrics_rank=0)
    rng = random.Random(rank)
    unavailable = 0
    for step in range(gathers):
        if rank == 1:
            time.sleep(rng.uniform(0.9, 1.1) * aggregation._POLL_S)
        row = np.full(ROW_LEN, float(step))
        pending = side.gather(row)
        if pending is not None:
            try:
                rows = pending.wait()
                assert rows[:, 0].tolist() == [step, step]
            except GatherUnavailable:
                unavailable += 1
    failed = side.failure
    side.close()
    if rank == 0:
        with open(out, "w") as fh:
            json.dump({"gathers": gathers, "unavailable": unavailable,
                       "failed": None if failed is None else failed.describe()}, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
