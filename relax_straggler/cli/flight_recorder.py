"""`relax-straggler flight-recorder PATH`: the hang answer (which rank holds which
collective) and the slow-collective evidence from PyTorch Flight Recorder dumps, printed or
as JSON (docs/ANALYZE.md, "Flight Recorder dumps"). `relax-straggler analyze` on dumps runs
the same (cli/analyze.py).

Exit status: 0 the dumps were read (whatever they show); 1 they cannot be (the message
names the file and field) or a file cannot be written; 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from relax_straggler.cli.common import add_output_arguments, error
from relax_straggler.cli.inputs import add_layout_arguments, read_reporting_errors, topology_from_args
from relax_straggler.common.metric_names import HANG_ANSWER, HANG_KIND


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "flight-recorder", help="Name the rank that holds a hung job, from PyTorch Flight Recorder dumps.",
        description="Name the rank and collective that hold a hung job, and the slowest collectives, from PyTorch "
                    "Flight Recorder dumps (one per rank). See docs/ANALYZE.md, \"Flight Recorder dumps\".")
    p.add_argument("path", help="a directory or glob of Flight Recorder dumps (nccl_trace_rank_<rank>), or one dump")
    add_layout_arguments(p.add_argument_group("input"))
    add_output_arguments(p, text="terminal report", json_what="the JSON summary")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return report(args, ())


def report(args: argparse.Namespace, notes: Sequence[str]) -> int:
    """Reads the dumps at args.path (the job's ranks from --dp/--pp/--tp/--dsp when given),
    writes the JSON summary to args.json_path when given, prints `notes` on stderr (each
    prefixed "note: ") and the answer on stdout (args.format text or json). The exit status
    of the module docstring."""
    from rich.console import Console

    from relax_straggler.hang.flight_recorder import read_flight_recorder

    err = Console(stderr=True)

    def read() -> dict[str, Any]:
        topology = topology_from_args(args)
        return read_flight_recorder(args.path, topology.world_size if topology else None).summary()

    code, summary = read_reporting_errors(err, args.path, read)
    if code is not None:
        return code
    text = json.dumps(summary, indent=2, allow_nan=False)
    if args.json_path:
        try:
            with open(args.json_path, "w", encoding="utf-8") as f:
                f.write(text + "\n")
        except OSError as exc:
            return error(f"cannot write {exc.filename}: {exc.strerror}")
    for line in notes:
        err.print(f"note: {line}", highlight=False, soft_wrap=True)
    if args.format == "json":
        sys.stdout.write(text + "\n")
    else:
        render(summary, Console())
    return 0


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def render(summary: dict[str, Any], console: Any) -> None:
    """The terminal report of a Flight Recorder summary on the rich console `console`."""
    from rich.table import Table

    inp, hang = summary["input"], summary["hang"]
    versions = ", ".join(inp["versions"])
    ranks = f"rank{'' if inp['dumps'] == 1 else 's'} {inp['ranks']}"
    console.print(f"input: {inp['path']} ({_count(inp['dumps'], 'Flight Recorder dump')} of {ranks}, "
                  f"version {versions}, {_count(inp['entries'], 'op')})", highlight=False, soft_wrap=True)
    if inp["wrapped_ranks"]:
        console.print(f"note: the ring buffer wrapped on ranks {inp['wrapped_ranks']} (older ops are gone)",
                      highlight=False, soft_wrap=True)
    kind = hang[HANG_KIND]
    head = "[bold red]HANG[/]" if kind != "none" else "[bold]no rank behind[/]"
    console.print(f"{head} ({kind}): {hang[HANG_ANSWER]}", highlight=False, soft_wrap=True)
    if inp["no_dump_ranks"]:
        console.print(f"no dump from ranks {inp['no_dump_ranks']} (of {inp['expected_ranks']})", highlight=False,
                      soft_wrap=True)
    slow = summary["slow_collectives"]
    if slow is None:
        console.print("slow collectives: no durations in the dumps (recorded with TORCH_NCCL_ENABLE_TIMING=1)",
                      highlight=False, soft_wrap=True)
        return
    table = Table(title=f"slow collectives: widest spreads of {slow['collectives']} timed collectives "
                        f"(the last to arrive has the shortest duration)")
    for col in ("group", "seq", "op", "ranks", "entered last", "late ms", "shortest", "longest", "spread ms"):
        table.add_column(col, justify="left" if col in ("group", "op") else "right")
    for r in slow["rows"]:
        table.add_row(r["group"], str(r["seq"]), r["op"], str(r["ranks"]), str(r["last_entered"]),
                      f"{r['entered_late_ms']:.2f}", f"rank {r['shortest_rank']} {r['shortest_ms']:.2f}",
                      f"rank {r['longest_rank']} {r['longest_ms']:.2f}", f"{r['spread_ms']:.2f}")
    console.print(table)
    tally = ", ".join(f"rank {r['rank']} ({r['entered_last']} last, {r['shortest']} shortest)"
                      for r in slow["ranks"][:5])
    console.print(f"most often last to arrive: {tally}", highlight=False, soft_wrap=True)
