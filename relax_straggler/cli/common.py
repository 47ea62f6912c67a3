"""The conventions every `relax-straggler` command follows (docs/USAGE.md, "Command line"):

- output: `--format {text,json}` for what a command prints on stdout, `--json PATH` to also
  write its result as JSON (add_output_arguments, emit); input formats are chosen with
  `--input-format`;
- `--no-progress`: a rich progress bar on stderr (only when stderr is a terminal) for a
  command that can run for seconds (add_progress_argument, progress);
- one error style on stderr, `relax-straggler: error: ...` (error(), and the log records of
  level ERROR, formatted by LogFormatter), and one set of exit codes (EXIT_*).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from typing import Any, Callable, Iterator, Optional

PROG = "relax-straggler"
EXIT_OK = 0  # the command ran (whatever it found, unless the command says otherwise)
EXIT_DATA = 1  # a finding the command exists to report, or an input / store / file that cannot be used
EXIT_USAGE = 2  # bad arguments: a flag, a URL's syntax, a job id


class Parser(argparse.ArgumentParser):
    """argparse with the command's error style: usage, then `relax-straggler: error: ...`, exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{PROG}: error: {message}\n")


def error(message: str, code: int = EXIT_DATA) -> int:
    """Prints `relax-straggler: error: message` on stderr; returns code (the exit status)."""
    sys.stderr.write(f"{PROG}: error: {message}\n")
    sys.stderr.flush()
    return code


def note(message: str) -> None:
    """Prints `relax-straggler: message` on stderr (a warning, a hint)."""
    sys.stderr.write(f"{PROG}: {message}\n")
    sys.stderr.flush()


class LogFormatter(logging.Formatter):
    """Log records as the commands' own lines: ERROR `relax-straggler: error: ...`, WARNING
    `relax-straggler: warning: ...`, the rest the message alone."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if record.levelno >= logging.ERROR:
            return f"{PROG}: error: {text}"
        if record.levelno >= logging.WARNING:
            return f"{PROG}: warning: {text}"
        return text


def add_output_arguments(parser: argparse.ArgumentParser, text: str = "a readable report",
                         json_what: str = "the result", legacy: tuple[str, ...] = ()) -> argparse._ArgumentGroup:
    """--format {text,json} (stdout) and --json PATH, in an "output" group (returned).
    legacy: more --format values the command still accepts from an older spelling (not
    shown in the help; the command turns them into what they meant)."""
    out = parser.add_argument_group("output")
    out.add_argument("--format", choices=("text", "json") + legacy, default="text", metavar="{text,json}",
                     help=f"what stdout gets: text ({text}) or json ({json_what}); default text")
    out.add_argument("--json", dest="json_path", default=None, metavar="PATH",
                     help=f"also write {json_what} as JSON to this file")
    return out


def add_progress_argument(parser: Any) -> None:
    """--no-progress (parser: a parser or an argument group)."""
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def emit(args: argparse.Namespace, result: dict[str, Any], text: Callable[[], None]) -> int:
    """The result of a command: written to --json PATH if given, then on stdout as JSON
    (--format json) or by text(). Returns EXIT_OK, or EXIT_DATA when the file cannot be written."""
    if getattr(args, "json_path", None):
        try:
            with open(args.json_path, "w", encoding="utf-8") as f:
                json.dump(result, f, indent=2)
                f.write("\n")
        except OSError as exc:
            return error(f"cannot write {exc.filename or args.json_path}: {exc.strerror or exc}")
    if getattr(args, "format", "text") == "json":
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        text()
    return EXIT_OK


@contextlib.contextmanager
def progress(args: argparse.Namespace, description: str, total: Optional[float] = None,
             bytes_: bool = False) -> Iterator[Callable[..., None]]:
    """A rich progress bar on stderr for one task, shown unless --no-progress or stderr is
    not a terminal; yields update(completed=None, total=None, description=None). total
    None: an indeterminate bar (elapsed time only). bytes_: show completed/total as sizes.
    Hidden, it imports nothing (rich costs a short command a good part of its time)."""
    if getattr(args, "no_progress", False) or not sys.stderr.isatty():
        yield lambda completed=None, total=None, description=None: None
        return
    from rich.console import Console
    from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TimeElapsedColumn,
                               TimeRemainingColumn)

    counts = DownloadColumn() if bytes_ else MofNCompleteColumn()
    with Progress("[progress.description]{task.description}", BarColumn(), counts, TimeElapsedColumn(),
                  TimeRemainingColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total)

        def update(completed: Optional[float] = None, total: Optional[float] = None,
                   description: Optional[str] = None) -> None:
            changes: dict[str, Any] = {}
            if completed is not None:
                changes["completed"] = completed
            if total is not None:
                changes["total"] = total
            if description is not None:
                changes["description"] = description
            bar.update(task, **changes)

        yield update
