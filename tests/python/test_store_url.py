"""The one store-URL parser: stores, the live sink and analyze inputs read URLs alike."""

import pytest

from relax_straggler.readers.base import InputError
from relax_straggler.readers.store_input import LAST_ITERATION, parse_input_url
from relax_straggler.stores.url import parse_store_url, parse_writer_url


def test_store_urls_name_their_parts():
    ch = parse_store_url("clickhouse://h:9000/metrics")
    assert (ch.scheme, ch.location, ch.port, ch.database, ch.url) == ("clickhouse", "h", 9000, "metrics",
                                                                      "clickhouse://h:9000/metrics")
    assert (parse_store_url("clickhouse://h").port, parse_store_url("clickhouse://h").database) == (8123, "default")
    f = parse_store_url("file:///var/lib/s")
    assert (f.scheme, f.location, f.port, f.database) == ("file", "/var/lib/s", None, "")


@pytest.mark.parametrize("url, accept, message", [
    ("http://h:1/", (), "scheme must be file:// or clickhouse://"),
    ("file://", (), "file:// needs a directory"),
    ("clickhouse:///db", (), "clickhouse:// needs a host"),
    ("clickhouse://h/bad-db", (), "database 'bad-db' must be letters"),
    ("file:///s?job=a", (), r"unknown parameter\(s\) \['job'\]; expected no query"),
    ("file:///s?first=1", ("job",), r"unknown parameter\(s\) \['first'\]; expected job=\.\.\."),
    ("file:///s?job", ("job",), "malformed query"),
    ("file:///s?first=x", ("first",), "first='x' is not an iteration number"),
    ("file:///s?last=-1", ("last",), "last must be >= 0"),
    ("file:///s?first=5&last=4", ("first", "last"), r"first \(5\) is after last \(4\)"),
])
def test_bad_urls_are_refused_naming_the_part(url, accept, message):
    with pytest.raises(ValueError, match=message):
        parse_store_url(url, accept)


def test_query_parameters_keep_the_last_value():
    parsed = parse_store_url("clickhouse://h/db?job=a&job=b&first=3", accept=("job", "first", "last"))
    assert (parsed.url, parsed.job, parsed.first, parsed.last) == ("clickhouse://h/db", "b", 3, None)


def test_writers_need_a_job_id_the_monitor_can_serve():
    assert parse_writer_url("file:///s?job=run.7").job == "run.7"
    with pytest.raises(ValueError, match="cannot be registered with the monitor"):
        parse_writer_url("file:///s?job=a/b")


def test_analyze_inputs_need_a_job_and_default_to_every_iteration():
    assert parse_input_url("clickhouse://h/db?job=j") == ("clickhouse://h/db", "j", 0, LAST_ITERATION)
    assert parse_input_url("clickhouse://h/db?job=j&first=2&last=9") == ("clickhouse://h/db", "j", 2, 9)
    with pytest.raises(InputError, match="the job is missing"):
        parse_input_url("clickhouse://h/db?first=2")
    with pytest.raises(InputError, match="unknown parameter"):
        parse_input_url("clickhouse://h/db?job=j&step=2")
