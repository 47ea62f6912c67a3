"""Faults on the collection side: report sinks that block, raise or crawl, a peer or the
metrics rank killed (SIGKILL) or stopped (SIGSTOP, for good or for 20 s), a side-group
gather that fails or never finishes, a node leader of the hierarchical side channel killed or
stopped,
a metrics rank whose report thread stalls 30 s, an exception raised inside a section.

Each test asserts that training finishes (or fails exactly as it would without the
analyzer), that no training step was held on a rank the fault is not on (the step-time
guard, tests/python/workers/step_times.py), that uninstall() returns within its bound
(Analyzer.uninstall, 5 s by default) and that what the sinks were given before shutdown is
complete. Every wait here has its own limit, so a hang fails the test instead of wedging
the suite.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import relax_straggler
from conftest import REAL_RUNS, REPO, WorkerCrashed, free_port
from relax_straggler.common.side_failure import GATHER_FAILED, GATHER_STUCK
from relax_straggler.reporters.pipeline import ReportPipeline
from relax_straggler.reporters.summary import RunSummary
from test_install import config, make, train
from workers.step_times import assert_not_blocked

pytestmark = REAL_RUNS

BOUND_S = 5.0   # uninstall()'s default bound
MARGIN_S = 2.0  # two loaded cores
WORKER = REPO / "tests" / "python" / "workers" / "fault_peer.py"


def timed_uninstall(analyzer, limit_s: float = 30.0) -> tuple[float, float]:
    """(seconds uninstall() took, time.monotonic() when it returned); fails when it is still
    running after limit_s."""
    done: list[float] = []
    start = time.monotonic()
    thread = threading.Thread(target=lambda: (analyzer.uninstall(), done.append(time.monotonic())), daemon=True)
    thread.start()
    thread.join(limit_s)
    assert done, f"uninstall() still running after {limit_s} s"
    return done[0] - start, done[0]


def jsonl_steps(path: Path) -> list[int]:
    """The steps of a JSONL report file; every line must be a complete report."""
    if not path.exists():
        return []
    with open(path) as fh:
        lines = [json.loads(line) for line in fh]
    assert all({"step", "stages", "device_ms", "metrics"} <= set(r) for r in lines)
    return [r["step"] for r in lines]


def shutdown_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "did not finish" in r.getMessage()]


# Report sinks -------------------------------------------------------------------------------
def test_a_blocking_sink_cannot_hold_uninstall(tmp_path, caplog):
    release = threading.Event()
    calls: list[tuple[float, int]] = []

    def report_fn(metrics: dict, step: int) -> None:
        calls.append((time.monotonic(), step))
        release.wait(120)

    model, opt = make()
    analyzer = relax_straggler.install(model, opt, config=config(queue_size=4, jsonl_path=str(tmp_path / "r.jsonl")),
                                       report_fn=report_fn)
    try:
        train(model, opt, analyzer, 12)  # the queue fills behind the blocked sink
        with caplog.at_level(logging.WARNING, logger="relax_straggler"):
            took, returned_at = timed_uninstall(analyzer)
    finally:
        release.set()
    assert took <= BOUND_S + MARGIN_S
    assert len(shutdown_warnings(caplog)) == 1, caplog.text
    time.sleep(0.5)  # the released report thread must not go on to the next report
    assert [step for _, step in calls] == [0]
    assert all(t < returned_at for t, _ in calls)
    pipeline = analyzer._pipeline
    assert pipeline.dropped_reports + pipeline.abandoned_reports == 12  # the one in the sink is abandoned too


def test_a_slow_sink_is_cut_at_the_bound_and_never_called_after_uninstall(tmp_path, caplog):
    calls: list[tuple[float, int]] = []

    def report_fn(metrics: dict, step: int) -> None:
        calls.append((time.monotonic(), step))
        time.sleep(0.25)

    model, opt = make()
    path = tmp_path / "r.jsonl"
    analyzer = relax_straggler.install(model, opt, config=config(jsonl_path=str(path)), report_fn=report_fn)
    train(model, opt, analyzer, 40)  # 10 s of sink work queued
    with caplog.at_level(logging.WARNING, logger="relax_straggler"):
        took, returned_at = timed_uninstall(analyzer)
    assert took <= BOUND_S + MARGIN_S
    assert len(shutdown_warnings(caplog)) == 1, caplog.text
    given = len(calls)
    time.sleep(0.6)
    assert len(calls) == given and all(t < returned_at for t, _ in calls)
    steps = [step for _, step in calls]
    assert 0 < len(steps) < 40 and steps == list(range(len(steps)))  # in order, none skipped
    written = jsonl_steps(path)  # the JSONL sink runs after the callback on each report
    assert written == steps[:len(written)] and len(steps) - len(written) <= 1
    pipeline = analyzer._pipeline
    assert len(written) + pipeline.abandoned_reports + pipeline.dropped_reports == 40


def test_a_raising_sink_is_logged_once_and_the_others_get_every_report(tmp_path, caplog):
    def report_fn(metrics: dict, step: int) -> None:
        raise RuntimeError(f"tracking server down at step {step}")

    model, opt = make()
    path = tmp_path / "r.jsonl"
    analyzer = relax_straggler.install(model, opt, config=config(jsonl_path=str(path)), report_fn=report_fn)
    with caplog.at_level(logging.WARNING, logger="relax_straggler"):
        losses = train(model, opt, analyzer, 10)
        took, _ = timed_uninstall(analyzer)
    assert len(losses) == 10 and took <= 1.0 + MARGIN_S
    assert jsonl_steps(path) == list(range(10))
    assert len([r for r in caplog.records if "raised" in r.getMessage()]) == 1, caplog.text
    assert not shutdown_warnings(caplog)


FULL_DISK = REPO / "tests" / "python" / "workers" / "full_disk.py"
FULL_DISK_STEPS = 40


def check_full_disk_run(out: subprocess.CompletedProcess, path: Path) -> None:
    """The run of workers/full_disk.py finished (exit 0, uninstall within its bound), its
    JSONL file holds whole reports in step order, from step 0 to the first that did not fit
    (the disk filled up, each line is whole or absent, and a later, shorter line may still
    fit), and the failure was one warning and one count at uninstall."""
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["steps"] == FULL_DISK_STEPS and result["uninstall_s"] <= BOUND_S + MARGIN_S
    assert path.read_bytes().endswith(b"\n")
    steps = jsonl_steps(path)
    first_left_out = next((i for i, step in enumerate(steps) if step != i), len(steps))
    assert 0 < first_left_out and len(steps) < FULL_DISK_STEPS and steps == sorted(set(steps)), steps
    warnings = [line for line in out.stderr.splitlines() if line.startswith("WARNING") and str(path.name) in line]
    assert len(warnings) == 2, out.stderr[-3000:]
    assert "cannot write" in warnings[0] and f"step {first_left_out}" in warnings[0]
    left_out, given = map(int, re.search(r"(\d+) of (\d+) reports were not written", warnings[1]).groups())
    assert given - left_out == len(steps) and given <= FULL_DISK_STEPS
    assert "Traceback" not in out.stderr


def test_a_full_disk_under_the_jsonl_sink_leaves_whole_lines_and_one_warning(tmp_path):
    # the real thing: a 16 KiB tmpfs in a mount namespace of its own (the file is copied out)
    mount = tmp_path / "small"
    mount.mkdir()
    script = (f"mount -t tmpfs -o size=16k tmpfs {mount} || exit 77; "
              f"{sys.executable} {FULL_DISK} {mount}/r.jsonl {FULL_DISK_STEPS}; rc=$?; "
              f"cp {mount}/r.jsonl {tmp_path}/r.jsonl; exit $rc")
    try:
        out = subprocess.run(["unshare", "--map-root-user", "--mount", "sh", "-c", script], cwd=REPO,
                             capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    except FileNotFoundError:
        pytest.skip("no unshare(1) to mount a small tmpfs (test_a_file_size_limit_under_the_jsonl_sink... covers it)")
    if out.returncode == 77 or "unshare:" in out.stderr[:200]:
        pytest.skip(f"cannot mount a tmpfs here: {out.stderr.strip()[:200]}")
    check_full_disk_run(out, tmp_path / "r.jsonl")


def test_a_file_size_limit_under_the_jsonl_sink_leaves_whole_lines_and_one_warning(tmp_path):
    # the same fault through a file size limit (RLIMIT_FSIZE): writes past 6,000 bytes fail
    import resource

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (6000, 6000))

    path = tmp_path / "r.jsonl"
    out = subprocess.run([sys.executable, str(FULL_DISK), str(path), str(FULL_DISK_STEPS)], cwd=REPO,
                         capture_output=True, text=True, timeout=300, preexec_fn=limit,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    check_full_disk_run(out, path)


def test_reports_that_cannot_be_built_are_logged_rate_limited_and_summarised(caplog):
    def build(pending, step: int):
        raise ValueError(f"bad rows at step {step}")

    summary = RunSummary()  # counts what it is given
    pipeline = ReportPipeline(build, [summary], queue_size=1000)
    with caplog.at_level(logging.WARNING, logger="relax_straggler"):
        for step in range(500):
            pipeline.submit(None, step)
        assert pipeline.close(timeout_s=30)
    records = [r for r in caplog.records if r.name.startswith("relax_straggler")]
    assert pipeline.failed_reports == 500 and summary.reports == 0
    assert sum(1 for r in records if r.exc_info) == 1  # the first, with its traceback
    assert 1 <= len(records) <= 3, [r.getMessage() for r in records]
    assert "500" in records[-1].getMessage()  # the summary at close counts them all


def test_steps_that_cannot_be_published_are_logged_once_and_summarised(caplog):
    model, opt = make()
    analyzer = relax_straggler.install(model, opt, config=config())

    def broken(row, op_row=None, step=-1, request=None):
        raise RuntimeError("side group unusable")

    analyzer._gather.gather = broken
    with caplog.at_level(logging.WARNING, logger="relax_straggler"):
        losses = train(model, opt, analyzer, 50)
        timed_uninstall(analyzer)
    records = [r for r in caplog.records if r.name.startswith("relax_straggler")]
    assert len(losses) == 50
    assert len(records) == 2 and records[0].exc_info, [r.getMessage() for r in records]
    assert "50 sampled steps" in records[1].getMessage()


def test_a_report_waiting_for_a_peer_is_released_at_close_and_counted_abandoned():
    peer = threading.Event()  # the row a stopped peer never sends; release() stands in for the gather's abandon()

    def build(pending, step: int):
        peer.wait(60)
        return None  # as Analyzer._build_report does when the gather is unavailable

    pipeline = ReportPipeline(build, [], queue_size=8, release=peer.set)
    for step in range(3):
        pipeline.submit(None, step)
    start = time.monotonic()
    assert not pipeline.close(timeout_s=1.0)
    assert time.monotonic() - start <= 1.0 + MARGIN_S
    assert (pipeline.abandoned_reports, pipeline.failed_reports) == (3, 0)
    pipeline._thread.join(MARGIN_S)
    assert not pipeline._thread.is_alive()  # released, it left instead of waiting in a C++ call at exit


# User code ----------------------------------------------------------------------------------
def test_an_exception_inside_a_section_propagates_unchanged_and_analysis_goes_on(tmp_path):
    import torch
    import torch.nn.functional as F

    model, opt = make()
    path = tmp_path / "r.jsonl"
    analyzer = relax_straggler.install(model, opt, config=config(jsonl_path=str(path)))
    gen = torch.Generator().manual_seed(0)
    trained = 0
    for step in range(9):
        try:
            with analyzer.section("data"):
                x = torch.randint(0, 64, (16, 32), generator=gen)
                if step % 3 == 1:
                    raise ValueError("a bad batch")  # the user's loop skips it
        except ValueError:
            continue
        loss = F.cross_entropy(model(x).view(-1, 64), x.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        trained += 1
    with pytest.raises(ZeroDivisionError, match="division by zero"):  # the same error as without the analyzer
        try:
            with analyzer.section("forward"):
                1 / 0
        finally:
            took, _ = timed_uninstall(analyzer)
    assert took <= 1.0 + MARGIN_S
    counters = analyzer.counters()
    assert counters["unmatched_stops"] == 0 and counters["open_at_step_end"] == 0, counters
    reports = [json.loads(line) for line in open(path)]
    assert [r["step"] for r in reports] == list(range(trained))
    data = reports[0]["stages"].index("data")
    assert all(r["device_ms"][0][data] is not None for r in reports)


# Peers ---------------------------------------------------------------------------------------
def run_pair(out: Path, mode: str, fault: str, faulty: int, steps: int, *extra: str, observed: bool = True,
             limit_s: float = 90.0, resume_after_s: float | None = None) -> tuple[int, dict, str, float]:
    """Runs fault_peer.py on 2 Gloo ranks (plain processes: torchrun would end the survivor
    when the faulty rank dies). resume_after_s: SIGCONT the faulty rank that long after it
    stopped itself. Returns the survivor's (exit code, result, stderr, time.time() at its
    exit); the faulty rank is SIGKILLed afterwards if still there (a stopped one). Raises
    WorkerCrashed when the survivor was killed by a signal."""
    out.mkdir(parents=True)
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                   LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        args = [sys.executable, str(WORKER), str(out), mode, fault, str(faulty), str(steps), *extra]
        with open(out / f"stderr{rank}.txt", "w") as err:
            procs.append(subprocess.Popen(args + ([] if observed else ["--unobserved"]), cwd=REPO, env=env,
                                          stdout=subprocess.DEVNULL, stderr=err))
    survivor = procs[1 - faulty]
    start = time.monotonic()
    if resume_after_s is not None:
        stopped_at = wait_stopped(procs[faulty], limit_s)
        time.sleep(max(resume_after_s - (time.monotonic() - stopped_at), 0.0))
        procs[faulty].send_signal(signal.SIGCONT)
    try:
        code = survivor.wait(max(limit_s - (time.monotonic() - start), 1.0))
    except subprocess.TimeoutExpired:
        code = None
    ended = time.time()
    if resume_after_s is not None and code is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            procs[faulty].wait(limit_s)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
        p.wait(30)
    stderr = (out / f"stderr{1 - faulty}.txt").read_text()
    assert code is not None, f"the surviving rank {1 - faulty} hung (> {limit_s} s):\n{stderr[-3000:]}"
    if code < 0:
        raise WorkerCrashed(f"the surviving rank {1 - faulty} was killed by signal {-code}:\n{stderr[-3000:]}")
    result_path = out / f"rank{1 - faulty}.json"
    assert result_path.exists(), f"rank {1 - faulty} wrote no result (exit {code}):\n{stderr[-3000:]}"
    return code, json.loads(result_path.read_text()), stderr, ended


def wait_stopped(proc: subprocess.Popen, limit_s: float) -> float:
    """Waits until `proc` stopped itself (SIGSTOP); returns time.monotonic() then."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        with open(f"/proc/{proc.pid}/stat") as fh:
            if fh.read().rsplit(")", 1)[1].split()[0] == "T":
                return time.monotonic()
        time.sleep(0.05)
    raise AssertionError(f"process {proc.pid} did not stop within {limit_s} s")


