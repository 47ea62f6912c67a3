"""A bounded mutation fuzz of the file store and the monitor's state journal
(benchmarks/fuzz_store.py): 50 mutants per seed, fixed seed; no crash, no hang, no
acknowledged row lost, no row read twice or never written, no loss left unreported."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from fuzz_store import fuzz  # noqa: E402


@pytest.fixture(scope="module")
def tallies():
    return fuzz(200, seed=1, limit_s=10.0)


@pytest.mark.parametrize("name", ["one-job", "segments", "jobs", "journal"])
def test_damaged_stores_and_journals_lose_nothing_acknowledged(tallies, name):
    t = tallies[name]
    assert t.mutants == 50
    assert t.crashes == [] and t.hangs == [] and t.lost == [] and t.wrong == [] and t.silent == []
    if name == "journal":  # the mutants exercise both outcomes
        assert t.outcomes["started"] and t.outcomes["start refused, naming the file"]
    else:
        assert t.outcomes["every seed row read back"] and t.outcomes["damage cost seed rows (reported)"]
