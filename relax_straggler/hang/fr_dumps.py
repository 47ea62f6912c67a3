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
function (which is how a pickle runs code), any call, any set and any dict key that is not
a string or a number (hashing a key made of shared tuples can take 2^levels steps). The
result is then bounded before any field is read: at most MAX_DEPTH levels deep, and no more
objects, counted as a tree, than the file has bytes (a pickle that refers back to its own
objects can otherwise stand for 2^80 of them in a kilobyte). Every bad value is shown
through one bounded formatter (_show). No torch is imported.
"""

from __future__ import annotations

import glob as globlib
import io
import json
import os
import pickle
import re
import struct
from dataclasses import dataclass
from typing import Any, Optional

from relax_straggler.common.topology import MAX_WORLD_SIZE
from relax_straggler.common.validators import is_int
from relax_straggler.readers.base import InputError

DEFAULT_PREFIX = "nccl_trace_rank_"
STATES = ("scheduled", "started", "completed")
P2P_OPS = ("send", "recv")

INT64 = 1 << 63  # torch writes every id and time as an int64
_RANK_SUFFIX = re.compile(r"^(.*?)([0-9]+)$")
_GLOB_CHARS = re.compile(r"[*?\[]")
_DIGITS = re.compile(r"^[0-9]+$")
_PG_ID = re.compile(r"^-?[0-9]{1,18}$")
# A JSON dump (torch's _dump_fr_trace_json) opens with one of the dump's own keys.
_JSON_DUMP = re.compile(rb'^\s*\{\s*"(comm_lib_version|entries|nccl_version|pg_config|pg_status|version)"\s*:')
MAX_DEPTH = 32  # a dump nests 5 levels (entries, an entry, its input_sizes, one size)
_KEY_TYPES = (str, int, float, bool, type(None), bytes)


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


def _key(k: Any) -> Any:
    """k when it is safe to hash (a scalar: linear in its size)."""
    if type(k) not in _KEY_TYPES:
        raise pickle.UnpicklingError(f"refused: a dict key that is {_show(k)} (a dump's keys are strings and numbers)")
    return k


class _SafeUnpickler(pickle._Unpickler):
    """Plain containers and scalars only: every class or function reference, call and set is
    refused and every dict key checked before it is hashed. The Python implementation of the
    unpickler, because its opcodes can be overridden one by one (the C one offers only
    find_class)."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused: the pickle asks for the Python object {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError(f"refused: the pickle asks for the persistent object {_show(pid)}")

    def _refuse_call(self) -> None:
        raise pickle.UnpicklingError("refused: the pickle calls or builds an object (a dump holds only data)")

    def _refuse_set(self) -> None:
        raise pickle.UnpicklingError("refused: the pickle builds a set (a dump holds none)")

    def _dict(self) -> None:
        items = self.pop_mark()
        self.append({_key(items[i]): items[i + 1] for i in range(0, len(items), 2)})

    def _setitem(self) -> None:
        value = self.stack.pop()
        key = self.stack.pop()
        self.stack[-1][_key(key)] = value

    def _setitems(self) -> None:
        items = self.pop_mark()
        target = self.stack[-1]
        for i in range(0, len(items), 2):
            target[_key(items[i])] = items[i + 1]

    for _op in (pickle.REDUCE, pickle.BUILD, pickle.INST, pickle.OBJ, pickle.NEWOBJ, pickle.NEWOBJ_EX):
        dispatch[_op[0]] = _refuse_call
    for _op in (pickle.EMPTY_SET, pickle.ADDITEMS, pickle.FROZENSET):
        dispatch[_op[0]] = _refuse_set
    dispatch[pickle.DICT[0]] = _dict
    dispatch[pickle.SETITEM[0]] = _setitem
    dispatch[pickle.SETITEMS[0]] = _setitems
    del _op


def is_flight_recorder_input(path: str) -> bool:
    """Whether `path` is for the Flight Recorder reader: a directory, a glob pattern that
    names no existing file, a file that starts with a pickle header (0x80), or a JSON object
    whose first key is one of a dump's ("version", "entries", "pg_config", ...: the JSON
    form); never a URL."""
    if "://" in path:
        return False
    if os.path.isdir(path):
        return True
    if not os.path.exists(path):
        return bool(_GLOB_CHARS.search(path))
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return head[:1] == b"\x80" or bool(_JSON_DUMP.match(head))


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
    _bound(path, raw, len(data) + 64)
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
            RecursionError, OverflowError, struct.error) as exc:
        raise InputError(f"{path}: not a readable Flight Recorder dump: the pickle is truncated or corrupt "
                         f"({type(exc).__name__}: {exc})") from None


def _bound(path: str, raw: Any, budget: int) -> None:
    """Raises InputError when `raw`, counted as a tree (a shared object once per reference),
    holds more than `budget` objects or nests deeper than MAX_DEPTH, naming the top-level
    field; linear in `budget` whatever `raw` is."""
    if not isinstance(raw, (dict, list, tuple)):
        return
    seen = 0
    stack: list[tuple[Any, int, Any]] = [(raw, 0, None)]
    while stack:
        value, depth, field = stack.pop()
        if depth > MAX_DEPTH:
            raise InputError(f"{path}: {_where(field)} is nested deeper than {MAX_DEPTH} levels (a dump nests 5)")
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, child in items:
            seen += 2 if isinstance(value, dict) else 1
            if isinstance(child, (dict, list, tuple)):
                stack.append((child, depth + 1, key if field is None else field))
            if seen > budget:
                raise InputError(f"{path}: {_where(field)} refers back to its own objects: more than {budget:,} "
                                 f"objects from a file of {budget - 64:,} bytes; not a Flight Recorder dump")


