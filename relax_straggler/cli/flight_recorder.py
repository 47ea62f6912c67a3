"""`relax-straggler analyze` on PyTorch Flight Recorder dumps: the hang answer (which rank
holds which collective) and the slow-collective evidence, printed or as JSON
(docs/ANALYZE.md, "Flight Recorder dumps"). Same exit status as the other inputs."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from relax_straggler.cli.common import error
from relax_straggler.cli.inputs import read_reporting_errors, topology_from_args
from relax_straggler.metric_names import HANG_ANSWER, HANG_KIND


def run_flight_recorder(args: argparse.Namespace) -> int:
    """Reads the dumps at args.path, prints the answer (args.format text or json) and
    writes the JSON summary to args.json_path when given. 0: the dumps were read (whatever
    they show); 1: they cannot be (the message names the file and field) or a file cannot
    be written; 2: bad options."""
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
    if args.heatmap:
        err.print("note: no heatmap: Flight Recorder dumps hold no per-stage times", highlight=False, soft_wrap=True)
    ignored = options_not_applying(args)
    if ignored:
        err.print(f"note: {', '.join(ignored)} {'does' if len(ignored) == 1 else 'do'} not apply to Flight Recorder "
                  f"dumps (ignored; a malformed dump always ends the analysis)", highlight=False, soft_wrap=True)
    if args.format == "json":
        sys.stdout.write(text + "\n")
    else:
        render(summary, Console())
    return 0


def options_not_applying(args: argparse.Namespace) -> list[str]:
    """The options given in `args` that a straggler analysis reads and the hang answer does
    not: --strict, --meta, --ranks-per-node and any threshold off its default."""
    from relax_straggler.analysis.config import AnalyzeConfig

    given = [flag for flag, on in (("--strict", args.strict), ("--meta", args.meta is not None),
                                   ("--ranks-per-node", args.ranks_per_node is not None)) if on]
    return given + ["--" + f.name.replace("_", "-") for f in dataclasses.fields(AnalyzeConfig)
                    if getattr(args, f.name, f.default) != f.default]


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
