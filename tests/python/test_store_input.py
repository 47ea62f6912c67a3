"""A job's rows in a file store as an analyze input (file://DIR?job=ID), as for ClickHouse:
the straggler a replayed job holds is named, a missing store or job is a clean error."""

import json

from relax_straggler.cli import main as cli_main
from relax_straggler.monitor.replay import Injection, Synthetic, replay
from relax_straggler.stores.opener import open_store


def test_analyze_names_the_straggler_of_a_job_in_a_file_store(tmp_path, capsys):
    store = open_store(f"file://{tmp_path}/store")
    try:
        replay(Synthetic(ranks=8, iterations=30, step_ms=100, seed=3).steps(), store, "job-f", speed=1e9,
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
    assert "no usable row (0 rows read)" in capsys.readouterr().err
