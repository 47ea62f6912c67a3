"""PyTorch Flight Recorder dumps read safely: one file per rank, checked field by field.

torch writes one dump per rank when a collective times out (TORCH_NCCL_DUMP_ON_TIMEOUT=1,
file TORCH_FR_DUMP_TEMP_FILE<rank>, default /tmp/nccl_trace_rank_<rank>), or on request
(torch._C._distributed_c10d._dump_fr_trace, _dump_fr_trace_json). A dump is a pickled (or
JSON) dict: "version" ("2.10" in torch 2.13), "pg_config" ({name: {"name", "desc", "ranks"}},
ranks as the text "[0, 1]"), "pg_status" ({pg_id: {"last_enqueued_collective", ...}}) and
"entries", one dict per recorded op (a ring buffer of TORCH_FR_BUFFER_SIZE ops):
record_id, pg_id, process_group (name, desc), collective_seq_id, p2p_seq_id, op_id,
profiling_name ("nccl:all_reduce", "nccl:send 0->1"), time_created_ns (wall clock), state
(scheduled / started / completed), time_discovered_started_ns,
time_discovered_completed_ns, retired, duration_ms (with timing enabled), is_p2p, timeout_ms.
Older torch 2.x dumps lack is_p2p, name the library version "nccl_version", or number ops
with one "seq_id"; they are read alike.

The pickle is never trusted: a restricted unpickler builds only dicts, lists, tuples,
strings, numbers, booleans and None, and refuses any reference to a Python class or
function (which is how a pickle runs code). No torch is imported.
"""

from __future__ import annotations

import glob as globlib
import io
import json
import os
import pickle
import re
from dataclasses import dataclass
from typing import Any, Optional

from relax_straggler.readers.base import InputError
from relax_straggler.topology import MAX_WORLD_SIZE

DEFAULT_PREFIX = "nccl_trace_rank_"
STATES = ("scheduled", "started", "completed")
P2P_OPS = ("send", "recv")

INT64 = 1 << 63  # torch writes every id and time as an int64
_RANK_SUFFIX = re.compile(r"^(.*?)([0-9]+)$")
_GLOB_CHARS = re.compile(r"[*?\[]")
_DIGITS = re.compile(r"^[0-9]+$")
_PG_ID = re.compile(r"^-?[0-9]{1,18}$")


@dataclass(frozen=True)
class Entry:
    """One recorded op. seq: its number among the group's collectives (p2p: among its
    sends / recvs); times in ns of the rank's wall clock (None: not seen); duration_ms None
    without timing."""

    record_id: int
    group: str
    desc: str
    pg_id: Optional[int]
    op: str
    is_p2p: bool
    seq: int
    created_ns: int
    state: str
    started_ns: Optional[int]
    completed_ns: Optional[int]
    retired: bool
    duration_ms: Optional[float]

    @property
    def done(self) -> bool:
        """Seen completed, or retired from the watchdog's list (Gloo retires without a state)."""
        return self.state == "completed" or self.retired


@dataclass(frozen=True)
class Dump:
    """One rank's dump. groups: pg_config as {name: (desc, ranks or None when the dump
    names none)}; pg_ids: the pg_status keys (None: the dump has no pg_status);
    mtime: the file's modification time (s), when the dump was written."""

    path: str
    rank: int
    version: str
    lib_version: str
    groups: dict[str, tuple[str, Optional[tuple[int, ...]]]]
    pg_ids: Optional[frozenset[int]]
    entries: tuple[Entry, ...]
    mtime: float

    @property
    def wrapped(self) -> bool:
        """Whether older ops may have left the ring buffer (the first record is not kept)."""
        return not self.entries or min(e.record_id for e in self.entries) > 0


