"""Skipped input is counted in records: every reader says how many of the records it read
its problems left out (input.problems.records_skipped, never more than input.records), and
past a tenth of them the verdict is inconclusive (exit 1) whatever the reader."""

from __future__ import annotations

import json
import os

import pytest

from relax_straggler.cli import main

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def _analyze(path, capsys) -> tuple[int, dict]:
    code = main(["analyze", str(path), "--no-progress", "--format", "json", "--no-whatif"])
    return code, json.loads(capsys.readouterr().out)


def _megatron_log(path, bad_per_value: int) -> tuple[int, int]:
    """3 iterations x 2 timers x 4 ranks, each rank line followed by `bad_per_value` lines
    of NaN for the same rank. Returns (values, bad lines)."""
    lines = []
    for it in range(1, 4):
        lines += [f" iteration {it}/ 3 | elapsed time per iteration (ms): 40.0 |", "times across ranks (ms):"]
        for name, ms in (("forward-compute", 10.0), ("backward-compute", 20.0)):
            lines.append(f"  {name}:")
            for rank in range(4):
                lines.append(f"     rank {rank}: {ms + rank}")
                lines += [f"     rank {rank}: nan"] * bad_per_value
    path.write_text("\n".join(lines) + "\n")
    return 24, 24 * bad_per_value


def test_a_count_of_skipped_values_never_exceeds_the_values_read(tmp_path, capsys):
    path = tmp_path / "bad.log"
    values, bad = _megatron_log(path, 2)
    code, s = _analyze(path, capsys)
    problems = s["input"]["problems"]
    assert s["input"]["records"] == problems["records"] == values + bad
    assert problems["records_skipped"] == problems["total"] == bad
    assert code == 1 and s["verdict"]["reason"] == "rejected_input"
    assert s["verdict"]["summary"].startswith(f"{bad} of {values + bad} records were skipped")


def test_skipped_values_below_a_tenth_leave_the_verdict(tmp_path, capsys):
    path = tmp_path / "few.log"
    _megatron_log(path, 0)
    with open(path, "a") as f:
        f.write("times across ranks (ms):\n  forward-compute:\n     rank 0: nan\n")  # 1 of 25 values
    code, s = _analyze(path, capsys)
    assert (s["input"]["problems"]["records_skipped"], s["input"]["records"]) == (1, 25)
    assert code == 0 and s["verdict"]["status"] == "clean"


def test_events_on_a_lane_without_a_name_are_counted_skipped(tmp_path, capsys):
    # Two of the four lanes lose their thread_name: their 24 events cannot be placed on a rank.
    events = json.load(open(os.path.join(FIXTURES, "timeline-small.json")))
    named = [e for e in events if e["ph"] == "M"]
    kept = [e for e in events if e not in named[:2]]
    path = tmp_path / "timeline-unnamed.json"
    path.write_text(json.dumps(kept))
    code, s = _analyze(path, capsys)
    problems = s["input"]["problems"]
    assert (problems["total"], problems["records_skipped"], s["input"]["records"]) == (2, 24, 50)
    assert "12 events on pid 0 tid 0 are skipped" in problems["first"][0]
    assert code == 1 and s["verdict"]["reason"] == "rejected_input"


@pytest.mark.parametrize("name", ["megatron_all.log", "megatron_minmax.log", "straggler.jsonl",
                                  "timeline-small.json"])
def test_a_clean_fixture_reads_every_record(name, capsys):
    code, s = _analyze(os.path.join(FIXTURES, name), capsys)
    problems = s["input"]["problems"]
    assert code == 0 and s["input"]["records"] > 0
    assert (problems["total"], problems["records_skipped"]) == (0, 0)
