"""What a multi-rank test worker hands back: one JSON list of every rank's result."""

import json
from typing import Any

import torch.distributed as dist


def write_every_rank(out: str, result: Any) -> None:
    """Gathers `result` (JSON-able) from every rank; rank 0 writes the list, rank order, to `out`."""
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, result)
    if dist.get_rank() == 0:
        with open(out, "w") as fh:
            json.dump(everyone, fh)
