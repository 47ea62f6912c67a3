"""`relax-straggler monitor`: the online detection service (docs/MONITOR.md).

Exit status: 0 stopped by a signal; 1 the state file or store URL cannot be used; 2 bad arguments;
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
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from relax_straggler.monitor.api import create_app
    from relax_straggler.monitor.service import Monitor, MonitorConfig
    from relax_straggler.monitor.trigger import TriggerConfig

    try:
        trigger = TriggerConfig(history_size=args.history_size, slowdown_threshold=args.slowdown_threshold,
                                hang_threshold_s=args.hang_threshold)
        config = MonitorConfig(store_url=args.store, check_interval_s=args.check_interval, trigger=trigger,
                               state_path=args.state, workers=args.workers)
        monitor = Monitor(config)
    except ValueError as exc:
        log.error("%s", exc)
        return 1
    log.info("monitor: store %s, state %s, http://%s:%d", args.store, config.resolved_state_path(), args.host,
             args.port)
    uvicorn.run(create_app(monitor), host=args.host, port=args.port, log_level="warning")
    return 0
