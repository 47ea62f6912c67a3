"""The what-if figures `analyze` adds to its summary for inputs with per-op records."""

from __future__ import annotations

from typing import Optional

from relax_straggler.readers import OP_FORMATS, InputError, Source


def whatif_summary(source: Source) -> Optional[dict]:
    """The what-if figures (relax_straggler.whatif, docs/WHATIF.md) of a source opened with
    ops=True and read to its end; None when it has no per-op records. A trace the replay
    cannot model gives {"error": message} instead of failing the analysis."""
    if source.format not in OP_FORMATS:
        return None
    from relax_straggler.whatif import analyze_records
    from relax_straggler.whatif.loader import records_of

    try:
        return analyze_records(records_of(source), by_worker=False).brief()
    except InputError as exc:
        return {"error": str(exc)}
