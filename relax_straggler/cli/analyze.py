"""`relax-straggler analyze FILE`: offline straggler analysis of a recorded run.

Exit status: 0 the analysis ran (whatever it found); 1 the input cannot be analyzed (the
message names the file and line or row), or --strict met a problem; 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys

from relax_straggler.analysis.config import AnalyzeConfig
from relax_straggler.dataclass_flags import add_field_flags, config_from_args

FORMATS = ("straggler-jsonl", "megatron-log", "chrome-trace", "parquet-trace")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "analyze", help="Analyze a recorded run or trace offline.",
        description="Find straggler ranks in straggler.jsonl, Megatron timer logs, Chrome traces or per-op parquet "
                    "traces. See docs/ANALYZE.md.")
    p.add_argument("path", help="input file, or clickhouse://HOST:PORT/DB?job=ID[&first=N&last=M]")
    io = p.add_argument_group("input")
    io.add_argument("--input-format", choices=FORMATS, default=None, help="input format (default: detected)")
    io.add_argument("--strict", action="store_true", help="stop at the first malformed record instead of skipping it")
    io.add_argument("--meta", default=None, help="job metadata YAML (dp_size, pp_size, tp_size) for a trace; "
                                                 "default: meta-NAME.yaml beside trace-NAME / timeline-NAME")
    io.add_argument("--dp", type=int, default=None, help="data-parallel size (with --pp and --tp)")
    io.add_argument("--pp", type=int, default=None, help="pipeline-parallel size")
    io.add_argument("--tp", type=int, default=None, help="tensor-parallel size")
    io.add_argument("--ranks-per-node", type=int, default=None, help="ranks per node, to name nodes")
    out = p.add_argument_group("output")
    out.add_argument("--format", choices=("text", "json"), default="text",
                     help="text: terminal report; json: the JSON summary only, on stdout")
    out.add_argument("--json", dest="json_path", default=None, help="also write the JSON summary to this file")
    out.add_argument("--heatmap", default=None, help="write the rank x stage heatmap PNG to this file")
    out.add_argument("--no-progress", action="store_true", help="no progress bar")
    th = p.add_argument_group("thresholds (AnalyzeConfig)")
    add_field_flags(th, AnalyzeConfig, metavar="N", show_default=True)
    p.set_defaults(run=run)


def _topology(args):
    from relax_straggler.topology import Topology

    if args.dp is None and args.pp is None and args.tp is None:
        return None
    return Topology(*(1 if x is None else x for x in (args.dp, args.pp, args.tp)))


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    from relax_straggler.analysis import analyze, build_summary, render
    from relax_straggler.readers import InputError, open_source

    err = Console(stderr=True)
    try:
        config = config_from_args(AnalyzeConfig, args)
        config.engine_config()
        topology = _topology(args)
        source = open_source(args.path, args.input_format, strict=args.strict, topology=topology, meta=args.meta)
        show = not args.no_progress and err.is_terminal and source.total_bytes > (16 << 20)
        with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                      TimeRemainingColumn(), console=err, disable=not show, transient=True) as bar:
            task = bar.add_task("reading", total=source.total_bytes)
            result = analyze(source, config, ranks_per_node=args.ranks_per_node,
                             progress=lambda done, total: bar.update(task, completed=done))
        summary = build_summary(result)
    except InputError as exc:
        err.print(f"[red]error:[/] {exc}", highlight=False, soft_wrap=True)
        return 1
    except OSError as exc:
        err.print(f"[red]error:[/] cannot read {exc.filename or args.path}: {exc.strerror or exc}", highlight=False,
                  soft_wrap=True)
        return 1
    except ValueError as exc:
        err.print(f"[red]error:[/] {exc}", highlight=False, soft_wrap=True)
        return 2
    text = json.dumps(summary, indent=2, allow_nan=False)
    try:
        if args.json_path:
            with open(args.json_path, "w", encoding="utf-8") as f:
                f.write(text + "\n")
        if args.heatmap and summary["per_rank"]:
            from relax_straggler.analysis.heatmap import write_heatmap  # matplotlib only when asked

            write_heatmap(summary, args.heatmap)
    except OSError as exc:
        err.print(f"[red]error:[/] cannot write {exc.filename}: {exc.strerror}", highlight=False, soft_wrap=True)
        return 1
    if args.heatmap and not summary["per_rank"]:
        err.print("note: no heatmap: the input has no per-rank times (min/max only)", highlight=False, soft_wrap=True)
    if args.format == "json":
        sys.stdout.write(text + "\n")
    else:
        render(summary, Console())
    # Nothing can be concluded from this input: say so with the exit code too.
    return 1 if summary["verdict"].get("reason") in ("rejected_input", "too_few_steps") else 0
