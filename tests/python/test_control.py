"""Runtime control (relax_straggler.live.control): commands are checked before anything changes,
and a running job switches on every rank at the same step without a loss changing."""

from __future__ import annotations

import json
import os

import pytest

from conftest import REAL_RUNS, REPO, torchrun
from workers.step_times import assert_not_blocked
from relax_straggler.live.control import ControlCommand, ControlFile, parse_command
from relax_straggler.live.lockstep import LocalLockstep

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


def test_a_single_process_applies_a_command_as_many_periods_after_it_is_read_as_the_ranks_do(tmp_path):
    path = tmp_path / "control.json"
    path.write_text('{"interval": 4}')
    control = LocalLockstep(ControlFile(str(path)), every=5)  # read 4 periods (20 steps) later
    applied = {step: control.at_step(step, lambda: (False, None), 0.0) for step in range(40)}
    assert {s: d.command for s, d in applied.items() if d is not None and d.command} == {20: ControlCommand(interval=4)}


def test_four_ranks_pause_resume_and_repace_at_the_same_step_with_unchanged_losses(tmp_path):
    worker = REPO / "tests" / "python" / "workers" / "control.py"
    observed, unobserved = tmp_path / "observed.json", tmp_path / "unobserved.json"
    torchrun(4, worker, [str(observed), str(tmp_path / "control.json"), "90"])
    torchrun(4, worker, [str(unobserved), str(tmp_path / "unused.json"), "90", "--unobserved"])
    ranks = json.loads(observed.read_text())
    # Decisions every 8 steps, each read 2 decisions (16 steps) later. Written before step
    # 12, read at step 16, applied from step 33: paused. Resumed with interval 3 (written
    # and read at 40) from step 57. The malformed command of step 60 (read at 64) is
    # refused; the threshold of step 70 changes no sampling.
    expected = list(range(2, 33, 2)) + [s for s in range(57, 90) if s % 3 == 0]
    for r in ranks:
        assert r["sampled"] == expected, r["sampled"]
    assert ranks[0]["refused"] == 1
    assert_not_blocked({i: r["step_s"] for i, r in enumerate(ranks)}, warmup=2, expected_steps=90)
    assert [r["losses"] for r in ranks] == [r["losses"] for r in json.loads(unobserved.read_text())]