class _SafeUnpickler(pickle.Unpickler):
    """Plain containers and scalars only: every class or function reference is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused: the pickle asks for the Python object {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError(f"refused: the pickle asks for the persistent object {_show(pid)}")


def is_flight_recorder_input(path: str) -> bool:
    """Whether `path` is for the Flight Recorder reader: a directory, a glob pattern that
    names no existing file, or a file that starts with a pickle header (0x80); never a URL."""
    if "://" in path:
        return False
    if os.path.isdir(path):
        return True
    if not os.path.exists(path):
        return bool(_GLOB_CHARS.search(path))
    try:
        with open(path, "rb") as f:
            return f.read(1) == b"\x80"
    except OSError:
        return False


def dump_files(path: str) -> dict[int, str]:
    """{rank: file} of a directory of dumps (its files named PREFIX<rank>, one prefix), a
    glob pattern or one dump file; the rank is the name's numeric suffix. Raises
    InputError for no dumps, a name without a rank, two prefixes in a directory or two
    files of one rank."""
    if os.path.isdir(path):
        named = {}
        for name in sorted(os.listdir(path)):
            m = _RANK_SUFFIX.match(name)
            if m and os.path.isfile(os.path.join(path, name)):
                named.setdefault(m.group(1), []).append(os.path.join(path, name))
        if not named:
            raise InputError(f"{path}: is a directory, not an input file, and holds no Flight Recorder dumps "
                             f"(files named PREFIX<rank>, e.g. {DEFAULT_PREFIX}0)")
        if len(named) > 1:
            raise InputError(f"{path}: dumps with different prefixes ({', '.join(repr(p) for p in sorted(named))}); "
                             f"give one set as a glob, e.g. '{os.path.join(path, sorted(named)[0])}*'")
        files = next(iter(named.values()))
    elif os.path.isfile(path):
        files = [path]
    else:
        files = sorted(f for f in globlib.glob(path) if os.path.isfile(f))
        if not files:
            raise InputError(f"{path}: no such file, directory or matching dump")
    out: dict[int, str] = {}
    for f in files:
        m = _RANK_SUFFIX.match(os.path.basename(f))
        if not m:
            raise InputError(f"{f}: no rank in the file name (Flight Recorder names its dumps PREFIX<rank>, "
                             f"e.g. {DEFAULT_PREFIX}3)")
        rank = int(m.group(2))
        if rank >= MAX_WORLD_SIZE:
            raise InputError(f"{f}: rank {m.group(2)[:20]} in the file name is beyond {MAX_WORLD_SIZE:,} ranks")
        if rank in out:
            raise InputError(f"{f}: a second dump of rank {rank} (first: {out[rank]})")
        out[rank] = f
    return out


def load_dump(path: str, rank: int) -> Dump:
    """The checked dump in `path` of global rank `rank`. Raises InputError naming the file
    (and the entry and field) for an unreadable, truncated, refused or malformed dump;
    OSError when the file cannot be opened."""
    with open(path, "rb") as f:
        data = f.read()
        mtime = os.fstat(f.fileno()).st_mtime
    raw = _decode(path, data)
    return _check(path, rank, raw, mtime)


def _decode(path: str, data: bytes) -> Any:
    if not data:
        raise InputError(f"{path}: empty file, not a Flight Recorder dump")
    if data.lstrip()[:1] == b"{":  # the JSON form of the same dict
        try:
            return json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise InputError(f"{path}: not a readable Flight Recorder dump: invalid JSON ({exc})") from None
    if data[:1] != b"\x80":
        raise InputError(f"{path}: not a Flight Recorder dump (neither a pickle nor JSON)")
    try:
        return _SafeUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        if str(exc).startswith("refused"):
            raise InputError(f"{path}: {exc}; a Flight Recorder dump holds only dicts, lists, strings and "
                             f"numbers") from None
        raise InputError(f"{path}: not a readable Flight Recorder dump: the pickle is truncated or corrupt "
                         f"({exc})") from None
    except (EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError, MemoryError,
            RecursionError, OverflowError) as exc:
        raise InputError(f"{path}: not a readable Flight Recorder dump: the pickle is truncated or corrupt "
                         f"({type(exc).__name__}: {exc})") from None


def _check(path: str, rank: int, raw: Any, mtime: float) -> Dump:
    if not isinstance(raw, dict):
        raise InputError(f"{path}: a Flight Recorder dump is a dict, got {type(raw).__name__}")
    if "entries" not in raw:
        raise InputError(f"{path}: no field 'entries' (dumped without collectives?)")
    version = raw.get("version")
    if not isinstance(version, str):
        raise InputError(f"{path}: field 'version' must be a string, got {_show(version)}")
    lib = raw.get("comm_lib_version", raw.get("nccl_version", ""))
    entries_raw = raw["entries"]
    if not isinstance(entries_raw, (list, tuple)):
        raise InputError(f"{path}: field 'entries' must be a list, got {type(entries_raw).__name__}")
    entries = tuple(_entry(f"{path}: entries[{i}]", e) for i, e in enumerate(entries_raw))
    return Dump(path=path, rank=rank, version=version, lib_version=lib if isinstance(lib, str) else str(lib),
                groups=_pg_config(path, raw.get("pg_config")), pg_ids=_pg_ids(path, raw.get("pg_status")),
                entries=entries, mtime=mtime)


def _pg_config(path: str, cfg: Any) -> dict[str, tuple[str, Optional[tuple[int, ...]]]]:
    if cfg is None:
        return {}
    if not isinstance(cfg, dict):
        raise InputError(f"{path}: field 'pg_config' must be a dict, got {type(cfg).__name__}")
    out = {}
    for key, info in cfg.items():
        where = f"{path}: pg_config[{_show(key)}]"
        if not isinstance(info, dict):
            raise InputError(f"{where} must be a dict, got {type(info).__name__}")
        name = info.get("name", key)
        desc = info.get("desc", "")
        if not isinstance(name, str) or not isinstance(desc, str):
            raise InputError(f"{where}: 'name' and 'desc' must be strings")
        out[name] = (desc, _ranks(where, info.get("ranks")))
    return out


def _ranks(where: str, value: Any) -> Optional[tuple[int, ...]]:
    """The group's global ranks from "[0, 1]" or a list; None when the dump gives none
    (Gloo writes one placeholder group with no ranks)."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        if not (text.startswith("[") and text.endswith("]")):
            raise InputError(f"{where}: 'ranks' must be a list like '[0, 1]', got {value[:60]!r}")
        parts = [p.strip() for p in text[1:-1].split(",") if p.strip()]
        if not all(_DIGITS.match(p) for p in parts):
            raise InputError(f"{where}: 'ranks' must be a list of ranks, got {value[:60]!r}")
        ranks = [int(p) if len(p) < 10 else MAX_WORLD_SIZE for p in parts]
    elif isinstance(value, (list, tuple)) and all(_is_int(r) and r >= 0 for r in value):
        ranks = list(value)
    else:
        raise InputError(f"{where}: 'ranks' must be a list of ranks, got {_show(value)}")
    if any(r >= MAX_WORLD_SIZE for r in ranks):
        raise InputError(f"{where}: 'ranks' names a rank beyond {MAX_WORLD_SIZE:,}")
    return tuple(sorted(set(ranks))) or None


