"""Runtime control (relax_straggler.control): commands are checked before anything changes,
and a running job switches on every rank at the same step without a loss changing."""

from __future__ import annotations

import json
import os

import pytest

from conftest import REAL_RUNS, REPO, torchrun
from relax_straggler.control import ControlCommand, ControlFile, LocalControl, parse_command

pytestmark = REAL_RUNS


def test_a_command_names_what_it_changes():
    assert parse_command('{"enabled": false}', "f").changes() == {"enabled": False}
    command = parse_command('{"interval": 20, "relative_threshold": 1.3, "absolute_ms_threshold": 0}', "f")
    assert command == ControlCommand(interval=20, relative_threshold=1.3, absolute_ms_threshold=0.0)


@pytest.mark.parametrize("text, message", [
    ("enabled", "f: not JSON"),
    ("[1]", "expected a JSON object"),
    ("{}", "changes nothing"),
    ('{"intervall": 3}', r"unknown field\(s\) \['intervall'\]"),
    ('{"enabled": 1}', "enabled must be true or false"),
    ('{"interval": 0}', "interval must be an integer in"),
    ('{"interval": 2.5}', "interval must be an integer in"),
    ('{"interval": 9223372036854775808}', "interval must be an integer in"),
    ('{"enabled": null}', "changes nothing"),
    ('{"relative_threshold": 0.9}', "relative_threshold must be a finite number >= 1"),
    ('{"absolute_ms_threshold": NaN}', "absolute_ms_threshold must be a finite number >= 0"),
])
def test_a_malformed_command_is_refused_naming_the_field(text, message):
    with pytest.raises(ValueError, match=message):
        parse_command(text, "f")


def test_the_file_is_read_once_per_change_and_a_bad_one_changes_nothing(tmp_path):
    path = tmp_path / "control.json"
    control = ControlFile(str(path))
    assert control.poll() is None  # no file yet
    path.write_text('{"enabled": false}')
    assert control.poll() == ControlCommand(enabled=False)
    assert control.poll() is None  # unchanged
    path.write_text('{"enabled": "no"}')
    os.utime(path, ns=(1, 1))
    assert control.poll() is None and control.refused == 1


def test_a_single_process_applies_a_command_one_period_after_it_is_read(tmp_path):
    path = tmp_path / "control.json"
    path.write_text('{"interval": 4}')
    control = LocalControl(ControlFile(str(path)), every=5)
    applied = {step: control.at_step(step) for step in range(16)}
    assert {s: c for s, c in applied.items() if c is not None} == {5: ControlCommand(interval=4)}


def test_four_ranks_pause_resume_and_repace_at_the_same_step_with_unchanged_losses(tmp_path):
    worker = REPO / "tests" / "python" / "workers" / "control.py"
    observed, unobserved = tmp_path / "observed.json", tmp_path / "unobserved.json"
    torchrun(4, worker, [str(observed), str(tmp_path / "control.json"), "70"])
    torchrun(4, worker, [str(unobserved), str(tmp_path / "unused.json"), "70", "--unobserved"])
    ranks = json.loads(observed.read_text())
    # Written before step 12, read at step 15, applied from step 21: paused. Resumed with
    # interval 3 (written at 32, read at 35) from step 41. The malformed command of step 52
    # (read at 55) is refused; the threshold of step 62 changes no sampling.
    expected = list(range(2, 21, 2)) + [s for s in range(41, 70) if s % 3 == 0]
    for r in ranks:
        assert r["sampled"] == expected, r["sampled"]
    assert ranks[0]["refused"] == 1
    assert [r["losses"] for r in ranks] == [r["losses"] for r in json.loads(unobserved.read_text())]