def stop_warnings(result: dict) -> list[str]:
    return [w for w in result["warnings"] if "the analysis stops on this rank" in w]


STEPS = 300


@pytest.mark.parametrize("fault", ["kill", "stop"])
@pytest.mark.parametrize("faulty", [1, 0], ids=["peer", "metrics_rank"])
def test_a_run_the_analysis_alone_connects_finishes_whatever_a_rank_does(tmp_path, fault, faulty):
    # Steps of 20 ms: the run outlasts the 3 s a stuck gather is given (steps of a millisecond
    # ended before it), and the gathers before the fault have arrived when it comes.
    code, result, stderr, _ = run_pair(tmp_path / "run", "independent", fault, faulty, STEPS, "--step-ms", "20")
    assert (code, result["outcome"], result["trained"]) == (0, "finished", STEPS), stderr[-3000:]
    assert result["uninstall_s"] <= BOUND_S + MARGIN_S, result
    assert_not_blocked({1 - faulty: result["step_s"]}, warmup=1, expected_steps=STEPS)
    # A bounded log, not one traceback per report.
    ours = [line for line in stderr.splitlines() if "relax_straggler" in line]
    assert stderr.count("Traceback") <= 1 and len(ours) <= 8 and len(stderr) < 20_000, stderr[-3000:]
    assert len(stop_warnings(result)) == 1, result["warnings"]
    if faulty == 1:  # the survivor is the metrics rank: what it reported is whole and in order
        steps = result["reported"]
        assert 1 <= len(steps) <= 10 and steps == list(range(len(steps))), steps
        assert jsonl_steps(tmp_path / "run" / "straggler.jsonl") == steps


