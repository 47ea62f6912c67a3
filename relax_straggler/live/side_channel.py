"""Which side channel install() builds: the flat Gloo group over every analyzed rank
(relax_straggler.live.aggregation, the default), or the hierarchical one
(relax_straggler.live.side_tree, --straggler-side-node-size), with Gloo's lazy connections when
asked (--straggler-side-lazy-init). docs/SCALE.md measures both."""

from __future__ import annotations

import os
from typing import Sequence, Union

from relax_straggler.config import StragglerConfig
from relax_straggler.live.aggregation import SideGroupGather
from relax_straggler.live.lazy_gloo import lazy_connections
from relax_straggler.live.side_tree import TreeGather


def node_size(config: StragglerConfig) -> int:
    """Ranks per node of the hierarchical channel: config.side_node_size, or the launcher's
    LOCAL_WORLD_SIZE for -1; 0 for the flat one. Raises ValueError when -1 is given
    without a LOCAL_WORLD_SIZE."""
    if config.side_node_size != -1:
        return config.side_node_size
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    if not local.isdigit() or int(local) < 1:
        raise ValueError(f"--straggler-side-node-size -1 takes the node size from LOCAL_WORLD_SIZE, which is "
                         f"{local!r}")
    return int(local)


def open_side_channel(ranks: Sequence[int], config: StragglerConfig) -> Union[SideGroupGather, TreeGather]:
    """The side channel of the analyzed `ranks` (global ranks) as `config` asks. Collective
    over the default group: every process calls it at the same point with the same
    arguments. Raises ValueError for a bad metrics rank or node size."""
    size = node_size(config)
    with lazy_connections(config.side_lazy_init):
        if size > 0:
            return TreeGather(ranks, config.metrics_rank, size, config.side_fanout)
        return SideGroupGather(ranks, config.metrics_rank)
