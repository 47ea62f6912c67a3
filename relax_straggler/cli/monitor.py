"""`relax-straggler monitor`: the online detection service (docs/MONITOR.md).

Exit status: 0 stopped by a signal; 1 the state file, store URL or token cannot be used; 2 bad arguments;
3 the HTTP address cannot be bound (uvicorn's status, e.g. the port is in use).
"""

from __future__ import annotations

import argparse
import logging

log = logging.getLogger(__name__)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "monitor", help="Watch registered jobs in a metrics store and serve the HTTP API.",
        description="Polls every registered job's iterations in the store, detects slow and stopped iterations, "
                    "analyses slow windows and serves the results over HTTP. See docs/MONITOR.md.")
    p.add_argument("--store", required=True, metavar="URL",
                   help="metrics store: file://DIR (embedded) or clickhouse://HOST:PORT/DB")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--check-interval", type=float, default=30.0, metavar="S",
                   help="seconds between two polls of every job (default 30)")
    p.add_argument("--history-size", type=int, default=5, metavar="N",
                   help="normal iterations in the baseline, and slow iterations in a row that trigger an analysis "
                        "(default 5)")
    p.add_argument("--slowdown-threshold", type=float, default=0.25, metavar="F",
                   help="an iteration is slow when its step time exceeds the baseline median by this fraction "
                        "(default 0.25)")
    p.add_argument("--hang-threshold", type=float, default=60.0, metavar="S",
                   help="seconds without a new iteration before a job is hanging (default 60)")
    p.add_argument("--state", default=None, metavar="FILE",
                   help="state file of registered jobs and results (default: monitor-state.json in a file:// "
                        "store, else ./relax-straggler-monitor-HOST-PORT-DB.json)")
    p.add_argument("--workers", type=int, default=2, metavar="N", help="analysis threads (default 2)")
    p.add_argument("--max-jobs", type=int, default=1000, metavar="N",
                   help="registered jobs at most; a registration beyond is refused with 409 (default 1000)")
    p.add_argument("--token-file", default=None, metavar="FILE",
                   help="file holding a token that register and unregister calls must send as "
                        "'Authorization: Bearer TOKEN' (default: the RELAX_STRAGGLER_MONITOR_TOKEN environment "
                        "variable; neither: no token)")
    p.add_argument("--allowed-host", action="append", default=None, metavar="NAME",
                   help="a Host header name to serve (repeatable; '*' any). Default: localhost, 127.0.0.1, ::1 and "
                        "--host; on --host 0.0.0.0 or :: also this machine's name and any IP address")
    p.add_argument("--request-timeout", type=_seconds, default=10.0, metavar="S",
                   help="seconds a client has to send a whole request (head and body) once its connection opened "
                        "or its previous response was sent; slower ones are disconnected (default 10)")
    p.add_argument("--allow-get-registration", action="store_true",
                   help="serve GET /detect/{job_id} and GET /undetect/{job_id} (mt-detector's registration form; "
                        "off by default: any web page can make a browser send a GET)")
    p.set_defaults(run=run)


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text}")
    return value


def guard_of(args: argparse.Namespace):
    """The API guard the flags ask for. Raises ValueError (an unreadable or empty token)."""
    from relax_straggler.monitor.guard import ApiGuard, default_hosts, read_token

    hosts, ip_hosts = default_hosts(args.host)
    if args.allowed_host:
        hosts = hosts | {h.strip().strip("[]").lower().rstrip(".") for h in args.allowed_host}
    return ApiGuard(token=read_token(args.token_file), allowed_hosts=frozenset(hosts), allow_ip_hosts=ip_hosts,
                    allow_get_registration=args.allow_get_registration)


def run(args: argparse.Namespace) -> int:
    from relax_straggler.monitor.api import create_app
    from relax_straggler.monitor.server import serve
    from relax_straggler.monitor.service import Monitor, MonitorConfig
    from relax_straggler.monitor.trigger import TriggerConfig
    from relax_straggler.stores.url import redact

    try:
        guard = guard_of(args)
        trigger = TriggerConfig(history_size=args.history_size, slowdown_threshold=args.slowdown_threshold,
                                hang_threshold_s=args.hang_threshold)
        config = MonitorConfig(store_url=args.store, check_interval_s=args.check_interval, trigger=trigger,
                               state_path=args.state, workers=args.workers, max_jobs=args.max_jobs)
        monitor = Monitor(config)
    except ValueError as exc:
        log.error("%s", exc)
        return 1
    log.info("monitor: store %s, state %s, http://%s:%d, %s", redact(args.store), config.resolved_state_path(), args.host,
             args.port, "register / unregister need the token" if guard.token else "no token")
    serve(create_app(monitor, guard=guard), args.host, args.port, request_timeout_s=args.request_timeout)
    return 0