@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_a_faulty_ddp_peer_fails_training_as_it_would_without_the_analyzer(tmp_path, fault):
    base_code, base, _, base_ended = run_pair(tmp_path / "unobserved", "ddp", fault, 1, 40, observed=False)
    code, result, stderr, ended = run_pair(tmp_path / "observed", "ddp", fault, 1, 40)
    assert base_code == code == 1, stderr[-3000:]
    assert (result["outcome"], result["error_type"], result["failed_step"]) == \
           (base["outcome"], base["error_type"], base["failed_step"]) == ("error", "RuntimeError", 10), (base, result)
    assert result["uninstall_s"] <= BOUND_S + MARGIN_S, result
    # From the start of the step the peer's fault fails to the survivor's exit: observed, no
    # later than unobserved but for uninstall's bound (process start-up, whose jitter on a
    # loaded host is seconds, is not in it).
    failing_s, base_failing_s = ended - result["failed_step_at"], base_ended - base["failed_step_at"]
    assert failing_s <= base_failing_s + BOUND_S + 2 * MARGIN_S, (failing_s, base_failing_s)
    assert_not_blocked({0: result["step_s"]}, warmup=1, expected_steps=10)  # the steps before the fault
    steps = result["reported"]
    assert steps == list(range(len(steps))) and len(steps) <= 10, steps


