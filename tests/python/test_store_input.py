"""A job's rows in a file store as an analyze input (file://DIR?job=ID), as for ClickHouse:
the straggler a fed job holds is named, a missing store or job is a clean error."""

import json

from relax_straggler.cli import main as cli_main
from relax_straggler.monitor.feed import Injection, Synthetic, feed
from relax_straggler.stores.opener import open_store


def test_analyze_names_the_straggler_of_a_job_in_a_file_store(tmp_path, capsys):
    store = open_store(f"file://{tmp_path}/store")
    try:
        feed(Synthetic(ranks=8, iterations=30, step_ms=100, seed=3).steps(), store, "job-f", speed=1e9,
             injections=[Injection.parse("5:forward:80:10")], ranks_per_node=4)
    finally:
        store.close()
    url = f"file://{tmp_path}/store?job=job-f"
    assert cli_main(["analyze", url, "--dp", "8", "--format", "json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["input"]["path"] == url
    assert [a["ranks"] for a in summary["anomalies"]] == [[5]], summary["anomalies"]


def test_a_missing_file_store_or_job_is_a_clean_error(tmp_path, capsys):
    assert cli_main(["analyze", f"file://{tmp_path}/nowhere?job=j"]) == 1
    assert "nowhere" in capsys.readouterr().err
    open_store(f"file://{tmp_path}/empty").close()
    assert cli_main(["analyze", f"file://{tmp_path}/empty?job=j"]) == 1
    assert "no such job 'j'" in capsys.readouterr().err  # the store holds no job at all


def _damaged_store(tmp_path, iterations: int, damaged: list[int]) -> str:
    """A file store written by the store itself, one frame per iteration (8 ranks, rank 5
    slow in forward), then a byte flipped inside the frames of the `damaged` iterations:
    frames in the middle of the segment, which any recovery keeps as they are and any read
    must skip (their checksum fails). Returns the analyze URL."""
    store = open_store(f"file://{tmp_path}/store")
    try:
        feed(Synthetic(ranks=8, iterations=iterations, step_ms=100, seed=3).steps(), store, "job-d", speed=1e9,
             injections=[Injection.parse("5:forward:80:0")], end_of_run=False)
    finally:
        store.close()
    job_dir = tmp_path / "store" / "jobs" / "job-d"
    frames = [json.loads(line) for line in (job_dir / "index.jsonl").read_text().splitlines()]
    assert len(frames) == iterations and all(f["its"][0][0] == i for i, f in enumerate(frames))
    with open(job_dir / f"seg-{frames[0]['seg']:06d}.arrows", "r+b") as seg:
        for i in damaged:
            seg.seek(frames[i]["off"] + frames[i]["len"] // 2)
            byte = seg.read(1)
            seg.seek(-1, 1)
            seg.write(bytes([byte[0] ^ 0xFF]))
    return f"file://{tmp_path}/store?job=job-d"


def test_damaged_frames_are_counted_and_past_a_tenth_leave_no_verdict(tmp_path, capsys):
    damaged = list(range(100, 298))  # 198 of 400 iterations, in the middle of the segment
    url = _damaged_store(tmp_path, 400, damaged)
    assert cli_main(["analyze", url, "--dp", "8", "--format", "json"]) == 1
    summary = json.loads(capsys.readouterr().out)
    problems = summary["input"]["problems"]
    assert (problems["steps_listed"], problems["steps_lost"]) == (400, 198)
    assert problems["by_kind"]["unreadable"] == 198
    assert any("iteration 100:" in p and "missing" in p for p in problems["first"]), problems["first"]
    assert summary["input"]["steps"] == 202
    assert summary["verdict"]["status"] == "inconclusive" and summary["verdict"]["reason"] == "rejected_input"
    assert "198 of the 400 steps" in summary["verdict"]["summary"]
    assert cli_main(["analyze", url, "--dp", "8", "--format", "json", "--strict"]) == 1
    err = capsys.readouterr().err
    assert "iteration 100:" in err and "--strict" in err


def test_a_few_damaged_frames_are_counted_and_the_verdict_stands(tmp_path, capsys):
    url = _damaged_store(tmp_path, 100, [40, 41, 60])
    assert cli_main(["analyze", url, "--dp", "8", "--format", "json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    problems = summary["input"]["problems"]
    assert (problems["steps_listed"], problems["steps_lost"], problems["total"]) == (100, 3, 3)
    assert summary["verdict"]["status"] == "stragglers"
    assert [a["ranks"] for a in summary["anomalies"]] == [[5]]
