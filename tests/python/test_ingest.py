"""`relax-straggler ingest` into a real ClickHouse server, and `analyze clickhouse://...` back."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from conftest import free_port
from relax_straggler.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
_databases = itertools.count()


@pytest.fixture
def db_url(clickhouse_server):
    return clickhouse_server.url(f"test_ingest_{next(_databases)}")


def analyze_json(capsys, *args: str) -> dict:
    capsys.readouterr()
    assert main(["analyze", *args, "--format", "json", "--no-progress"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def ingest(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["ingest", *args, "--no-progress"])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("name, layout", [
    ("megatron_all.log", ["--dp", "2", "--pp", "2", "--tp", "2"]),  # the log declares this layout
    ("straggler.jsonl", []),
    ("timeline-small.json.gz", ["--dp", "2", "--pp", "2"]),  # the trace declares this layout
])
def test_analysis_from_clickhouse_matches_the_file(capsys, db_url, name, layout):
    path = str(FIXTURES / name)
    code, out, err = ingest(capsys, path, "--store", db_url, "--job", f"job-{name}")
    assert code == 0, err
    assert out.startswith("wrote ") and "0 problems" in out
    direct = analyze_json(capsys, path, *layout)
    stored = analyze_json(capsys, f"{db_url}?job=job-{name}", *layout)
    assert direct["verdict"]["status"] == "stragglers"  # the fixtures have a straggler to find
    assert stored["verdict"] == direct["verdict"]
    assert stored["per_rank"] == direct["per_rank"]
    assert stored["input"]["steps"] == direct["input"]["steps"]
    if direct["input"]["median_step_ms"] is not None:  # else ingest wrote the slowest rank's sum of stages
        assert stored["input"]["median_step_ms"] == direct["input"]["median_step_ms"]


def test_iteration_range_of_the_clickhouse_input(capsys, db_url):
    assert ingest(capsys, str(FIXTURES / "straggler.jsonl"), "--store", db_url, "--job", "j")[0] == 0
    whole = analyze_json(capsys, f"{db_url}?job=j")
    part = analyze_json(capsys, f"{db_url}?job=j&first=10&last=30")
    assert part["input"]["steps"] == 3 < whole["input"]["steps"]


def test_bad_records_are_listed_with_file_and_line(capsys, db_url, tmp_path):
    lines = (FIXTURES / "straggler.jsonl").read_text().splitlines()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([lines[0], "{not json", lines[1], '{"step": 99, "stages": ["warp"], "device_ms": [[1]]}',
                              *lines[2:]]) + "\n")
    code, out, err = ingest(capsys, str(bad), "--store", db_url, "--job", "lenient")
    assert code == 0
    assert f"{bad}:2: not a JSON object" in err and f"{bad}:4: 'stages': unknown stage" in err
    assert out.endswith("2 problems\n") and f"({len(lines)} steps)" in out
    code, _, err = ingest(capsys, str(bad), "--store", db_url, "--job", "strict", "--strict")
    assert code == 1 and f"{bad}:2:" in err and "--strict" in err


def test_refusals_are_one_line_errors(capsys, db_url):
    jsonl = str(FIXTURES / "straggler.jsonl")
    assert ingest(capsys, jsonl, "--store", db_url, "--job", "once")[0] == 0
    code, _, err = ingest(capsys, jsonl, "--store", db_url, "--job", "once")
    assert code == 1 and "already has rows" in err and "--append" in err
    assert ingest(capsys, jsonl, "--store", db_url, "--job", "once", "--append")[0] == 0
    code, _, err = ingest(capsys, str(FIXTURES / "megatron_minmax.log"), "--store", db_url, "--job", "mm")
    assert code == 1 and "min/max timer log has no per-rank times" in err
    code, _, err = ingest(capsys, jsonl, "--store", f"clickhouse://127.0.0.1:{free_port()}/x", "--job", "j")
    assert code == 1 and "Connection refused" in err and "Traceback" not in err
    code, _, err = ingest(capsys, jsonl, "--store", "http://x/", "--job", "j")
    assert code == 2 and "scheme must be" in err


@pytest.mark.parametrize("job", ["my run", "../x", ".hidden", "a" * 129])
def test_a_job_id_the_monitor_cannot_serve_is_refused(capsys, tmp_path, job):
    code, _, err = ingest(capsys, str(FIXTURES / "straggler.jsonl"), "--store", f"file://{tmp_path}/s", "--job", job)
    assert code == 2 and "cannot be registered with the monitor" in err, err
    assert not (tmp_path / "s" / "jobs").exists() or not list((tmp_path / "s" / "jobs").iterdir())


def test_a_user_who_may_not_write_fails_at_once_and_a_store_down_is_retried(clickhouse_server, capsys, monkeypatch):
    import relax_straggler.monitor.ingest as ingest_module

    waits: list[float] = []  # time.sleep, s: the command's retries and the store's
    monkeypatch.setattr(ingest_module.time, "sleep", waits.append)
    reader = clickhouse_server.url(f"test_ingest_{next(_databases)}", user="reader")
    code, _, err = ingest(capsys, str(FIXTURES / "straggler.jsonl"), "--store", reader, "--job", "ro")
    assert code == 1 and "user 'reader' may not write" in err
    assert waits == []  # a refusal that cannot change is not retried
    down = f"clickhouse://127.0.0.1:{free_port()}/db"
    code, _, err = ingest(capsys, str(FIXTURES / "straggler.jsonl"), "--store", down, "--job", "j")
    assert code == 1 and "Connection refused" in err
    # the check for the job's rows is retried as writes are (between the store's own short retries)
    assert [w for w in waits if w >= 1] == [1.0, 2.0, 4.0]
