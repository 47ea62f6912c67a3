"""`relax-straggler whatif PATH`: how much slower the job runs than without stragglers and
what fixing a worker, stage or op type would give back, by replaying its per-op records
(parquet op traces, Chrome traces, our per-op JSONL). See docs/WHATIF.md.

Exit status: 0 the analysis ran; 1 the input cannot be replayed (the message names the
file, row or op); 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "whatif", help="What-if slowdown: the cost of stragglers and what fixing them gives back.",
        description="Replay per-op records with and without stragglers (OSDI'25 what-if analysis). "
                    "See docs/WHATIF.md.")
    p.add_argument("path", help="trace-NAME.parquet, a Chrome trace (.json / .json.gz) or per-op .jsonl")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="text: terminal report; json: the full result on stdout")
    p.add_argument("--heatmap", default=None, metavar="PNG", help="write the dp_rank x stage score heatmap")
    p.add_argument("--ideal-timeline", default=None, metavar="FILE",
                   help="write the simulated ideal timeline as a Chrome trace (.json or .json.gz)")
    p.add_argument("--no-by-worker", action="store_true", help="skip per-worker attribution (large jobs)")
    p.add_argument("--threads", type=int, default=0, help="replay threads (0 = all cores)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from relax_straggler.whatif import load_op_records
    from relax_straggler.whatif.loader import WhatIfInputError
    from relax_straggler.whatif.result import analyze_records

    try:
        rec = load_op_records(args.path)
        report = analyze_records(rec, by_worker=not args.no_by_worker, threads=args.threads)
    except WhatIfInputError as e:
        print(f"relax-straggler whatif: {e}", file=sys.stderr)
        return 1
    if args.heatmap or args.ideal_timeline:
        from relax_straggler.whatif.render import write_heatmap, write_ideal_timeline

        if args.heatmap:
            write_heatmap(report, args.heatmap)
        if args.ideal_timeline:
            write_ideal_timeline(report, rec.optype_names, args.ideal_timeline)
    if args.format == "json":
        json.dump(report.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(report.text())
    return 0
