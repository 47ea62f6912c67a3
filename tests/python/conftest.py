"""Shared helpers: run the demo under torchrun on 127.0.0.1 and read its reports."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import pytest

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "examples" / "train_gpt.py"
# A model small enough that stage times stay near 1 ms. Four ranks (each with its Gloo
# threads) share two cores here, so scheduling alone moves a stage or an all-reduce
# wait by up to ~11 ms (a 200-step control run: p99 10 ms, max 11 ms, in backward and
# communication): the per-step RFC rule flags such jitter, the confirmed verdict (with
# its default settings, as users get them) must not.
TINY = ["--layers", "1", "--d-model", "32", "--heads", "2", "--seq-len", "16", "--batch-size", "2",
        "--corpus-bytes", "200000", "--contend-rank", "-1", "--log-every", "1000"]


class WorkerCrashed(RuntimeError):
    """A training process was killed by a signal: torch's Gloo teardown can abort one at
    interpreter exit (pytorch#190489), whatever the analyzer does."""


# The mark of every module that runs real training processes (pytestmark = REAL_RUNS). Such a
# test runs again, up to twice, only when a process crashed (WorkerCrashed): an infrastructure
# flake. A failed assertion or a timeout fails at once, on a loaded machine too: a detection
# or a step-time bound that needs a quiet host is a defect. The numbers themselves are
# measured in benchmarks/ (docs/PERFORMANCE.md), never here.
REAL_RUNS = pytest.mark.flaky(reruns=2, reruns_delay=5, only_rerun=[WorkerCrashed])
_KILLED = re.compile(r"exitcode\s*:\s*-\d+|Signal \d+ \(SIG\w+\) received")  # torchrun's report of a child


def torchrun(nproc: int, script: Path, args: list[str], timeout_s: float = 300.0) -> subprocess.CompletedProcess:
    """Runs `script` on `nproc` Gloo ranks (torchrun --standalone picks a free port). Raises
    WorkerCrashed when a rank was killed by a signal, AssertionError for any other failure."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", str(script), *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        what = f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        if proc.returncode < 0 or _KILLED.search(proc.stderr):
            raise WorkerCrashed(what)
        raise AssertionError(what)
    return proc


# `make test` runs the Python tests in two passes. The first runs, on two pytest workers, every
# test but these: every test that runs training processes (added below) and those that measure
# CPU shares (spinners pinned to a core, run-queue waits).
ONE_AT_A_TIME = pytest.mark.one_at_a_time
# The second pass runs these in two streams, each one test at a time: the tests whose claims
# are what the analysis finds (which rank, how soon: the verdict's and the hang watchdog's) or
# CPU shares (DETECTION), and the rest (faults, bit-for-bit runs, runtime control). The streams
# run side by side where the host has about four cores free (free_cores.py), one after the
# other otherwise: a detection shares its cores with the host's own load or, on a larger
# host, runs beside one other test on cores of its own, never beside another detection.
DETECTION = pytest.mark.detection


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "one_at_a_time: runs in make test's second pass (conftest.py)")
    config.addinivalue_line("markers", "detection: in make test's second pass, the stream of detections (conftest.py)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks every test that runs training processes (REAL_RUNS, or a module that calls
    torchrun) ONE_AT_A_TIME."""
    for item in items:
        if item.get_closest_marker("flaky") is not None or getattr(item.module, "torchrun", None) is torchrun:
            item.add_marker(ONE_AT_A_TIME)


def read_jsonl(path: Path) -> list[dict]:
    with open(path) as fh:
        return [json.loads(line) for line in fh]


def assert_every_sample_reported(reported: Sequence[int], sampled: range, skipped: int) -> None:
    """Fails unless `reported` (the reports' steps, in order) are the steps of `sampled`, but
    for samples skipped: the periods the metrics rank held sampling (behind on a loaded host,
    every rank skips a sample rather than wait for it). `skipped`: straggler/skipped_samples
    as of the last report, which counts the skips before that report's step (and any while it
    was built); steps after the last report may be missing only where sampling was held."""
    assert reported, "no report was written"
    present = set(reported)
    assert list(reported) == sorted(present) and present <= set(sampled), list(reported)
    missing = [s for s in sampled if s < reported[-1] and s not in present]
    assert len(missing) <= skipped, f"no report for steps {missing}; {skipped} samples counted as skipped"
    assert reported[-1] == sampled[-1] or skipped > 0, f"the reports end at step {reported[-1]} of {list(sampled)}"


def demo_summary(out: Path) -> dict:
    """The demo's summary.json in `out`, once its step-time guard passed: no step of any rank
    was held (tests/python/workers/step_times.py)."""
    from workers.step_times import assert_not_blocked

    with open(out / "summary.json") as fh:
        summary = json.load(fh)
    assert_not_blocked({r: [ms / 1e3 for ms in times] for r, times in enumerate(summary["step_ms_by_rank"])},
                       warmup=1, expected_steps=summary["steps"])
    return summary


@pytest.fixture
def run_demo(tmp_path):
    """run_demo(nproc, *extra_args) -> (reports, summary) of one demo run (its step-time guard passed)."""

    def run(nproc: int, *extra: str) -> tuple[list[dict], dict]:
        out = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        torchrun(nproc, DEMO, [*TINY, "--straggler-analysis", "--output", str(out), *extra])
        return read_jsonl(out / "straggler.jsonl"), demo_summary(out)

    return run


# ClickHouse ---------------------------------------------------------------------------
# A private ClickHouse 26.9 server process on 127.0.0.1: url(db, user), start(), stop(), kill().
sys.path.insert(0, str(REPO / "tests" / "services"))
from chdb_front import ServerProcess as ClickHouseServer  # noqa: E402
def free_port() -> int:
    """A port free now on 127.0.0.1, taken below the kernel's ephemeral range: a port the
    kernel handed out (bind to 0) goes back to its pool and the next outgoing connection of a
    test running beside this one (Gloo's, a store client's) may take it before the rendezvous
    listens on it (EADDRINUSE)."""
    import random
    import socket

    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(100):
        port = random.randrange(10000, max(low, 10001))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout_s: float = 60.0, what: str = "condition"):
    """Polls predicate() every 50 ms until it returns a truthy value, which is returned;
    AssertionError naming `what` after timeout_s (generous: the machine may be loaded)."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def require_chdb() -> None:
    """Skips the test without the chdb package, or fails under CI=true (requirements.txt)."""
    try:
        import chdb  # noqa: F401
    except ImportError:
        message = "chdb is not installed: run `make setup` (requirements.txt)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="session")
def clickhouse_server(tmp_path_factory):
    """The session's ClickHouseServer (started once, stopped at the end)."""
    require_chdb()
    server = ClickHouseServer(tmp_path_factory.mktemp("clickhouse"), free_port())
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def clickhouse_url(clickhouse_server) -> str:
    """clickhouse://127.0.0.1:PORT/default of the session's private server."""
    return clickhouse_server.url()


# Stores --------------------------------------------------------------------------------
# Every store-level test runs against each of these: a store joins by adding its name here
# and a fixture `<name>_url`.
STORES = ["file", "clickhouse"]


@pytest.fixture
def file_url(tmp_path) -> str:
    """file:// URL of an embedded store in the test's temporary directory."""
    return f"file://{tmp_path}/store"


@pytest.fixture(params=STORES)
def store_url(request) -> str:
    """The URL of each store in STORES in turn."""
    return request.getfixturevalue(f"{request.param}_url")