def _where(field: Any) -> str:
    """A top-level field (or the dump itself: None) for a message."""
    return "the dump" if field is None else f"field {_show(field)}"


def _check(path: str, rank: int, raw: Any, mtime: float) -> Dump:
    if not isinstance(raw, dict):
        raise InputError(f"{path}: a Flight Recorder dump is a dict, got {type(raw).__name__}")
    if "entries" not in raw:
        raise InputError(f"{path}: no field 'entries' (dumped without collectives?)")
    version = raw.get("version")
    if not isinstance(version, str):
        raise InputError(f"{path}: field 'version' must be a string, got {_show(version)}")
    lib_field = "comm_lib_version" if "comm_lib_version" in raw else "nccl_version"
    lib = raw.get(lib_field, "")
    if not isinstance(lib, str):
        raise InputError(f"{path}: field {lib_field!r} must be a string, got {_show(lib)}")
    entries_raw = raw["entries"]
    if not isinstance(entries_raw, (list, tuple)):
        raise InputError(f"{path}: field 'entries' must be a list, got {_show(entries_raw)}")
    entries = tuple(_entry(f"{path}: entries[{i}]", e) for i, e in enumerate(entries_raw))
    return Dump(path=path, rank=rank, version=version, lib_version=lib,
                groups=_pg_config(path, raw.get("pg_config")), pg_ids=_pg_ids(path, raw.get("pg_status")),
                entries=entries, mtime=mtime)


def _pg_config(path: str, cfg: Any) -> dict[str, tuple[str, Optional[tuple[int, ...]]]]:
    if cfg is None:
        return {}
    if not isinstance(cfg, dict):
        raise InputError(f"{path}: field 'pg_config' must be a dict, got {_show(cfg)}")
    out = {}
    for key, info in cfg.items():
        where = f"{path}: pg_config[{_show(key)}]"
        if not isinstance(info, dict):
            raise InputError(f"{where} must be a dict, got {_show(info)}")
        name = info.get("name", key)
        desc = info.get("desc", "")
        if not isinstance(name, str) or not isinstance(desc, str):
            raise InputError(f"{where}: 'name' and 'desc' must be strings, got {_show(name)} and {_show(desc)}")
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
            raise InputError(f"{where}: 'ranks' must be a list like '[0, 1]', got {_show(value)}")
        parts = [p.strip() for p in text[1:-1].split(",") if p.strip()]
        if not all(_DIGITS.match(p) for p in parts):
            raise InputError(f"{where}: 'ranks' must be a list of ranks, got {_show(value)}")
        ranks = [int(p) if len(p) < 10 else MAX_WORLD_SIZE for p in parts]
    elif isinstance(value, (list, tuple)) and all(is_int(r) and r >= 0 for r in value):
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
        raise InputError(f"{path}: field 'pg_status' must be a dict, got {_show(status)}")
    ids = set()
    for key in status:
        # Types first: str() of an int of thousands of digits raises.
        if not ((isinstance(key, str) and _PG_ID.match(key)) or (is_int(key) and -INT64 <= key < INT64)):
            raise InputError(f"{path}: pg_status key {_show(key)} is not a process group id")
        ids.add(int(key))
    return frozenset(ids)


def _show(v: Any) -> str:
    """A value for an error message, whatever its size or shape: a short value as written,
    else its type, size and a short prefix (at most ~100 characters; never str() of a
    container or of a huge int)."""
    if v is None or isinstance(v, (bool, float)):
        return repr(v)
    if isinstance(v, int):
        return repr(v) if v.bit_length() <= 64 else f"an int of {v.bit_length()} bits"
    if isinstance(v, (str, bytes)):
        if len(v) <= 40:
            return repr(v)
        return f"a {type(v).__name__} of {len(v):,} characters starting {v[:40]!r}"
    if isinstance(v, (list, tuple, dict)):
        return f"a {type(v).__name__} of {len(v):,} item{'' if len(v) == 1 else 's'}"
    return f"a {type(v).__name__}"


def _int(where: str, e: dict, *names: str, optional: bool = False) -> Optional[int]:
    """The first of `names` present in e, checked as an integer (None allowed when optional;
    the JSON form writes 0 for a time not seen, hence `or None` at the callers)."""
    for name in names:
        if name in e:
            v = e[name]
            if v is None and optional:
                return None
            if not is_int(v) or not 0 <= v < INT64:
                raise InputError(f"{where}: field {name!r} must be an integer in [0, 2^63), got {_show(v)}")
            return v
    if optional:
        return None
    raise InputError(f"{where}: no field {' or '.join(repr(n) for n in names)}")


def _entry(where: str, e: Any) -> Entry:
    if not isinstance(e, dict):
        raise InputError(f"{where}: an entry must be a dict, got {_show(e)}")
    name = e.get("profiling_name")
    if not isinstance(name, str) or not name:
        raise InputError(f"{where}: field 'profiling_name' must be a non-empty string, got {_show(name)}")
    op = name.split(":", 1)[1] if ":" in name else name  # "nccl:all_reduce" -> "all_reduce"
    if not op.strip():
        raise InputError(f"{where}: field 'profiling_name' has no op name, got {_show(name)}")
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
