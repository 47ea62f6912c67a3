"""A store URL's password is never shown: not in URL errors, the store's and the sink's
messages, the monitor's answers, logs and state file, ingest's output nor analyze's
errors; a rotated password keeps the monitor's state."""

from __future__ import annotations

import json
import logging

import pytest

from conftest import free_port
from relax_straggler.cli import main as cli_main
from relax_straggler.monitor.service import Monitor, MonitorConfig
from relax_straggler.reporters.store_sink import StoreSink
from relax_straggler.stores.url import parse_store_url, redact

SECRET = "hunter2"


def down_url(tail: str = "/db") -> str:
    """A ClickHouse URL with a password, on a port nobody listens on."""
    return f"clickhouse://ops:{SECRET}@127.0.0.1:{free_port()}{tail}"


@pytest.mark.parametrize("tail", ["/bad-db", "/db?table=a-b", "/db?nope=1", "/db?job=j&first=5&last=2"])
def test_url_errors_show_the_password_as_stars(tail):
    accept = ("job", "first", "last")
    with pytest.raises(ValueError) as info:
        parse_store_url(down_url(tail), accept=accept)
    assert SECRET not in str(info.value) and "ops:***@" in str(info.value)


def test_a_password_with_a_slash_is_refused_without_showing_it():
    with pytest.raises(ValueError, match=r"port is not a number.*percent-encoded") as info:
        parse_store_url("clickhouse://ops:hunt/er2@127.0.0.1:8123/db")
    assert "hunt" not in str(info.value)
    assert redact(f"clickhouse://ops:{SECRET}@h:1/db") == "clickhouse://ops:***@h:1/db"
    assert parse_store_url(f"clickhouse://ops:{SECRET}@h:1/db").shown == "clickhouse://ops:***@h:1/db"


def test_the_sink_logs_the_store_without_its_password(caplog):
    caplog.set_level(logging.INFO)
    sink = StoreSink(down_url() + "?job=j", flush_interval_s=0.05, log_every_s=0.0)
    assert SECRET not in repr(sink)
    from test_sink import fake_report

    sink.write(fake_report(0))
    sink.flush(timeout_s=1)
    sink.close(timeout_s=0.2)
    messages = [r.getMessage() for r in caplog.records]
    assert any("ops:***@" in m for m in messages), messages
    assert not any(SECRET in m for m in messages), messages


def test_the_monitor_shows_the_store_without_its_password_and_keeps_its_state_across_a_rotation(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    port = free_port()
    state = str(tmp_path / "state.json")
    m = Monitor(MonitorConfig(f"clickhouse://ops:{SECRET}@127.0.0.1:{port}/mon", state_path=state))
    try:
        m.poll_once()
        assert m.health()["url"] == f"clickhouse://ops:***@127.0.0.1:{port}/mon"
    finally:
        m.stop()
    with open(state) as fh:
        assert SECRET not in fh.read()
    assert not any(SECRET in r.getMessage() for r in caplog.records)
    Monitor(MonitorConfig(f"clickhouse://ops:rotated@127.0.0.1:{port}/mon", state_path=state)).stop()


def test_ingest_and_analyze_never_print_the_password(tmp_path, capsys):
    jsonl = tmp_path / "straggler.jsonl"
    jsonl.write_text(json.dumps({"step": 0, "stages": ["forward"], "device_ms": [[1.0], [2.0]]}) + "\n")
    assert cli_main(["ingest", str(jsonl), "--store", down_url(), "--job", "j1"]) == 1
    assert cli_main(["analyze", down_url("/db?job=j1")]) == 1
    out, err = capsys.readouterr()
    assert SECRET not in out + err and "ops:***@" in err
