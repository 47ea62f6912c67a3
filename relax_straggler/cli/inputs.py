"""The input options and the problems report shared by `relax-straggler analyze` and
`relax-straggler whatif`: one format detection, one --strict, one way of naming the file
and row of each skipped record."""

from __future__ import annotations

import argparse
from typing import Any, Callable, Optional, TypeVar

T = TypeVar("T")

FORMATS = ("straggler-jsonl", "megatron-log", "chrome-trace", "parquet-trace")
# PyTorch Flight Recorder dumps (a directory, glob or file of per-rank pickles): answers
# a hang, not a straggler analysis, so only `analyze` takes them (cli/flight_recorder.py).
FLIGHT_RECORDER = "flight-recorder"


def add_input_arguments(parser: argparse.ArgumentParser, formats: tuple[str, ...] = FORMATS) -> None:
    """--input-format, --strict, --meta, --dp/--pp/--tp/--dsp and --ranks-per-node."""
    io = parser.add_argument_group("input")
    io.add_argument("--input-format", choices=formats, default=None, help="input format (default: detected)")
    io.add_argument("--strict", action="store_true", help="stop at the first malformed record instead of skipping it")
    io.add_argument("--meta", default=None,
                    help="job metadata YAML (dp_size, pp_size, tp_size, dsp_size, vpp_size) for a trace; "
                         "default: meta-NAME.yaml beside trace-NAME / timeline-NAME")
    io.add_argument("--dp", type=int, default=None, help="data-parallel size (with --pp, --tp and --dsp)")
    io.add_argument("--pp", type=int, default=None, help="pipeline-parallel size")
    io.add_argument("--tp", type=int, default=None, help="tensor-parallel size")
    io.add_argument("--dsp", type=int, default=None,
                    help="context / sequence-data parallel size (Megatron's context_parallel_size, a trace's dsp_size)")
    io.add_argument("--ranks-per-node", type=int, default=None, help="ranks per node, to name nodes")


def read_reporting_errors(err: Any, path: str, read: Callable[[], T]) -> tuple[Optional[int], Optional[T]]:
    """(None, read()), or (exit code, None) after printing the error on the rich console
    `err`: 1 for an input that cannot be read or analysed (InputError, OSError), 2 for a bad
    argument (ValueError)."""
    from relax_straggler.readers import InputError

    try:
        return None, read()
    except InputError as exc:
        err.print(f"[red]error:[/] {exc}", highlight=False, soft_wrap=True)
        return 1, None
    except OSError as exc:
        err.print(f"[red]error:[/] cannot read {exc.filename or path}: {exc.strerror or exc}", highlight=False,
                  soft_wrap=True)
        return 1, None
    except ValueError as exc:
        err.print(f"[red]error:[/] {exc}", highlight=False, soft_wrap=True)
        return 2, None


def topology_from_args(args: argparse.Namespace):
    """The layout of --dp/--pp/--tp/--dsp (missing sizes are 1), or None when none is given.
    Raises ValueError for a size < 1 or a world beyond MAX_WORLD_SIZE."""
    from relax_straggler.topology import make_layout

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
