"""`relax-straggler feed` (`replay`, its old name, still works): writes a recorded or
synthetic job into a metrics store under a new job id at a chosen speed
(relax_straggler/monitor/feed.py).

Exit status: 0 written; 1 the input or the store cannot be used; 2 bad arguments (a
malformed --synthetic, --inject-delay, store URL or job id included).
"""

from __future__ import annotations

import argparse

from relax_straggler.cli.common import EXIT_DATA, EXIT_USAGE, add_output_arguments, add_progress_argument, emit, error


def register(subparsers) -> None:
    from relax_straggler.cli import ALIASES

    p = subparsers.add_parser(
        "feed", aliases=[old for old, name in ALIASES.items() if name == "feed"], help="Feed a recorded or synthetic job into a metrics store.",
        description="Writes a recorded job (straggler.jsonl, Megatron timer log, trace) or a synthetic one into the "
                    "store, iteration by iteration with fresh timestamps. See docs/MONITOR.md.")
    p.add_argument("input", nargs="?", default=None, help="recorded job (any format of `relax-straggler analyze`)")
    p.add_argument("--synthetic", default=None, metavar="SPEC",
                   help="generate instead: ranks=N,iterations=N[,step_ms=MS,noise=F,seed=N]")
    p.add_argument("--store", required=True, metavar="URL", help="file://DIR or clickhouse://HOST:PORT/DB")
    p.add_argument("--job", required=True, help="job id to write under")
    p.add_argument("--speed", type=float, default=1.0, metavar="X",
                   help="speed: 1 = recorded pace, 10 = ten times faster (default 1)")
    p.add_argument("--inject-delay", action="append", default=[], metavar="RANK:STAGE:MS:FROM_ITER",
                   help="add MS to RANK's STAGE from iteration FROM_ITER on (repeatable)")
    p.add_argument("--ranks-per-node", type=int, default=8, metavar="N",
                   help="ranks per node: rows name node-<rank // N> (default 8)")
    p.add_argument("--cluster", default="", help="cluster name written in each row")
    p.add_argument("--no-end", action="store_true",
                   help="write no end-of-run row at the end, as a job that crashed (the monitor then shows it "
                        "hanging, not finished)")
    out = add_output_arguments(p, text="one line", json_what="the counts written")
    add_progress_argument(out)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from relax_straggler.cli.common import progress
    from relax_straggler.monitor.feed import Injection, Synthetic, feed, recorded_steps
    from relax_straggler.stores.opener import open_store
    from relax_straggler.stores.base import StoreError, check_job_id
    from relax_straggler.stores.url import redact
    from relax_straggler.readers import InputError

    if (args.input is None) == (args.synthetic is None):
        return error(f"{args.command}: give either INPUT or --synthetic SPEC", EXIT_USAGE)
    try:
        check_job_id(args.job)
        injections = [Injection.parse(text) for text in args.inject_delay]
        synthetic = Synthetic.parse(args.synthetic) if args.synthetic else None
        store = open_store(args.store)
    except ValueError as exc:
        return error(str(exc), EXIT_USAGE)
    except StoreError as exc:
        return error(str(exc), EXIT_DATA)
    try:
        with progress(args, f"replaying job {args.job}", total=synthetic.iterations if synthetic else None) as update:
            def counted(steps):
                for i, step in enumerate(steps, 1):
                    yield step
                    update(completed=i)

            steps = synthetic.steps() if synthetic else recorded_steps(args.input)
            stats = feed(counted(steps), store, args.job, speed=args.speed, injections=injections,
                         ranks_per_node=args.ranks_per_node, cluster=args.cluster, end_of_run=not args.no_end)
    except ValueError as exc:
        return error(str(exc), EXIT_USAGE)
    except (InputError, StoreError) as exc:
        return error(str(exc), EXIT_DATA)
    finally:
        store.close()
    result = {"job": args.job, "store": redact(args.store), "iterations": stats.iterations, "rows": stats.rows,
              "skipped": stats.skipped, "seconds": stats.seconds, "end_of_run": stats.ended}
    return emit(args, result, lambda: print(
        f"replayed {stats.iterations} iterations ({stats.rows} rows) of job {args.job} into {redact(args.store)} in "
        f"{stats.seconds:.1f} s; {stats.skipped} skipped (in the store already)"
        f"{'; end-of-run row written' if stats.ended else ''}"))
