"""The input options and the problems report shared by `relax-straggler analyze` and
`relax-straggler whatif`: one format detection, one --strict, one way of naming the file
and row of each skipped record."""

from __future__ import annotations

import argparse
import re
from typing import Any, Callable, Optional, TypeVar

from relax_straggler.cli.common import EXIT_DATA, EXIT_USAGE, error

T = TypeVar("T")

FORMATS = ("straggler-jsonl", "megatron-log", "chrome-trace", "parquet-trace")
# PyTorch Flight Recorder dumps (a directory, glob or file of per-rank pickles): answers
# a hang, not a straggler analysis: their own command, cli/flight_recorder.py, and `analyze`.
FLIGHT_RECORDER = "flight-recorder"


def add_input_arguments(parser: argparse.ArgumentParser, formats: tuple[str, ...] = FORMATS) -> None:
    """--input-format, --strict, --meta, --dp/--pp/--tp/--dsp and --ranks-per-node."""
    io = parser.add_argument_group("input")
    io.add_argument("--input-format", choices=formats, default=None, help="input format (default: detected)")
    io.add_argument("--strict", action="store_true", help="stop at the first malformed record instead of skipping it")
    io.add_argument("--meta", default=None,
                    help="job metadata YAML (dp_size, pp_size, tp_size, dsp_size, vpp_size) for a trace; "
                         "default: meta-NAME.yaml beside trace-NAME / timeline-NAME")
    add_layout_arguments(io)
    io.add_argument("--ranks-per-node", type=int, default=None, help="ranks per node, to name nodes")


def add_layout_arguments(group: Any) -> None:
    """--dp/--pp/--tp/--dsp, the job's layout (topology_from_args), to `group` (a parser or
    an argument group)."""
    group.add_argument("--dp", type=int, default=None, help="data-parallel size (with --pp, --tp and --dsp)")
    group.add_argument("--pp", type=int, default=None, help="pipeline-parallel size")
    group.add_argument("--tp", type=int, default=None, help="tensor-parallel size")
    group.add_argument("--dsp", type=int, default=None,
                       help="context / sequence-data parallel size (Megatron's context_parallel_size, a trace's "
                            "dsp_size)")


def read_reporting_errors(err: Any, path: str, read: Callable[[], T]) -> tuple[Optional[int], Optional[T]]:
    """(None, read()), or (exit code, None) after printing the error on the rich console
    `err`: 1 for an input that cannot be read or analysed (InputError, OSError), 2 for a bad
    argument (ValueError)."""
    from relax_straggler.readers import InputError

    try:
        return None, read()
    except InputError as exc:
        return error(str(exc), EXIT_DATA), None
    except OSError as exc:
        return error(f"cannot read {exc.filename or path}: {exc.strerror or exc}", EXIT_DATA), None
    except ValueError as exc:
        return error(str(exc), EXIT_USAGE), None


_SHOWN_JOBS = 10


def input_path_error(path: str) -> Optional[int]:
    """The exit code, after printing the error, for an input that is wrong before anything
    is read: an HTTP address (with the hint of what to give instead), a malformed store
    URL (both usage, 2) or a store URL whose job the store does not hold (1, listing some
    of its jobs). None otherwise (also when the store cannot be opened: reading says why)."""
    if re.match(r"https?://", path, re.IGNORECASE):
        return error(f"{path} is an HTTP address, not an input: to analyze a job the monitor watches, give its "
                     "metrics store and job, 'file://DIR?job=ID' or 'clickhouse://HOST:PORT/DB?job=ID'; the "
                     f"monitor's own answer for the job is at GET {path} (e.g. curl {path})", EXIT_USAGE)
    if not path.startswith(("clickhouse://", "file://")):
        return None
    from relax_straggler.readers import InputError
    from relax_straggler.readers.store_input import parse_input_url
    from relax_straggler.stores.base import StoreError
    from relax_straggler.stores.opener import open_store
    from relax_straggler.stores.url import redact

    try:
        store_url, job, _, _ = parse_input_url(path)
    except InputError as exc:
        return error(str(exc), EXIT_USAGE)
    try:
        store = open_store(store_url, create=False)
    except (ValueError, StoreError):
        return None
    try:
        jobs = sorted(store.jobs())
    except StoreError:
        return None
    finally:
        store.close()
    if job in jobs:
        return None
    listed = ", ".join(jobs[:_SHOWN_JOBS]) + (f", ... ({len(jobs)} in all)" if len(jobs) > _SHOWN_JOBS else "")
    return error(f"no such job {job!r} in {redact(store_url)}; " +
                 (f"its jobs: {listed}" if jobs else "it holds no job"), EXIT_DATA)


def topology_from_args(args: argparse.Namespace):
    """The layout of --dp/--pp/--tp/--dsp (missing sizes are 1), or None when none is given.
    Raises ValueError for a size < 1 or a world beyond MAX_WORLD_SIZE."""
    from relax_straggler.common.topology import make_layout

    sizes = (args.dp, args.pp, args.tp, args.dsp)
    if all(x is None for x in sizes):
        return None
    dp, pp, tp, dsp = (1 if x is None else x for x in sizes)
    return make_layout(dp, pp, tp, cp=dsp)


def problem_lines(problems, records: int, limit: int = 5) -> list[str]:
    """"FILE:ROW: message" of the first problems, and the counts of all (readers.Problems
    over `records` records read)."""
    from relax_straggler.readers.base import problems_line

    if problems is None or not problems.total:
        return []
    lines = [str(p) for p in problems.kept[:limit]]
    if problems.total > len(lines):
        lines.append(problems_line(problems.facts(records)) + " in all")
    return lines


def print_problems(problems, records: int, err, limit: Optional[int] = 5) -> None:
    """Prints problem_lines on the rich console `err`."""
    for line in problem_lines(problems, records, limit):
        err.print(f"[yellow]problem:[/] {line}", highlight=False, soft_wrap=True)
