"""The relax_straggler warnings a worker process logged, as text, for its result file."""

import logging


class Warnings(logging.Handler):
    """Collects the messages of WARNING and above: `logging.getLogger("relax_straggler")
    .addHandler(w)`, then `w.lines`."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
