"""The hierarchical side channel: its plan (which rank gathers to which, the rows each root
holds, the connections a rank needs at 100k ranks), when the default picks it (above 256
analyzed ranks), and on 4 and 8 Gloo ranks in nodes of 2
(on 8, two levels of leaders above the nodes) the same reports as the flat channel, bit for
bit, from the same rows."""

from __future__ import annotations

import json
import math

import pytest

from conftest import REPO, torchrun
from relax_straggler.config import StragglerConfig
from relax_straggler.live.side_channel import FLAT_MAX_RANKS, describe, lazy, node_size
from relax_straggler.live.side_tree import plan
from workers.step_times import assert_not_blocked


def test_four_ranks_in_nodes_of_two_gather_to_each_node_leader_then_to_the_metrics_rank():
    levels = plan([0, 1, 2, 3], 0, 2, 16)
    assert [[(g.members, g.root, g.rows) for g in level] for level in levels] == [
        [((0, 1), 0, (0, 1)), ((2, 3), 2, (2, 3))],
        [((0, 2), 0, (0, 1, 2, 3))],
    ]


def test_the_metrics_rank_leads_its_node_and_roots_every_level_above():
    levels = plan([0, 1, 2, 3], 3, 2, 16)
    assert [[(g.members, g.root) for g in level] for level in levels] == [[((0, 1), 0), ((2, 3), 3)], [((0, 3), 3)]]
    assert levels[-1][0].rows == (0, 1, 2, 3)


def test_analyzed_ranks_are_placed_by_their_global_rank_and_rows_stay_in_their_order():
    levels = plan([1, 2, 5, 6, 7], 0, 4, 2)  # nodes of global ranks 0-3 and 4-7
    assert [g.members for g in levels[0]] == [(0, 1), (2, 3, 4)]
    assert levels[-1][0].rows == (0, 1, 2, 3, 4)


def test_at_100k_ranks_in_nodes_of_8_each_rank_needs_at_most_64_connections():
    n, node, fanout = 100_000, 8, StragglerConfig().side_fanout
    levels = plan(range(n), 0, node, fanout)
    assert [len(level) for level in levels] == [12_500, 1_563, 196, 25, 4, 1]
    top = levels[-1][0]
    assert top.root == 0 and sorted(top.rows) == list(range(n))
    # A gather's member exchanges with its root only (lazy connections), a root with its
    # members; each group listens on one socket; the decisions' group (one more) adds the
    # peers of Gloo's broadcast tree, log2 N at most.
    peers, groups = [0] * n, [1] * n
    for level in levels:
        for g in level:
            for m in g.members:
                peers[m] += len(g.members) - 1 if m == g.root else 1
                groups[m] += 1
    assert peers[0] == 7 + 7 * 4 + 3 and max(peers[1:]) <= peers[0]
    assert max(p + g for p, g in zip(peers, groups)) + math.ceil(math.log2(n)) <= 64


def test_bad_plans_and_node_sizes_are_refused_naming_the_flag(monkeypatch):
    with pytest.raises(ValueError, match="fanout"):
        plan([0, 1], 0, 1, 1)
    with pytest.raises(ValueError, match="metrics rank index 2"):
        plan([0, 1], 2, 1, 2)
    with pytest.raises(ValueError, match="--straggler-side-fanout"):
        StragglerConfig(side_fanout=1)
    with pytest.raises(ValueError, match="--straggler-side-node-size"):
        StragglerConfig(side_node_size=-2)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE"):
        node_size(StragglerConfig(side_node_size=-1), 4)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert node_size(StragglerConfig(side_node_size=-1), 4) == 8
    assert node_size(StragglerConfig(side_node_size=0), 4096) == 0


def test_the_default_is_flat_up_to_256_ranks_and_a_lazy_tree_of_the_launchers_nodes_above(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    default = StragglerConfig()
    assert [node_size(default, n) for n in (1, 8, FLAT_MAX_RANKS, FLAT_MAX_RANKS + 1, 100_000)] == [0, 0, 0, 4, 4]
    assert [lazy(default, n) for n in (8, FLAT_MAX_RANKS, FLAT_MAX_RANKS + 1)] == [False, False, True]
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert node_size(default, 16_384) == 8  # no launcher's word: nodes of 8
    for odd in ("\u00b2", "4.0", "0", "-4"):  # no count of ranks: as if none was given
        monkeypatch.setenv("LOCAL_WORLD_SIZE", odd)
        assert node_size(default, 16_384) == 8, odd
    # A size given is kept at any scale, and lazy connections only where asked.
    flat = StragglerConfig(side_node_size=0)
    assert node_size(flat, 16_384) == 0 and not lazy(flat, 16_384)
    assert node_size(StragglerConfig(side_node_size=2), 4) == 2 and lazy(StragglerConfig(side_lazy_init=True), 4)
    # The start-up line says which it is: node sizes as built, lazy connections however asked.
    assert describe(default, 8) == "one flat group"
    assert describe(StragglerConfig(side_node_size=16), 2) == "a tree of 2-rank nodes, fan-out 8"
    monkeypatch.setenv("TORCH_GLOO_LAZY_INIT", "True")
    assert describe(default, 8) == "one flat group with lazy connections"
    monkeypatch.setenv("TORCH_GLOO_LAZY_INIT", "0")
    assert describe(default, 8) == "one flat group"
    monkeypatch.delenv("TORCH_GLOO_LAZY_INIT")
    assert describe(default, 16_384) == "a tree of 8-rank nodes, fan-out 8 with lazy connections"
    assert describe(StragglerConfig(side_node_size=0, side_lazy_init=True), 4) == "one flat group with lazy connections"
    # At 100k ranks the default's nodes of 8 and fanout 8 keep a rank under 64 connections
    # (test_at_100k_ranks_in_nodes_of_8_each_rank_needs_at_most_64_connections).


STEPS = 40


def without_timing(report: str) -> str:
    step, metrics = json.loads(report)
    metrics.pop("straggler/window/elapsed_ms", None)
    return json.dumps([step, metrics])


@pytest.mark.parametrize("world", [4, 8])
def test_flat_and_hierarchical_channels_report_the_same_bit_for_bit(tmp_path, world):
    torchrun(world, REPO / "tests" / "python" / "workers" / "side_tree.py", [str(tmp_path), str(STEPS)],
             timeout_s=60 * world)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    for mode in ("flat-0", "tree-0", "flat-1", "tree-1"):
        assert_not_blocked({r: x["step_s"][mode] for r, x in enumerate(ranks)}, warmup=1, expected_steps=STEPS)
        assert all(x["stopped_by"][mode] is None for x in ranks), [x["warnings"] for x in ranks]
    for metrics in ("0", "1"):
        flat = json.loads((tmp_path / f"flat-{metrics}.json").read_text())
        tree = json.loads((tmp_path / f"tree-{metrics}.json").read_text())
        assert [json.loads(r)[0] for r in flat] == list(range(STEPS)), flat[:2]
        # Everything but the window ensemble's own run time, which no two runs share.
        assert [without_timing(r) for r in tree] == [without_timing(r) for r in flat]
        assert sum("straggler/window/elapsed_ms" in r for r in flat) == STEPS // 10
        last = json.loads(flat[-1])[1]
        assert (last["straggler/verdict/rank"], last["straggler/verdict/stage"]) == (3, "forward"), last
