"""The `relax-straggler` command line. Each subcommand lives in its own module under
relax_straggler/cli/ and exposes `register(subparsers)`, which adds its parser and sets
`run=<function(args) -> exit code>` as a default."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Optional, Sequence

COMMANDS: tuple[str, ...] = ("parity", "analyze", "flight-recorder", "patch", "monitor", "feed", "ingest", "whatif",
                             "drain-plan")
# A command's old name -> its name; its parser accepts the old name too (add_parser aliases).
ALIASES: dict[str, str] = {"replay": "feed"}


def build_parser(only: Optional[str] = None) -> argparse.ArgumentParser:
    """The parser with every subcommand, or only `only` (one of COMMANDS): a command then
    imports no other subcommand's modules. Every parser follows cli/common.py's conventions."""
    from relax_straggler import __version__
    from relax_straggler.cli.common import PROG, Parser

    parser = Parser(prog=PROG, description="Straggler detection for distributed training. Exit status: 0 ok, "
                                           "1 a finding or an error in the data, 2 bad usage (docs/USAGE.md).")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="Debug logging.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    only = ALIASES.get(only, only)
    for name in (only,) if only in COMMANDS else COMMANDS:
        importlib.import_module(f"relax_straggler.cli.{name.replace('-', '_')}").register(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    from relax_straggler.cli.common import LogFormatter

    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    handler = logging.StreamHandler()  # stderr: stdout carries the result (--format json)
    handler.setFormatter(LogFormatter("%(message)s"))
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, handlers=[handler])
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
