"""`relax-straggler whatif PATH`: how much slower the job runs than without stragglers and
what fixing a worker, stage or op type would give back, by replaying its per-op records
(parquet op traces, Chrome traces, our per-op JSONL). See docs/WHATIF.md.

The input is read as `analyze` reads it (cli/inputs.py, relax_straggler.readers): the same
format detection and --input-format, --strict, --meta and --dp/--pp/--tp/--dsp, and the same
report of skipped records by file and row.

Exit status: 0 the analysis ran; 1 the input cannot be replayed (the message names the
file, row or op) or --strict met a problem; 2 bad arguments.
"""

from __future__ import annotations

import argparse

from relax_straggler.cli.common import add_output_arguments, add_progress_argument, emit, error, progress
from relax_straggler.cli.inputs import (add_input_arguments, input_path_error, print_problems, read_reporting_errors,
                                       topology_from_args)

INPUT_FORMATS = ("chrome-trace", "parquet-trace", "op-jsonl")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "whatif", help="What-if slowdown: the cost of stragglers and what fixing them gives back.",
        description="Replay per-op records with and without stragglers (OSDI'25 what-if analysis). "
                    "See docs/WHATIF.md.")
    p.add_argument("path", help="trace-NAME.parquet, a Chrome trace (.json / .json.gz) or per-op .jsonl")
    add_input_arguments(p, INPUT_FORMATS)
    out = add_output_arguments(p, text="terminal report", json_what="the full result")
    add_progress_argument(out)
    p.add_argument("--heatmap", default=None, metavar="PNG", help="write the dp_rank x stage score heatmap")
    p.add_argument("--ideal-timeline", default=None, metavar="FILE",
                   help="write the simulated ideal timeline as a Chrome trace (.json or .json.gz)")
    p.add_argument("--no-by-worker", action="store_true", help="skip per-worker attribution (large jobs)")
    p.add_argument("--threads", type=int, default=0, help="replay threads (0 = all cores)")
    p.set_defaults(run=run)


class _StderrConsole:
    """A rich stderr console made on the first message: a clean run never imports rich."""

    def __init__(self) -> None:
        self._console = None

    def print(self, *objects, **kwargs) -> None:
        if self._console is None:
            from rich.console import Console

            self._console = Console(stderr=True)
        self._console.print(*objects, **kwargs)


def run(args: argparse.Namespace) -> int:
    from relax_straggler.whatif import WhatIfInputError, analyze_records, read_op_input

    err = _StderrConsole()
    code = input_path_error(args.path)
    if code is not None:
        return code

    def read():
        with progress(args, "reading") as update:
            op_input = read_op_input(args.path, args.input_format, strict=args.strict,
                                     topology=topology_from_args(args), meta=args.meta)
            update(description=f"replaying {len(op_input.records)} ops")
            try:
                return op_input, analyze_records(op_input.records, by_worker=not args.no_by_worker,
                                                 threads=args.threads)
            except WhatIfInputError as exc:  # the engine names the op, not the file
                raise WhatIfInputError(f"{args.path}: {exc}") from None

    code, done = read_reporting_errors(err, args.path, read)
    if code is not None:
        return code
    op_input, report = done
    problems = op_input.problems
    try:
        if args.heatmap or args.ideal_timeline:
            from relax_straggler.whatif.render import write_heatmap, write_ideal_timeline

            if args.heatmap:
                write_heatmap(report, args.heatmap)
            if args.ideal_timeline:
                write_ideal_timeline(report, op_input.records.optype_names, args.ideal_timeline)
    except OSError as exc:
        return error(f"cannot write {exc.filename}: {exc.strerror}")
    out = report.to_json()
    out["input"] = {"path": args.path, "format": op_input.format, "ops": len(op_input.records),
                    "problems": problems.facts(op_input.records_read)}
    code = emit(args, out, lambda: print(report.text()))
    print_problems(problems, op_input.records_read, err)
    return code
