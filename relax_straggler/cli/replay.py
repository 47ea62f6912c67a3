"""`relax-straggler replay`: writes a recorded or synthetic job into a metrics store under a
new job id at a chosen speed (relax_straggler/monitor/replay.py).

Exit status: 0 replayed; 1 the input or the store cannot be used; 2 bad arguments.
"""

from __future__ import annotations

import argparse
import logging

log = logging.getLogger(__name__)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "replay", help="Replay a recorded or synthetic job into a metrics store.",
        description="Writes a recorded job (straggler.jsonl, Megatron timer log, trace) or a synthetic one into the "
                    "store, iteration by iteration with fresh timestamps. See docs/MONITOR.md.")
    p.add_argument("input", nargs="?", default=None, help="recorded job (any format of `relax-straggler analyze`)")
    p.add_argument("--synthetic", default=None, metavar="SPEC",
                   help="generate instead: ranks=N,iterations=N[,step_ms=MS,noise=F,seed=N]")
    p.add_argument("--store", required=True, metavar="URL", help="file://DIR or clickhouse://HOST:PORT/DB")
    p.add_argument("--job", required=True, help="job id to write under")
    p.add_argument("--speed", type=float, default=1.0, metavar="X",
                   help="replay speed: 1 = recorded pace, 10 = ten times faster (default 1)")
    p.add_argument("--inject-delay", action="append", default=[], metavar="RANK:STAGE:MS:FROM_ITER",
                   help="add MS to RANK's STAGE from iteration FROM_ITER on (repeatable)")
    p.add_argument("--ranks-per-node", type=int, default=8, metavar="N",
                   help="ranks per node: rows name node-<rank // N> (default 8)")
    p.add_argument("--cluster", default="", help="cluster name written in each row")
    p.add_argument("--no-end", action="store_true",
                   help="write no end-of-run row at the end, as a job that crashed (the monitor then shows it "
                        "hanging, not finished)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from relax_straggler.monitor.replay import Injection, Synthetic, recorded_steps, replay
    from relax_straggler.stores.opener import open_store
    from relax_straggler.stores.base import StoreError, check_job_id
    from relax_straggler.readers import InputError

    if (args.input is None) == (args.synthetic is None):
        log.error("replay: give either INPUT or --synthetic SPEC")
        return 2
    try:
        check_job_id(args.job)
    except ValueError as exc:
        log.error("replay: %s", exc)
        return 2
    try:
        injections = [Injection.parse(text) for text in args.inject_delay]
        steps = Synthetic.parse(args.synthetic).steps() if args.synthetic else recorded_steps(args.input)
        store = open_store(args.store)
        try:
            stats = replay(steps, store, args.job, speed=args.speed, injections=injections,
                           ranks_per_node=args.ranks_per_node, cluster=args.cluster,
                           end_of_run=not args.no_end)
        finally:
            store.close()
    except (ValueError, InputError, StoreError) as exc:
        log.error("%s", exc)
        return 1
    log.info("replayed %d iterations (%d rows) of job %s into %s in %.1f s; %d skipped (in the store already)%s",
             stats.iterations, stats.rows, args.job, args.store, stats.seconds, stats.skipped,
             "; end-of-run row written" if stats.ended else "")
    return 0
