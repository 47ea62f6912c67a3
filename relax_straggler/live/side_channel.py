"""Which side channel install() builds: the flat Gloo group over every analyzed rank
(relax_straggler.live.aggregation) or the hierarchical one (relax_straggler.live.side_tree),
with Gloo's lazy connections or not. By default the flat group up to FLAT_MAX_RANKS analyzed
ranks and the tree with lazy connections above; --straggler-side-node-size and
--straggler-side-lazy-init choose. docs/SCALE.md measures both."""

from __future__ import annotations

import os
from typing import Sequence, Union

from relax_straggler.config import StragglerConfig
from relax_straggler.live.aggregation import SideGroupGather
from relax_straggler.live.lazy_gloo import lazy_by_environment, lazy_connections
from relax_straggler.live.side_tree import TreeGather

# The most analyzed ranks the default puts in one flat group: at 256 an eager full mesh is
# 256 sockets a rank (under the usual 1,024 open files) and about 14 s to create
# (docs/SCALE.md's fit); at 1,024 it would be 1,024 sockets and about 4 minutes.
FLAT_MAX_RANKS = 256
# Ranks per node of the default tree where the launcher does not say (LOCAL_WORLD_SIZE).
DEFAULT_NODE_SIZE = 8


def _local_world_size() -> int:
    """LOCAL_WORLD_SIZE as a positive integer, or 0 when the launcher set none (or no number)."""
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    return int(local) if local.isascii() and local.isdigit() and int(local) >= 1 else 0


def node_size(config: StragglerConfig, ranks: int) -> int:
    """Ranks per node of the hierarchical channel for `ranks` analyzed ranks, 0 for the flat
    one: config.side_node_size; the launcher's LOCAL_WORLD_SIZE for -1; by default (None) 0 up
    to FLAT_MAX_RANKS ranks, above that LOCAL_WORLD_SIZE (DEFAULT_NODE_SIZE where the launcher
    gives none). Raises ValueError when -1 is given without a LOCAL_WORLD_SIZE."""
    if config.side_node_size is None:
        return 0 if ranks <= FLAT_MAX_RANKS else (_local_world_size() or DEFAULT_NODE_SIZE)
    if config.side_node_size != -1:
        return config.side_node_size
    local = _local_world_size()
    if not local:
        raise ValueError(f"--straggler-side-node-size -1 takes the node size from LOCAL_WORLD_SIZE, which is "
                         f"{os.environ.get('LOCAL_WORLD_SIZE', '')!r}")
    return local


def lazy(config: StragglerConfig, ranks: int) -> bool:
    """Whether the side channel's groups connect lazily: as asked (--straggler-side-lazy-init),
    and always for the default's tree (its decisions' group spans every rank)."""
    return config.side_lazy_init or (config.side_node_size is None and ranks > FLAT_MAX_RANKS)


def describe(config: StragglerConfig, ranks: int) -> str:
    """The side channel open_side_channel builds for `ranks` analyzed ranks, in words (for the
    start-up line): "one flat group" or "a tree of N-rank nodes, fan-out F" (N at most the
    ranks), and "with lazy connections" where they are lazy (asked, or already set in the
    environment). Raises ValueError as node_size does."""
    size = node_size(config, ranks)
    shape = f"a tree of {min(size, ranks)}-rank nodes, fan-out {config.side_fanout}" if size > 0 else "one flat group"
    return shape + (" with lazy connections" if lazy(config, ranks) or lazy_by_environment() else "")


def open_side_channel(ranks: Sequence[int], config: StragglerConfig) -> Union[SideGroupGather, TreeGather]:
    """The side channel of the analyzed `ranks` (global ranks) as `config` asks. Collective
    over the default group: every process calls it at the same point with the same
    arguments. Raises ValueError for a bad metrics rank or node size."""
    size = node_size(config, len(ranks))
    with lazy_connections(lazy(config, len(ranks))):
        if size > 0:
            return TreeGather(ranks, config.metrics_rank, size, config.side_fanout)
        return SideGroupGather(ranks, config.metrics_rank)
