"""A bounded mutation fuzz of `relax-straggler analyze` and `whatif` over every reader's
input (benchmarks/fuzz_inputs.py): 300 mutants per seed input, fixed seed, each a result
or a clean bad-input error within 2 s; no traceback, no hang, no result without its JSON."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from fuzz_inputs import fuzz, seeds  # noqa: E402

from relax_straggler.readers import READERS  # noqa: E402


def test_every_reader_has_a_seed_input(tmp_path):
    from relax_straggler.readers import detect_format

    formats = set()
    for name, (_, data) in seeds().items():
        (tmp_path / name).write_bytes(data)
        formats.add(detect_format(str(tmp_path / name)))
    assert set(READERS) <= formats


@pytest.mark.parametrize("name", sorted(seeds()))
def test_mutants_give_a_result_or_a_clean_error(name):
    tally = fuzz(300, seed=1, limit_s=2.0, names=(name,))[name]
    assert tally.inputs >= 300
    assert tally.crashes == [] and tally.hangs == [] and tally.lost == []
    assert tally.results and tally.errors  # the mutants exercise both outcomes