def both_ranks(out: Path) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("fault", ["gather-fails", "gather-hangs"])
@pytest.mark.parametrize("faulty", [1, 0], ids=["peer", "metrics_rank"])
def test_a_side_group_gather_that_fails_or_never_finishes_stops_the_analysis_on_both_ranks_at_one_step(
        tmp_path, fault, faulty):
    # DDP training, 5 ms steps; a gather unfinished for 1 s is stuck (the product waits minutes).
    steps = 100 if fault == "gather-fails" else 300
    code, _, stderr, _ = run_pair(tmp_path / "run", "ddp", fault, faulty, steps, "--step-ms", "5",
                                  "--stall-timeout", "1")
    assert code == 0, stderr[-3000:]
    ranks = both_ranks(tmp_path / "run")
    assert_not_blocked({r: x["step_s"] for r, x in enumerate(ranks)}, warmup=1, expected_steps=steps)
    # Both ranks name the same failure, the faulty rank's, in one warning each, from one step.
    code_ = {"gather-fails": GATHER_FAILED, "gather-hangs": GATHER_STUCK}[fault]
    assert [x["stopped_by"] for x in ranks] == [[faulty, code_, 10]] * 2, [x["warnings"] for x in ranks]
    warned = [stop_warnings(x) for x in ranks]
    assert all(len(w) == 1 for w in warned), warned
    assert len({re.search(r"from step (\d+)", w[0]).group(1) for w in warned}) == 1, warned
    what = f"rank {faulty}'s side-group gather of step 10 " + ("failed" if fault == "gather-fails" else "never")
    assert all(what in w[0] for w in warned), warned
    assert "injected" in warned[faulty][0] or fault == "gather-hangs"  # the detail stays on the faulty rank
    for x in ranks:
        assert x["outcome"] == "finished" and x["uninstall_s"] <= BOUND_S + MARGIN_S, x
    reported = ranks[0]["reported"]
    assert reported == sorted(reported) and reported[:10] == list(range(10)), reported


