"""The hang answer's store row (relax_straggler.stores.hang_rows): fields of the wrong type
are refused naming the row and the field, and the monitor serves that as the answer's error."""

import json

import pytest

from relax_straggler.stores import hang_rows
from relax_straggler.stores.base import Sample

GOOD = {"kind": "lagging", "rank": 1, "group": "default_pg", "group_ranks": "0-3", "op": "all_reduce", "seq": 6,
        "waiting_ranks": 3, "waited_s": 61.5, "last_completed": "", "no_snapshot_ranks": "", "stalled_s": 62.0,
        "step": 4, "answer": "rank 1 never entered all_reduce #6"}


def row(**fields) -> Sample:
    return Sample(timestamp=1.0, job="j", metric_name="straggler/hang", rank=0, iteration=4, values=(1.0,),
                  subname=json.dumps({**GOOD, **fields}))


def test_a_well_formed_row_decodes():
    assert {k: v for k, v in hang_rows.decode(row()).items() if k != "answered_at"} == GOOD


@pytest.mark.parametrize("field,value", [("step", "4"), ("step", None), ("rank", "one"), ("rank", 1.5),
                                         ("seq", True), ("waited_s", "61"), ("kind", 3), ("answer", None)])
def test_a_field_of_the_wrong_type_is_refused_naming_it(field, value):
    with pytest.raises(ValueError, match=f"straggler/hang row of job 'j', iteration 4: {field} must be"):
        hang_rows.decode(row(**{field: value}))
