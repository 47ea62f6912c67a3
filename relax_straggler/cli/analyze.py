"""`relax-straggler analyze FILE`: offline straggler analysis of a recorded run. PyTorch
Flight Recorder dumps get the hang answer of their own command (cli/flight_recorder.py),
with a note that names it.

Exit status: 0 the analysis ran (whatever it found); 1 the input cannot be analyzed (the
message names the file and line or row; a store URL's job that does not exist), or --strict
met a problem; 2 bad arguments (an HTTP address or a malformed store URL included).
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys

from relax_straggler.analysis.config import AnalyzeConfig
from relax_straggler.cli.common import add_output_arguments, add_progress_argument, error, note
from relax_straggler.cli.inputs import (FLIGHT_RECORDER, FORMATS, add_input_arguments, input_path_error,
                                       read_reporting_errors, topology_from_args)
from relax_straggler.common.dataclass_flags import add_field_flags, config_from_args

__all__ = ["FORMATS", "register", "run"]


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "analyze", help="Analyze a recorded run or trace offline.",
        description="Find straggler ranks in straggler.jsonl, Megatron timer logs, Chrome traces or per-op parquet "
                    "traces, in a job of a metrics store (file://DIR?job=ID, clickhouse://HOST:PORT/DB?job=ID), "
                    "or the rank that holds a hung job in PyTorch Flight Recorder dumps. See docs/ANALYZE.md.")
    p.add_argument("path", help="input file; a metrics store's job, file://DIR?job=ID or "
                                "clickhouse://HOST:PORT/DB?job=ID (optionally &first=N&last=M iterations); or a "
                                "directory or glob of Flight Recorder dumps (nccl_trace_rank_<rank>)")
    add_input_arguments(p, FORMATS + (FLIGHT_RECORDER,))
    out = add_output_arguments(p, text="terminal report", json_what="the JSON summary")
    out.add_argument("--heatmap", default=None, metavar="PNG",
                     help="write each rank's compute slowdown over time (rank x step heatmap) to this PNG file")
    add_progress_argument(out)
    out.add_argument("--no-whatif", action="store_true",
                     help="skip the what-if replay of per-op traces (the summary's \"whatif\" figures)")
    th = p.add_argument_group("thresholds (AnalyzeConfig)")
    add_field_flags(th, AnalyzeConfig, metavar="N", show_default=True)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from relax_straggler.hang.fr_dumps import is_flight_recorder_input

    code = input_path_error(args.path)
    if code is not None:
        return code
    if args.input_format == FLIGHT_RECORDER or (args.input_format is None and is_flight_recorder_input(args.path)):
        return _flight_recorder(args)
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    from relax_straggler.analysis import analyze, build_analysis, render, summary_dict
    from relax_straggler.analysis.summary import write_summary
    from relax_straggler.analysis.terminal import TOP_RANKS
    from relax_straggler.analysis.whatif import whatif_summary
    from relax_straggler.readers import open_source

    err = Console(stderr=True)

    def read():
        config = config_from_args(AnalyzeConfig, args)
        config.engine_config()
        topology = topology_from_args(args)
        source = open_source(args.path, args.input_format, strict=args.strict, topology=topology, meta=args.meta,
                             ops=not args.no_whatif)
        show = not args.no_progress and err.is_terminal and source.total_bytes > (16 << 20)
        with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                      TimeRemainingColumn(), console=err, disable=not show, transient=True) as bar:
            task = bar.add_task("reading", total=source.total_bytes)
            result = analyze(source, config, ranks_per_node=args.ranks_per_node,
                             progress=lambda done, total: bar.update(task, completed=done),
                             timeline=args.heatmap is not None)
        analysis = build_analysis(result)
        whatif = None if args.no_whatif else whatif_summary(source)
        # The slowest ranks only: every rank's entry is written from the columns (a million ranks are common).
        summary = summary_dict(analysis, slowest=TOP_RANKS, whatif=whatif, min_impact=config.min_impact)
        return summary, analysis.per_rank, result.timeline

    code, done = read_reporting_errors(err, args.path, read)
    if code is not None:
        return code
    summary, per_rank, timeline = done
    try:
        if args.json_path:
            with open(args.json_path, "w", encoding="utf-8") as f:
                write_summary(summary, f, per_rank)
        if args.heatmap and timeline is not None:
            from relax_straggler.analysis.heatmap import write_heatmap  # matplotlib only when asked

            write_heatmap(timeline.grid(), summary["input"]["path"], args.heatmap)
    except OSError as exc:
        return error(f"cannot write {exc.filename}: {exc.strerror}")
    if args.heatmap and timeline is None:
        err.print("note: no heatmap: the input has no per-rank times (min/max only)", highlight=False, soft_wrap=True)
    if args.format == "json":
        write_summary(summary, sys.stdout, per_rank)
    else:
        render(summary, Console())
    # Nothing can be concluded from this input: say so with the exit code too.
    return 1 if summary["verdict"].get("reason") in ("rejected_input", "too_few_steps") else 0


def _flight_recorder(args: argparse.Namespace) -> int:
    """`relax-straggler flight-recorder` on args.path, after a note that names that command,
    with notes for the options given that do not apply to dumps."""
    from relax_straggler.cli.flight_recorder import report

    note("note: Flight Recorder dumps have their own command: relax-straggler flight-recorder "
         f"{shlex.quote(args.path)}")
    notes = ["no heatmap: Flight Recorder dumps hold no per-stage times"] if args.heatmap else []
    ignored = options_not_applying(args)
    if ignored:
        notes.append(f"{', '.join(ignored)} {'does' if len(ignored) == 1 else 'do'} not apply to Flight Recorder "
                     f"dumps (ignored; a malformed dump always ends the analysis)")
    return report(args, notes)


def options_not_applying(args: argparse.Namespace) -> list[str]:
    """The options given in `args` that a straggler analysis reads and the hang answer does
    not: --strict, --meta, --ranks-per-node and any threshold off its default."""
    given = [flag for flag, on in (("--strict", args.strict), ("--meta", args.meta is not None),
                                   ("--ranks-per-node", args.ranks_per_node is not None)) if on]
    return given + ["--" + f.name.replace("_", "-") for f in dataclasses.fields(AnalyzeConfig)
                    if getattr(args, f.name, f.default) != f.default]