def run_ranks(out: Path, world: int, fault: str, faulty: int, steps: int, *extra: str,
              limit_s: float = 90.0) -> dict[int, dict]:
    """Runs fault_peer.py (independent training) on `world` plain processes, FAULT kill or
    stop on rank `faulty`; returns each survivor's result once they ended, asserting they
    exited 0 within limit_s. The faulty rank is SIGKILLed then if still there (a stopped one)."""
    out.mkdir(parents=True)
    port = free_port()
    procs = {}
    for rank in range(world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                   LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        with open(out / f"stderr{rank}.txt", "w") as err:
            procs[rank] = subprocess.Popen([sys.executable, str(WORKER), str(out), "independent", fault, str(faulty),
                                            str(steps), *extra], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                           stderr=err)
    deadline = time.monotonic() + limit_s
    codes = {}
    for rank, proc in procs.items():
        if rank == faulty:
            continue
        try:
            codes[rank] = proc.wait(max(deadline - time.monotonic(), 1.0))
        except subprocess.TimeoutExpired:
            codes[rank] = None
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    for rank, code in codes.items():
        assert code == 0, f"rank {rank} exited {code}:\n{(out / f'stderr{rank}.txt').read_text()[-3000:]}"
    return {r: json.loads((out / f"rank{r}.json").read_text()) for r in codes}


LEADER_STEPS = 300


@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_a_dead_or_stopped_node_leader_ends_the_analysis_on_every_other_rank_naming_it(tmp_path, fault):
    # 4 ranks in nodes of 2 (hierarchical side channel): rank 2, the leader of ranks 2 and 3,
    # is killed or stopped at step 10; 20 ms steps outlast the 3 s a stuck gather is given.
    # The ranks start together: only the analysis connects them.
    ranks = run_ranks(tmp_path / "run", 4, fault, 2, LEADER_STEPS, "--step-ms", "20", "--node-size", "2", "--aligned")
    assert_not_blocked({r: x["step_s"] for r, x in ranks.items()}, warmup=1, expected_steps=LEADER_STEPS)
    for r, x in ranks.items():
        assert (x["outcome"], x["trained"]) == ("finished", LEADER_STEPS), x
        assert x["uninstall_s"] <= BOUND_S + MARGIN_S, x
        assert len(stop_warnings(x)) == 1, (r, x["warnings"])
    # The metrics rank's gather from rank 2 failed or stayed unfinished: it names rank 2. The
    # others stop for its decision, or for the decision's absence where the decisions'
    # broadcast, which rank 2 is part of, failed or hung before reaching them (as with the flat
    # channel); rank 3, whose gathers to its leader failed at once, names it too.
    code = GATHER_FAILED if fault == "kill" else GATHER_STUCK
    assert ranks[0]["stopped_by"][:2] == [0, code], ranks[0]["warnings"]
    assert "from rank(s) 2 " in stop_warnings(ranks[0])[0], ranks[0]["warnings"]
    if fault == "kill":
        assert "its level-0 leader, rank 2" in stop_warnings(ranks[3])[0], ranks[3]["warnings"]
    # Whole and in order up to the fault, but for the steps the leader had not forwarded yet.
    steps = ranks[0]["reported"]
    assert 5 <= len(steps) <= 10 and steps == list(range(len(steps))), steps


def test_a_peer_stopped_for_20_s_never_holds_the_other_ranks_training(tmp_path):
    code, result, stderr, _ = run_pair(tmp_path / "run", "independent", "stop", 1, 2000, "--step-ms", "10",
                                       resume_after_s=20.0, limit_s=150.0)
    assert (code, result["outcome"], result["trained"]) == (0, "finished", 2000), stderr[-3000:]
    ranks = both_ranks(tmp_path / "run")
    assert ranks[1]["outcome"] == "finished" and ranks[1]["trained"] == 2000
    # The metrics rank went on at its own pace while its peer was stopped; the peer's own
    # steps after it was resumed, too.
    assert_not_blocked({0: ranks[0]["step_s"], 1: ranks[1]["step_s"][11:]}, warmup=1)
    assert len(stop_warnings(ranks[0])) == 1 and ranks[0]["uninstall_s"] <= BOUND_S + MARGIN_S, ranks[0]


def test_a_report_thread_stalled_30_s_holds_sampling_not_training(tmp_path):
    # DDP training, 10 ms steps, every step sampled; the metrics rank's report callback
    # blocks 30 s at step 10's report.
    code, result, stderr, _ = run_pair(tmp_path / "run", "ddp", "sink-stalls", 0, 2600, "--step-ms", "10",
                                       limit_s=180.0)
    assert code == 0, stderr[-3000:]
    ranks = both_ranks(tmp_path / "run")
    assert_not_blocked({r: x["step_s"] for r, x in enumerate(ranks)}, warmup=1, expected_steps=2600)
    metrics = ranks[0]
    # Sampling held on both ranks while the report queue was half full, and resumed: the
    # analysis never stopped, no report was dropped, reports came after the stall again.
    assert [x["stopped_by"] for x in ranks] == [None, None], [x["warnings"] for x in ranks]
    assert metrics["counters"]["skipped_samples"] == ranks[1]["counters"]["skipped_samples"] > 0
    assert metrics["counters"]["dropped_reports"] == 0, metrics["counters"]
    assert metrics["reported"][-1] == 2599, metrics["reported"][-20:]
