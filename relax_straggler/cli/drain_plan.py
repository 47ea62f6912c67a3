"""`relax-straggler drain-plan`: prints what an operator would run to drain a confirmed
straggler's node (or a hang's culprit's), with its evidence, from a running monitor
(http://HOST:PORT: its GET /{job_id} "drain_plan") or straight from a metrics store
(relax_straggler/monitor/drain.py). Never runs anything.

Exit status: 0 printed (a plan or that there is none); 1 the monitor, the store or the job
cannot be read; 2 bad arguments.
"""

from __future__ import annotations

import argparse

from relax_straggler.cli.common import EXIT_DATA, EXIT_USAGE, add_output_arguments, emit, error


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "drain-plan", help="Print the drain plan of a job's confirmed straggler (never runs it).",
        description="Prints the Slurm and Kubernetes commands that would take a confirmed straggler's node (or a "
                    "hang's culprit's) out of scheduling, with the evidence. Nothing is run. See docs/MONITOR.md.")
    p.add_argument("source", metavar="STORE_OR_URL",
                   help="a monitor (http://HOST:PORT) or a metrics store (file://DIR, clickhouse://HOST:PORT/DB)")
    p.add_argument("--job", required=True, help="job id")
    p.add_argument("--ranks-per-node", type=int, default=None, metavar="N",
                   help="from a store: name node-<rank // N> where the rows name no node")
    p.add_argument("--timeout", type=float, default=10.0, metavar="S", help="seconds to wait for a monitor")
    add_output_arguments(p, text="the plan and its commands", json_what="the job's status, verdict and drain plan")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from relax_straggler.monitor.drain import plan_text

    try:
        from relax_straggler.stores.base import check_job_id

        check_job_id(args.job)
    except ValueError as exc:
        return error(f"drain-plan: {exc}", EXIT_USAGE)
    if args.ranks_per_node is not None and args.ranks_per_node < 1:
        return error(f"drain-plan: --ranks-per-node must be >= 1, got {args.ranks_per_node}", EXIT_USAGE)
    try:
        view = _from_monitor(args) if args.source.startswith(("http://", "https://")) else _from_store(args)
    except (OSError, ValueError, KeyError) as exc:
        return error(f"drain-plan: {exc.args[0] if isinstance(exc, KeyError) and exc.args else exc}", EXIT_DATA)
    result = {k: view.get(k) for k in ("job_id", "status", "verdict", "drain_plan")}
    return emit(args, result, lambda: print(plan_text(args.job, view["status"], view.get("drain_plan")), end=""))


def _from_monitor(args: argparse.Namespace) -> dict:
    import json
    import urllib.error
    import urllib.parse
    import urllib.request

    url = f"{args.source.rstrip('/')}/jobs/{urllib.parse.quote(args.job, safe='')}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers={"Accept": "application/json"}),
                                    timeout=args.timeout) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        try:
            detail = json.loads(exc.read()).get("detail")
        except ValueError:
            detail = None
        raise OSError(f"{url}: HTTP {exc.code}: {detail or exc.reason}") from None
    except urllib.error.URLError as exc:
        raise OSError(f"{url}: {exc.reason}") from None


def _from_store(args: argparse.Namespace) -> dict:
    from relax_straggler.common.topology import Topology
    from relax_straggler.monitor.drain import plan_from_store
    from relax_straggler.readers.base import InputError
    from relax_straggler.stores.base import StoreError
    from relax_straggler.stores.opener import open_store

    try:
        store = open_store(args.source, create=False)
    except StoreError as exc:
        raise OSError(str(exc)) from None
    try:
        topology = None
        if args.ranks_per_node is not None:
            ranks = max((it.ranks for it in store.iterations(args.job)), default=1)
            topology = Topology(dp=ranks, pp=1, ranks_per_node=args.ranks_per_node)
        return plan_from_store(store, args.job, topology)
    except (StoreError, InputError) as exc:
        raise OSError(str(exc)) from None
    finally:
        store.close()
