"""`relax-straggler ingest INPUT... --store URL --job ID`: loads recorded runs into a metrics
store as megatron_metrics rows (relax_straggler/monitor/ingest.py), for the monitor and for
`relax-straggler analyze clickhouse://...`.

Exit status: 0 every input was loaded (problems, if any, are listed); 1 an input or the
store cannot be used, or --strict met a problem; 2 bad arguments (a malformed store URL or
job id included).
"""

from __future__ import annotations

import argparse

from relax_straggler.cli.common import EXIT_USAGE, add_output_arguments, add_progress_argument, emit, error, note
from relax_straggler.cli.inputs import FORMATS

SHOWN_PROBLEMS = 20


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "ingest", help="Load recorded runs into a metrics store.",
        description="Writes straggler.jsonl files, Megatron timer logs (--timing-log-option all) or traces into a "
                    "metrics store as megatron_metrics rows of one job. See docs/STORES.md.")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="input files, written in this order")
    p.add_argument("--store", required=True, metavar="URL", help="file://DIR or clickhouse://HOST:PORT/DB")
    p.add_argument("--job", required=True, help="job id to write the rows under")
    p.add_argument("--input-format", choices=FORMATS, default=None, help="input format (default: detected per file)")
    p.add_argument("--strict", action="store_true", help="stop at the first malformed record instead of skipping it")
    p.add_argument("--append", action="store_true", help="allow a job that already has rows in the store")
    p.add_argument("--ranks-per-node", type=int, default=None, metavar="N",
                   help="ranks per node: rows name node-<rank // N> (default: the input's layout, else 8)")
    p.add_argument("--cluster", default="", help="cluster name written in each row")
    p.add_argument("--batch-rows", type=int, default=100_000, metavar="N", help="rows per store write")
    # --format FORMAT once chose the input format: still understood, with a deprecation note.
    out = add_output_arguments(p, text="one line per input and the total", json_what="the counts written",
                               legacy=FORMATS)
    add_progress_argument(out)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    from relax_straggler.monitor.ingest import IngestStats, ingest, retrying
    from relax_straggler.stores.opener import open_store
    from relax_straggler.stores.base import StoreError, check_job_id
    from relax_straggler.stores.url import redact
    from relax_straggler.readers import InputError, open_source

    err = Console(stderr=True)

    def fail(message: str, code: int = 1) -> int:
        return error(message, code)

    if args.format in FORMATS:
        note(f"warning: --format {args.format} for the input format is deprecated: use --input-format {args.format}")
        args.input_format, args.format = args.input_format or args.format, "text"
    try:
        check_job_id(args.job)
    except ValueError as exc:
        return fail(str(exc), 2)
    for name in ("ranks_per_node", "batch_rows"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            return fail(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}", 2)
    try:
        store = open_store(args.store)
    except (ValueError, StoreError) as exc:
        return fail(str(exc), EXIT_USAGE if isinstance(exc, ValueError) else 1)
    stats = IngestStats()
    problems = []
    try:
        if not args.append and args.job in retrying(store.jobs):
            return fail(f"job {args.job!r} already has rows in {redact(args.store)}; pass --append to add to it, or "
                        "choose another --job")
        for path in args.inputs:
            source = open_source(path, args.input_format, strict=args.strict)
            rpn = args.ranks_per_node
            show = not args.no_progress and err.is_terminal
            with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                          TimeRemainingColumn(), console=err, disable=not show, transient=True) as bar:
                task = bar.add_task(path, total=source.total_bytes)

                def progress(done: int, total: int) -> None:
                    bar.update(task, completed=done)

                before = stats.rows
                if rpn is None:  # the layout a trace declares up front (logs declare theirs as they go)
                    topo = source.topology()
                    rpn = topo.ranks_per_node if topo is not None and topo.ranks_per_node else 8
                ingest(source, store, args.job, ranks_per_node=rpn, cluster=args.cluster, batch_rows=args.batch_rows,
                       progress=progress, stats=stats)
            problems.append(source.problems)
            err.print(f"{path}: {stats.rows - before} rows ({source.problems.total} problems)", highlight=False,
                      soft_wrap=True)
    except InputError as exc:
        return fail(str(exc))
    except OSError as exc:
        return fail(f"cannot read {exc.filename}: {exc.strerror or exc}")
    except StoreError as exc:
        return fail(f"{exc} ({stats.rows} rows were written before)")
    finally:
        store.close()

    kept = [problem for p in problems for problem in p.kept]
    total = sum(p.total for p in problems)
    for problem in kept[:SHOWN_PROBLEMS]:
        err.print(f"  {problem}", highlight=False, soft_wrap=True)
    if total > min(len(kept), SHOWN_PROBLEMS):
        err.print(f"  ... and {total - min(len(kept), SHOWN_PROBLEMS)} more (counts by kind below)", highlight=False)
    if total:
        kinds: dict[str, int] = {}
        for p in problems:
            for kind, n in p.counts.items():
                kinds[kind] = kinds.get(kind, 0) + n
        err.print("problems: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())), highlight=False)
    result = {"job": args.job, "store": redact(args.store), "inputs": list(args.inputs), "rows": stats.rows,
              "steps": stats.steps, "seconds": stats.seconds, "problems": total}
    return emit(args, result, lambda: print(f"wrote {stats.rows} rows ({stats.steps} steps) of job {args.job} to "
                                            f"{redact(args.store)} in {stats.seconds:.2f} s "
                                            f"({stats.rows_per_s:,.0f} rows/s); {total} problems"))
