"""The demo's stragglers on purpose: the delay and jitter specs and the CPU contender."""

import os
import sys
import time

import pytest

from conftest import DETECTION, ONE_AT_A_TIME
from relax_straggler.demo.faults import Contender, parse_delays, parse_jitter

pytestmark = [ONE_AT_A_TIME, DETECTION]  # measures CPU shares


def test_delay_specs_parse_and_bad_ones_name_the_spec():
    assert parse_delays(["1:forward:30", "0:data:2.5:100"], 2) == [(1, "forward", 30.0, 0), (0, "data", 2.5, 100)]
    for bad in ("1:forward", "1:attention:30", "2:forward:30", "1:forward:-1", "1:forward:nan", "1:forward:30:x"):
        with pytest.raises(ValueError, match="--inject-delay"):
            parse_delays([bad], 2)


def test_jitter_specs_parse_and_bad_ones_name_the_spec():
    assert parse_jitter(["forward:15", "backward:2.5"]) == [("forward", 15.0), ("backward", 2.5)]
    for bad in ("forward", "1:forward:15", "attention:15", "forward:0", "forward:-1", "forward:inf", "forward:x"):
        with pytest.raises(ValueError, match="--inject-jitter"):
            parse_jitter([bad])


def _cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_the_contender_spins_on_its_core_until_stopped():
    core = sorted(os.sched_getaffinity(0))[0]
    contender = Contender(core, procs=2)
    contender.start()
    try:
        pids = [p.pid for p in contender._running]
        assert all(os.sched_getaffinity(pid) == {core} for pid in pids)
        # They spin: their CPU time grows by half a second, whatever else shares the core (on a
        # quiet host that takes them 0.5 s of wall time, beside busy processes longer).
        before, deadline = sum(_cpu_s(pid) for pid in pids), time.monotonic() + 30.0
        while sum(_cpu_s(pid) for pid in pids) - before < 0.5:
            assert time.monotonic() < deadline, "the contender's processes are not spinning"
            time.sleep(0.1)
    finally:
        contender.stop()
    assert contender._running == []
    assert all(not os.path.exists(f"/proc/{pid}") for pid in pids)


def test_the_contender_waits_for_a_slow_interpreter_start_up(tmp_path, monkeypatch):
    # A loaded machine can take long to start an interpreter; the contention must still begin
    # at the step that started it, so start() waits for the processes to spin.
    slow = tmp_path / "slow-python"
    slow.write_text(f"#!/bin/sh\nsleep 0.4\nexec {sys.executable} \"$@\"\n")
    slow.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(slow))
    contender = Contender(sorted(os.sched_getaffinity(0))[0], procs=2)
    t0 = time.monotonic()
    contender.start()
    try:
        assert time.monotonic() - t0 >= 0.4
    finally:
        contender.stop()


def test_the_contender_reports_a_process_that_dies_before_spinning(tmp_path, monkeypatch):
    broken = tmp_path / "broken-python"
    broken.write_text("#!/bin/sh\nexit 3\n")
    broken.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(broken))
    contender = Contender(0, procs=1)
    with pytest.raises(RuntimeError, match="exited before it started spinning"):
        contender.start()
    contender.stop()


def test_the_contender_refuses_no_processes():
    with pytest.raises(ValueError, match="procs"):
        Contender(0, procs=0)