def _pg_ids(path: str, status: Any) -> Optional[frozenset[int]]:
    if status is None:
        return None
    if not isinstance(status, dict):
        raise InputError(f"{path}: field 'pg_status' must be a dict, got {type(status).__name__}")
    ids = set()
    for key in status:
        text = str(key)
        if not _PG_ID.match(text):
            raise InputError(f"{path}: pg_status key {_show(key)} is not a process group id")
        ids.add(int(text))
    return frozenset(ids)


def _show(v: Any) -> str:
    """A value for an error message: at most 60 characters, whatever its size."""
    if isinstance(v, int) and v.bit_length() > 64:
        return f"an integer of {v.bit_length()} bits"
    if isinstance(v, (str, bytes, int, float, bool)) or v is None:
        return repr(v)[:60]
    return f"a {type(v).__name__}"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int(where: str, e: dict, *names: str, optional: bool = False) -> Optional[int]:
    """The first of `names` present in e, checked as an integer (None allowed when optional;
    the JSON form writes 0 for a time not seen, hence `or None` at the callers)."""
    for name in names:
        if name in e:
            v = e[name]
            if v is None and optional:
                return None
            if not _is_int(v) or not 0 <= v < INT64:
                raise InputError(f"{where}: field {name!r} must be an integer in [0, 2^63), got {_show(v)}")
            return v
    if optional:
        return None
    raise InputError(f"{where}: no field {' or '.join(repr(n) for n in names)}")


def _entry(where: str, e: Any) -> Entry:
    if not isinstance(e, dict):
        raise InputError(f"{where}: an entry must be a dict, got {type(e).__name__}")
    name = e.get("profiling_name")
    if not isinstance(name, str) or not name:
        raise InputError(f"{where}: field 'profiling_name' must be a non-empty string, got {_show(name)}")
    op = name.split(":", 1)[1] if ":" in name else name  # "nccl:all_reduce" -> "all_reduce"
    pg_id = _int(where, e, "pg_id", optional=True)
    pg = e.get("process_group")
    if pg is None:
        if pg_id is None:
            raise InputError(f"{where}: no field 'process_group' or 'pg_id'")
        group, desc = str(pg_id), ""
    elif isinstance(pg, (list, tuple)) and len(pg) == 2 and all(isinstance(x, str) for x in pg):
        group, desc = pg
    else:
        raise InputError(f"{where}: field 'process_group' must be (name, desc), got {_show(pg)}")
    is_p2p = e.get("is_p2p")
    if is_p2p is None:
        is_p2p = op.split(" ", 1)[0] in P2P_OPS
    elif not isinstance(is_p2p, bool):
        raise InputError(f"{where}: field 'is_p2p' must be a boolean, got {_show(is_p2p)}")
    seq = _int(where, e, "p2p_seq_id", "seq_id") if is_p2p else _int(where, e, "collective_seq_id", "seq_id")
    state = e.get("state", "scheduled")
    if state not in STATES:
        raise InputError(f"{where}: field 'state' must be one of {', '.join(STATES)}, got {_show(state)}")
    retired = e.get("retired", False)
    if not isinstance(retired, bool):
        raise InputError(f"{where}: field 'retired' must be a boolean, got {_show(retired)}")
    duration = e.get("duration_ms")
    if duration is not None and (isinstance(duration, bool) or not isinstance(duration, (int, float))
                                 or not 0 <= duration < 1e12):
        raise InputError(f"{where}: field 'duration_ms' must be a time >= 0 in ms, got {_show(duration)}")
    return Entry(record_id=_int(where, e, "record_id"), group=group, desc=desc, pg_id=pg_id, op=op, is_p2p=is_p2p,
                 seq=seq, created_ns=_int(where, e, "time_created_ns"), state=state,
                 started_ns=_int(where, e, "time_discovered_started_ns", optional=True) or None,
                 completed_ns=_int(where, e, "time_discovered_completed_ns", optional=True) or None, retired=retired,
                 duration_ms=None if duration is None else float(duration))
