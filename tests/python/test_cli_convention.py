"""One convention across every `relax-straggler` command: the CLI table of docs/USAGE.md
lists each command's flags as the parsers define them, --version, --format / --json /
--no-progress where they apply, one error style and exit codes, and the hints for an HTTP
address or a job the store does not hold."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from relax_straggler import __version__
from relax_straggler.cli import ALIASES, COMMANDS, build_parser, main

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures"
TRACE = REPO / "tests" / "data" / "whatif-traces" / "trace-ST.parquet"
# monitor serves over HTTP
PRINTS_A_RESULT = ("analyze", "flight-recorder", "whatif", "ingest", "feed", "parity", "patch")
RUNS_FOR_SECONDS = ("analyze", "whatif", "ingest", "feed")


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def long_flags(parser: argparse.ArgumentParser) -> set[str]:
    return {max(a.option_strings, key=len) for a in parser._actions
            if a.option_strings and not isinstance(a, argparse._HelpAction)}


def usage_table() -> dict[str, tuple[set[str], str]]:
    """{command: (flags, exit status text)} of the table in docs/USAGE.md, "Command line"."""
    text = (REPO / "docs" / "USAGE.md").read_text().split("## Command line", 1)[1]
    rows = {}
    for line in text.splitlines():
        m = re.match(r"\| `([^`]+)` \| (.*) \| (.*) \|$", line)
        if m:
            name = m.group(1).split()[0]
            rows[name] = (set(re.findall(r"`(--[a-z0-9-]+)`", m.group(2))), m.group(3))
    return rows


def run(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse: --version, --help, usage errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def test_the_usage_table_lists_every_command_with_the_parsers_flags():
    table = usage_table()
    parsers = subparsers()
    assert set(table) == set(COMMANDS) | {"relax-straggler"}
    assert set(parsers) == set(COMMANDS) | set(ALIASES)
    for old, new in ALIASES.items():  # an old name is the same command, and given alone builds only it
        assert parsers[old] is parsers[new]
        alone = next(a for a in build_parser(only=old)._actions if isinstance(a, argparse._SubParsersAction))
        assert set(alone.choices) == {old, new}
    for name in COMMANDS:
        parser = parsers[name]
        flags, exits = table[name]
        assert flags == long_flags(parser), (name, flags ^ long_flags(parser))
        for code in ("0 ", "1 ", "2 "):
            assert code in exits, (name, exits)
    assert table["relax-straggler"][0] == long_flags(build_parser(only="none"))


def test_result_and_progress_flags_where_they_apply():
    parsers = subparsers()
    for name in PRINTS_A_RESULT:
        fmt = next(a for a in parsers[name]._actions if "--format" in a.option_strings)
        assert {"text", "json"} <= set(fmt.choices) and fmt.default == "text", name
        assert "--json" in long_flags(parsers[name]), name
    for name in RUNS_FOR_SECONDS:
        assert "--no-progress" in long_flags(parsers[name]), name
    for name in ("analyze", "whatif", "ingest"):
        assert "--input-format" in long_flags(parsers[name]), name


def test_version(capsys):
    code, out, _ = run(capsys, "--version")
    assert code == 0 and out == f"relax-straggler {__version__}\n"


def test_usage_errors_have_the_one_style_and_exit_2(capsys):
    code, _, err = run(capsys, "whatif", str(TRACE), "--format", "yaml")
    assert code == 2 and err.splitlines()[-1].startswith("relax-straggler: error: argument --format")
    code, _, err = run(capsys, "replay", "--store", "file:///nonexistent/s", "--job", "x")
    assert code == 2 and err == "relax-straggler: error: replay: give either INPUT or --synthetic SPEC\n"


def test_an_http_address_gets_a_hint(capsys):
    code, _, err = run(capsys, "analyze", "http://127.0.0.1:8000/job7")
    assert code == 2
    assert err.startswith("relax-straggler: error: http://127.0.0.1:8000/job7 is an HTTP address, not an input")
    assert "file://DIR?job=ID" in err and "curl http://127.0.0.1:8000/job7" in err


def test_a_missing_job_is_named_with_the_jobs_there(tmp_path, capsys):
    store = f"file://{tmp_path}/s"
    for job in ("run-a", "run-b"):
        code, _, err = run(capsys, "feed", "--synthetic", "ranks=2,iterations=2,step_ms=1", "--store", store,
                           "--job", job, "--speed", "1000", "--no-progress")
        assert code == 0, err
    code, _, err = run(capsys, "analyze", f"{store}?job=nope")
    assert code == 1 and err == f"relax-straggler: error: no such job 'nope' in {store}; its jobs: run-a, run-b\n"
    code, _, err = run(capsys, "analyze", f"{store}?jb=run-a")  # a malformed store URL: usage
    assert code == 2 and err.startswith("relax-straggler: error: store URL")


def test_analyze_help_names_store_urls_and_the_or_rule(capsys):
    _, out, _ = run(capsys, "analyze", "--help")
    flat = " ".join(out.split())
    assert "file://DIR?job=ID" in flat and "clickhouse://HOST:PORT/DB?job=ID" in flat
    assert "slow when t >= ref x this or t - ref >= --absolute-ms-threshold" in flat


def test_feed_writes_its_result_as_json(tmp_path, capsys):
    path = tmp_path / "feed.json"
    code, out, _ = run(capsys, "feed", "--synthetic", "ranks=2,iterations=3,step_ms=1", "--store",
                       f"file://{tmp_path}/s", "--job", "j", "--speed", "1000", "--format", "json", "--json", str(path))
    assert code == 0
    printed = json.loads(out)
    assert printed == json.loads(path.read_text())
    assert printed["iterations"] == 3 and printed["rows"] > 0 and printed["job"] == "j"


def test_whatif_writes_its_result_as_json(tmp_path, capsys):
    path = tmp_path / "whatif.json"
    code, out, err = run(capsys, "whatif", str(TRACE), "--json", str(path), "--no-progress")
    assert code == 0, err
    assert out.startswith("the job runs ")  # the text report on stdout
    assert json.loads(path.read_text())["slowdown"] > 1.0


def test_ingest_input_format_and_its_old_spelling(tmp_path, capsys):
    log = str(FIXTURES / "megatron_all.log")
    code, out, err = run(capsys, "ingest", log, "--store", f"file://{tmp_path}/s", "--job", "new",
                         "--input-format", "megatron-log", "--format", "json", "--no-progress")
    assert code == 0, err
    assert json.loads(out)["rows"] > 0
    code, out, err = run(capsys, "ingest", log, "--store", f"file://{tmp_path}/s", "--job", "old",
                         "--format", "megatron-log", "--no-progress")
    assert code == 0, err
    assert "--format megatron-log for the input format is deprecated: use --input-format megatron-log" in err
    assert out.startswith("wrote ")


def test_patch_check_gives_its_result_as_json(tmp_path, capsys):
    import shutil

    shutil.copytree(FIXTURES / "patch_hosts" / "relax", tmp_path, dirs_exist_ok=True)
    code, out, err = run(capsys, "patch", "relax", str(tmp_path), "--check", "--format", "json")
    assert code == 0, err
    result = json.loads(out)
    assert result["mode"] == "check" and result["exit_status"] == 0
    assert result["patches"] and {p["state"] for p in result["patches"]} == {"applies"}
