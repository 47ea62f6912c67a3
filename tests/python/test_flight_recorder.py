"""The hang answer from PyTorch Flight Recorder dumps (relax_straggler.hang.flight_recorder)
and the `relax-straggler flight-recorder` command on them (and `analyze`, which runs it).

Two kinds of input. Real dumps: torch 2.13 records Gloo collectives in its Flight Recorder
on CPU, so a 3-rank Gloo job (tests/python/workers/fr_dump.py) stops with one rank skipping
an all_reduce (or entering a broadcast instead) and every rank writes torch's own dump
(_dump_fr_trace, named TORCH_FR_DUMP_TEMP_FILE<rank>). Built dumps: dicts written to the
documented format (fr_dumps.py's docstring; torch's FlightRecorder.hpp field names) for
what Gloo does not record (durations, send / recv), for the field sets of older torch 2.x
versions, and for broken or hostile files.

    .venv/bin/python -m pytest tests/python/test_flight_recorder.py -q -x
"""

from __future__ import annotations

import functools
import json
import os
import pickle
import random
import shutil
import subprocess
import sys

import pytest

from conftest import REPO
from relax_straggler.cli import main
from relax_straggler.hang import DESYNC, LAGGING, MISSING, NONE
from relax_straggler.hang.flight_recorder import read_flight_recorder
from relax_straggler.hang.fr_dumps import is_flight_recorder_input
from relax_straggler.readers import InputError

WORKER = REPO / "tests" / "python" / "workers" / "fr_dump.py"
T0 = 1_700_000_000 * 10**9  # ns of the built dumps' wall clock
WORLD = ("0", "default_pg")
DP = ("3", "dp-1")


# Real dumps of a 3-rank Gloo job ------------------------------------------------------
def run_job(out, scenario: str) -> None:
    out.mkdir()
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_FR_BUFFER_SIZE="2000",
               TORCH_FR_DUMP_TEMP_FILE=str(out / "nccl_trace_rank_"))
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(r), "3", str(out.parent / f"rdv-{scenario}"), scenario],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(3)]
    for p in procs:
        output, _ = p.communicate(timeout=120)
        assert p.returncode == 0, output[-3000:]


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    base = tmp_path_factory.mktemp("fr")
    for scenario in ("skip", "desync"):
        run_job(base / scenario, scenario)
    return base


def test_real_dumps_name_the_rank_that_skipped_the_all_reduce(real):
    fr = read_flight_recorder(str(real / "skip"))
    assert sorted(fr.dumps) == [0, 1, 2] and {d.version for d in fr.dumps.values()} == {"2.10"}
    f = fr.answer.findings[0]
    assert (fr.answer.kind, f.rank, f.op, f.seq, f.group, f.group_ranks, f.waiting) == \
        (LAGGING, 1, "all_reduce", 4, "default_pg", (0, 1, 2), (0, 2))
    assert f.last_completed == "broadcast #1 of group pair"
    assert len(fr.answer.findings) == 1  # the pair group (ranks 0-1, from their records) holds nobody


def test_real_dumps_show_a_desync(real):
    fr = read_flight_recorder(str(real / "desync"))
    f = fr.answer.findings[0]
    assert (f.kind, f.seq, dict(f.ops_by_rank)) == (DESYNC, 4, {"all_reduce": (0, 1), "broadcast": (2,)})


def test_real_dumps_with_a_rank_missing(real, tmp_path):
    shutil.copytree(real / "skip", tmp_path / "dumps")
    os.remove(tmp_path / "dumps" / "nccl_trace_rank_2")
    fr = read_flight_recorder(str(tmp_path / "dumps"), world_size=3)
    assert fr.answer.no_snapshot == (2,)
    assert {(f.kind, f.rank) for f in fr.answer.findings} == {(LAGGING, 1), (MISSING, 2)}


def test_the_command_prints_and_writes_the_answer(real, tmp_path, capsys):
    out = tmp_path / "summary.json"
    assert main(["flight-recorder", str(real / "skip"), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "HANG (lagging): rank 1 never entered all_reduce #4 of group default_pg" in text
    summary = json.loads(out.read_text())
    hang = summary["hang"]
    assert (hang["straggler/hang/kind"], hang["straggler/hang/rank"], hang["straggler/hang/seq"],
            hang["straggler/hang/op"], hang["straggler/hang/waiting_ranks"], hang["straggler/hang/step"]) == \
        ("lagging", 1, 4, "all_reduce", 2, -1)
    assert summary["input"]["format"] == "flight-recorder" and summary["input"]["ranks"] == "0-2"
    assert main(["flight-recorder", str(real / "desync" / "nccl_trace_rank_*"), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["hang"]["straggler/hang/kind"] == "desync"


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_analyze_on_dumps_prints_the_same_and_names_the_command(real, tmp_path, capsys, fmt):
    path = str(real / "desync" / "nccl_trace_rank_*")
    assert main(["flight-recorder", path, "--format", fmt, "--json", str(tmp_path / "a.json")]) == 0
    own = capsys.readouterr()
    assert main(["analyze", path, "--format", fmt, "--json", str(tmp_path / "b.json")]) == 0
    analyzed = capsys.readouterr()
    assert analyzed.out == own.out and own.err == ""
    assert (tmp_path / "a.json").read_text() == (tmp_path / "b.json").read_text()
    assert analyzed.err == ("relax-straggler: note: Flight Recorder dumps have their own command: relax-straggler "
                            f"flight-recorder '{path}'\n")


# Built dumps ---------------------------------------------------------------------------
def op(seq, name="all_reduce", pg=WORLD, pg_id=0, t_s=0.0, record_id=None, state="completed", p2p=False,
       p2p_seq=0, duration=None, lib="nccl"):
    """An entry as torch 2.13 writes it (times: t_s s after T0)."""
    created = T0 + int(t_s * 1e9)
    e = {"record_id": record_id, "pg_id": pg_id, "process_group": pg, "collective_seq_id": seq,
         "p2p_seq_id": p2p_seq, "op_id": seq + p2p_seq, "profiling_name": f"{lib}:{name}",
         "time_created_ns": created, "input_sizes": [[8]], "input_dtypes": ["Float"], "output_sizes": [[8]],
         "output_dtypes": ["Float"], "state": state,
         "time_discovered_started_ns": created + 1000 if state != "scheduled" else None,
         "time_discovered_completed_ns": created + 2000 if state == "completed" else None,
         "retired": state == "completed", "timeout_ms": 600000, "is_p2p": p2p,
         "thread_id": "1", "thread_name": "python"}
    if duration is not None:
        e["duration_ms"] = duration
    return e


def dump(entries, groups=None, pg_status=None):
    for i, e in enumerate(entries):
        if e["record_id"] is None:
            e["record_id"] = i
    return {"version": "2.10", "comm_lib_version": "2.21.5",
            "pg_config": {name: {"name": name, "desc": desc, "ranks": str(list(ranks))}
                          for name, (desc, ranks) in (groups or {}).items()},
            "pg_status": pg_status if pg_status is not None else
            {str(pg): {"last_enqueued_collective": 1, "last_started_collective": 1, "last_completed_collective": 1}
             for pg in sorted({e["pg_id"] for e in entries})},
            "entries": entries}


def write(directory, rank, d, mtime_s=192.0, prefix="nccl_trace_rank_", raw=None):
    directory.mkdir(exist_ok=True)
    path = directory / f"{prefix}{rank}"
    path.write_bytes(raw if raw is not None else pickle.dumps(d, protocol=2))
    os.utime(path, ns=(T0 + int(mtime_s * 1e9),) * 2)
    return path


def lagging_job(rank_entries=None):
    """4 ranks of a world group: 0, 2 and 3 started all_reduce #5 at 100 s; rank 1 is stuck
    after #4 (at 90 s). Dumps written at 192 s."""
    out = {}
    for r in range(4):
        es = [op(s, t_s=10.0 * s) for s in range(1, 5)]
        if r != 1:
            es.append(op(5, t_s=100.0, state="started"))
        out[r] = es if rank_entries is None else rank_entries(r, es)
    return out


def write_job(tmp_path, per_rank, transform=lambda d: d, groups=None, skip=()):
    d = tmp_path / "dumps"
    for r, es in per_rank.items():
        if r not in skip:
            write(d, r, transform(dump(es, groups)))
    return d


def as_torch_2_7(d):
    """The field set of torch 2.5 - 2.7: "nccl_version", no thread fields."""
    d["nccl_version"] = d.pop("comm_lib_version")
    for e in d["entries"]:
        e.pop("thread_id"), e.pop("thread_name")
    return d


def as_torch_2_4(d):
    """Older still: no is_p2p (send / recv by name), no timeout_ms, no pg_status."""
    d = as_torch_2_7(d)
    d.pop("pg_status")
    for e in d["entries"]:
        e.pop("is_p2p"), e.pop("timeout_ms")
    return d


def as_seq_id(d):
    """The first dumps: one "seq_id", no p2p_seq_id / op_id, no process group name."""
    d = as_torch_2_4(d)
    d.pop("pg_config")
    for e in d["entries"]:
        e["seq_id"] = e.pop("collective_seq_id")
        e.pop("p2p_seq_id"), e.pop("op_id"), e.pop("process_group")
    return d


@pytest.mark.parametrize("transform", [lambda d: d, as_torch_2_7, as_torch_2_4, as_seq_id],
                         ids=["2.10", "2.7", "2.4", "seq_id"])
def test_every_version_gives_the_same_answer(tmp_path, transform):
    fr = read_flight_recorder(str(write_job(tmp_path, lagging_job(), transform)))
    f = fr.answer.findings[0]
    assert (fr.answer.kind, f.rank, f.op, f.seq, f.waiting) == (LAGGING, 1, "all_reduce", 5, (0, 2, 3))
    assert f.waited_s == pytest.approx(92.0)
    assert f.last_completed.startswith("all_reduce #4 of group")


def test_the_json_form_of_a_dump_reads_alike(tmp_path):
    d = tmp_path / "dumps"
    for r, es in lagging_job().items():
        for e in es:  # torch's JSON writer: 0 for a time not seen
            e["time_discovered_completed_ns"] = e["time_discovered_completed_ns"] or 0
        write(d, r, None, raw=json.dumps(dump(es)).encode())
    f = read_flight_recorder(str(d)).answer.findings[0]
    assert (f.kind, f.rank, f.seq) == (LAGGING, 1, 5)


def test_a_rank_without_a_dump_is_missing(tmp_path):
    groups = {"0": ("default_pg", range(4))}
    fr = read_flight_recorder(str(write_job(tmp_path, lagging_job(lambda r, es: es + [op(5, t_s=100.0)] * (r == 1)),
                                            groups=groups, skip=(3,))))
    f = fr.answer.findings[0]
    assert (fr.answer.kind, f.rank, f.seq, fr.answer.no_snapshot) == (MISSING, 3, 5, (3,))
    assert f.describe().startswith("rank 3 has no dump and never joined all_reduce #5")


def test_the_world_size_names_a_missing_last_rank(tmp_path, capsys):
    d = write_job(tmp_path, lagging_job(lambda r, es: es + [op(5, t_s=100.0)] * (r == 1)), skip=(3,))
    assert read_flight_recorder(str(d)).answer.kind == NONE  # ranks 0-2 agree; rank 3 unknown
    assert main(["flight-recorder", str(d), "--dp", "4", "--format", "json"]) == 0
    hang = json.loads(capsys.readouterr().out)["hang"]
    assert (hang["straggler/hang/kind"], hang["straggler/hang/rank"], hang["straggler/hang/no_snapshot_ranks"]) == \
        ("missing", 3, "3")


def test_a_gap_in_the_file_names_is_a_missing_rank(tmp_path):
    fr = read_flight_recorder(str(write_job(tmp_path, lagging_job(lambda r, es: es + [op(5, t_s=100.0)] * (r == 1)),
                                            skip=(2,))))
    assert (fr.answer.kind, fr.answer.findings[0].rank) == (MISSING, 2)


def test_no_finding_reads_as_such(tmp_path):
    fr = read_flight_recorder(str(write_job(tmp_path, lagging_job(lambda r, es: es + [op(5, t_s=100.0)] * (r == 1)))))
    assert fr.answer.kind == NONE
    assert fr.metrics()["straggler/hang/answer"].startswith("no rank is behind its peers")


def test_p2p_ops_do_not_count_as_collectives(tmp_path):
    """Ranks 0 and 1 of a dp group and a pipeline pair: rank 1 waits in a recv from rank 0,
    which never sent it and waits in dp all_reduce #3 that rank 1 did not enter."""
    pp = ("4", "pp-0")

    def entries(rank):
        es = [op(1, pg=DP, pg_id=3, t_s=1), op(2, pg=DP, pg_id=3, t_s=2),
              op(0, "send 0->1" if rank == 0 else "recv 1<-0", pg=pp, pg_id=4, t_s=3, p2p=True, p2p_seq=1)]
        if rank == 0:
            es.append(op(3, pg=DP, pg_id=3, t_s=4, state="started"))
        else:
            es.append(op(0, "recv 1<-0", pg=pp, pg_id=4, t_s=4, state="started", p2p=True, p2p_seq=2))
        return es

    for transform in (lambda d: d, as_torch_2_4):
        d = tmp_path / transform.__name__
        for r in (0, 1):
            write(d, r, transform(dump(entries(r), {"3": ("dp-1", (0, 1)), "4": ("pp-0", (0, 1))})))
        f = read_flight_recorder(str(d)).answer.findings[0]
        assert (f.kind, f.rank, f.group, f.op, f.seq) == (LAGGING, 1, "dp-1", "all_reduce", 3)
        assert f.last_completed == "recv 1<-0 #1 of group pp-0"


def test_a_member_that_recorded_nothing_in_a_group(tmp_path):
    """Rank 1 never entered group dp-1 (its buffer holds every op it made: certain), but
    when its ring wrapped and pg_status lists the group its ops there are only lost."""
    groups = {"3": ("dp-1", (0, 1))}

    def run(name, rank1_status, record_base):
        d = tmp_path / name
        write(d, 0, dump([op(1, t_s=0), op(1, pg=DP, pg_id=3, t_s=1, state="started")], groups))
        write(d, 1, dump([op(1, t_s=2, record_id=record_base)], groups, pg_status=rank1_status))
        return read_flight_recorder(str(d)).answer

    never = run("never", {"0": {}}, 0)
    assert (never.kind, never.findings[0].rank, never.findings[0].group) == (LAGGING, 1, "dp-1")
    assert run("lost", {"0": {}, "3": {}}, 5000).kind == NONE
    assert run("wrapped-never", {"0": {}}, 5000).kind == LAGGING


def test_durations_give_the_slow_collective_table_apart_from_the_answer(tmp_path, capsys):
    """Rank 3 arrives 5 ms late at every all_reduce: it has the shortest duration, the
    others waited for it."""
    def entries(rank):
        late = 0.005 if rank == 3 else 0.0
        return [op(s, t_s=s + late, duration=(1.0 if rank == 3 else 6.0 + rank + s)) for s in range(1, 4)]

    d = tmp_path / "dumps"
    for r in range(4):
        write(d, r, dump(entries(r)))
    fr = read_flight_recorder(str(d))
    assert fr.answer.kind == NONE  # no hang: every rank passed every collective
    slow = fr.slow
    assert slow["collectives"] == 3
    top = slow["rows"][0]
    assert (top["seq"], top["last_entered"], top["shortest_rank"], top["longest_rank"]) == (3, 3, 3, 2)
    assert top["spread_ms"] == pytest.approx(10.0) and top["entered_late_ms"] == pytest.approx(5.0)
    assert slow["ranks"][0] == {"rank": 3, "entered_last": 3, "shortest": 3}
    assert main(["flight-recorder", str(d)]) == 0
    out = capsys.readouterr().out
    assert "slow collectives" in out and "rank 3 (3 last, 3 shortest)" in out


def test_no_durations_no_table(tmp_path):
    assert read_flight_recorder(str(write_job(tmp_path, lagging_job()))).slow is None


# Broken and hostile files ----------------------------------------------------------------
def test_a_truncated_dump_names_its_file(tmp_path, capsys):
    d = write_job(tmp_path, lagging_job())
    data = (d / "nccl_trace_rank_2").read_bytes()
    (d / "nccl_trace_rank_2").write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=r"nccl_trace_rank_2: not a readable Flight Recorder dump: .*truncated"):
        read_flight_recorder(str(d))
    assert main(["flight-recorder", str(d)]) == 1
    err = capsys.readouterr().err
    assert "nccl_trace_rank_2" in err and "Traceback" not in err


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


class _Persistent(pickle.Pickler):
    def persistent_id(self, obj):
        return "x" if obj == "ref" else None


def test_a_pickle_that_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    d = tmp_path / "dumps"
    write(d, 0, {"version": "2.10", "entries": [_Evil(str(marker))]})
    with pytest.raises(InputError, match=r"nccl_trace_rank_0: refused: .*posix.mkdir"):
        read_flight_recorder(str(d))
    assert not marker.exists()
    buf = __import__("io").BytesIO()
    _Persistent(buf, protocol=2).dump({"version": "2.10", "entries": ["ref"]})
    write(d, 0, None, raw=buf.getvalue())
    with pytest.raises(InputError, match="refused: the pickle asks for the persistent object"):
        read_flight_recorder(str(d))


@pytest.mark.parametrize("field,value,message", [
    ("time_created_ns", "later", r"entries\[1\]: field 'time_created_ns' must be an integer"),
    ("collective_seq_id", None, r"entries\[1\]: field 'collective_seq_id' must be an integer"),
    ("state", "lost", r"entries\[1\]: field 'state' must be one of scheduled, started, completed"),
    ("process_group", "0", r"entries\[1\]: field 'process_group' must be \(name, desc\)"),
    ("duration_ms", -1.0, r"entries\[1\]: field 'duration_ms' must be a time >= 0"),
    ("profiling_name", 7, r"entries\[1\]: field 'profiling_name' must be a non-empty string"),
])
def test_a_bad_field_is_named_with_its_file_and_entry(tmp_path, field, value, message):
    def broken(r, es):
        if r == 2:
            es[1][field] = value
        return es

    with pytest.raises(InputError, match=r"nccl_trace_rank_2: " + message):
        read_flight_recorder(str(write_job(tmp_path, lagging_job(broken))))


def test_a_missing_field_is_named(tmp_path):
    def broken(r, es):
        if r == 0:
            del es[0]["time_created_ns"]
        return es

    with pytest.raises(InputError, match=r"nccl_trace_rank_0: entries\[0\]: no field 'time_created_ns'"):
        read_flight_recorder(str(write_job(tmp_path, lagging_job(broken))))


def test_bad_dump_sets(tmp_path):
    d = tmp_path / "dumps"
    write(d, 0, {"version": "2.10", "entries": []})
    with pytest.raises(InputError, match="record no op"):
        read_flight_recorder(str(d))
    write(d, 1, dump([op(1)]), prefix="other_")
    with pytest.raises(InputError, match="different prefixes"):
        read_flight_recorder(str(d))
    with pytest.raises(InputError, match="no rank in the file name"):
        write(tmp_path, "", dump([op(1)]), prefix="trace.pkl")
        read_flight_recorder(str(tmp_path / "trace.pkl"))
    with pytest.raises(InputError, match="no such file, directory or matching dump"):
        read_flight_recorder(str(tmp_path / "none_*"))
    write(tmp_path / "x", 1, {"version": "2.10"})
    with pytest.raises(InputError, match="no field 'entries'"):
        read_flight_recorder(str(tmp_path / "x"))
    groups = {"3": ("dp-1", (0, 1))}
    write(tmp_path / "y", 0, dump([op(1, pg=DP, pg_id=3)], groups))
    write(tmp_path / "y", 1, dump([op(1, pg=DP, pg_id=3)], {"3": ("dp-1", (1, 2))}))
    with pytest.raises(InputError, match="pg_config gives group '3' ranks 1-2"):
        read_flight_recorder(str(tmp_path / "y"))


HOSTILE = [2**70, -5, 10**400, "\u0663", 1e308, float("nan"), [[]], ("a",), None, True, "", {}, "[0, x]",
           "[99999999999]", ("0",), ("0", "d", "e"), 2**62, "[-1]", 0]


def _paths(o, at=()):
    yield at
    for k, v in (o.items() if isinstance(o, dict) else enumerate(o) if isinstance(o, list) else ()):
        yield from _paths(v, at + (k,))


def test_mutated_dumps_give_an_answer_or_a_clean_error(tmp_path):
    """600 mutants (fixed seed) of one rank's dump: bytes flipped, cut, spliced or deleted,
    and fields replaced by huge, negative or mistyped values or dropped; each an answer or
    an InputError, never another exception."""
    rng = random.Random(1)
    job = lagging_job()
    d = write_job(tmp_path, job, groups={"0": ("default_pg", range(4))})
    good = (d / "nccl_trace_rank_2").read_bytes()
    spliced = [pickle.dumps(v, protocol=2)[2:-1] for v in HOSTILE]
    fields = [p for p in _paths(pickle.loads(good)) if p]
    outcomes = {"answer": 0, "error": 0}
    for i in range(600):
        if i % 2:
            data = bytearray(good)
            for _ in range(rng.randint(1, 4)):
                kind, at = rng.randrange(4), rng.randrange(2, max(len(data) - 1, 3))
                if kind == 0:
                    data[at:at + 1] = bytes([rng.randrange(256)])
                elif kind == 1:
                    del data[at:]
                elif kind == 2:
                    data[at:at] = rng.choice(spliced)
                else:
                    del data[at:at + rng.randint(1, 40)]
        else:
            tree = pickle.loads(good)
            for _ in range(rng.randint(1, 3)):
                *parents, key = rng.choice(fields)
                try:
                    holder = functools.reduce(lambda o, k: o[k], parents, tree)
                    if rng.random() < 0.2 and isinstance(holder, dict):
                        del holder[key]
                    else:
                        holder[key] = rng.choice(HOSTILE)
                except (KeyError, IndexError, TypeError):
                    pass  # an earlier mutation replaced the path
            data = pickle.dumps(tree, protocol=2)
        (d / "nccl_trace_rank_2").write_bytes(bytes(data))
        try:
            json.dumps(read_flight_recorder(str(d)).summary(), allow_nan=False)
            outcomes["answer"] += 1
        except InputError:
            outcomes["error"] += 1
    assert outcomes["answer"] > 50 and outcomes["error"] > 50, outcomes


def test_other_inputs_still_go_to_their_readers(tmp_path, capsys):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    assert main(["analyze", str(path)]) == 1
    assert "flight" not in capsys.readouterr().err.lower()
    assert main(["analyze", str(path), "--input-format", "flight-recorder"]) == 1
    assert "Flight Recorder" in capsys.readouterr().err
    assert not is_flight_recorder_input("clickhouse://127.0.0.1:8123/default?job=run-42")
    directory = tmp_path / "dir.log"
    directory.mkdir()
    assert main(["analyze", str(directory)]) == 1
    assert "is a directory" in capsys.readouterr().err


def test_the_reader_imports_no_torch():
    code = "import sys, relax_straggler.hang.flight_recorder; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# Hostile structures: bounded, never a hang, a recursion or a traceback --------------------
def _x(text):
    raw = text.encode()
    return b"X" + len(raw).to_bytes(4, "little") + raw


def _with_field(name, value_ops):
    """A protocol-2 pickle of {"version": "2.10", name: <value_ops>, "entries": []}."""
    return b"\x80\x02}(" + _x("version") + _x("2.10") + _x(name) + value_ops + _x("entries") + b"]u."


def _tuple_dag(levels):
    """Pickle ops of t_{i+1} = (t_i, t_i) from (): a few bytes per level, 2^levels leaves."""
    ops = b")r" + (1).to_bytes(4, "little") + b"0"
    for i in range(1, levels):
        ref = b"j" + i.to_bytes(4, "little")
        ops += ref + ref + b"\x86r" + (i + 1).to_bytes(4, "little") + b"0"
    return ops + b"j" + levels.to_bytes(4, "little")


def _read_dumps_with_rank_1(tmp_path, raw=None, d1=None):
    """`relax-straggler flight-recorder` (a subprocess, so a hang is a timeout) on ranks 0-2, rank 1's
    file `raw` bytes or the dump `d1`."""
    d = tmp_path / "dumps"
    for r in range(3):
        write(d, r, d1 if r == 1 and d1 is not None else dump([op(1), op(2, state="started")]),
              raw=raw if r == 1 else None)
    code = "import sys; from relax_straggler.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, "flight-recorder", str(d)], capture_output=True, text=True,
                          timeout=120, cwd=REPO)


@pytest.mark.parametrize("where,levels,message", [
    ("value", 80, "field 'comm_lib_version' is nested deeper than 32 levels"),
    ("value", 30, "field 'comm_lib_version' refers back to its own objects"),
    ("dict key", 80, "refused: a dict key that is a tuple"),
])
def test_a_pickle_whose_objects_multiply_is_refused(tmp_path, where, levels, message):
    """Levels of (x, x): a kilobyte whose str() or hash() walks 2^levels items."""
    if where == "value":
        raw = _with_field("comm_lib_version", _tuple_dag(levels))
    else:
        raw = _with_field("pg_status", b"}" + _tuple_dag(levels) + b"Ns")
    proc = _read_dumps_with_rank_1(tmp_path, raw=raw)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "nccl_trace_rank_1: " + message in proc.stderr


def test_a_deeply_nested_value_is_an_error_naming_the_field(tmp_path):
    n = 200_000
    proc = _read_dumps_with_rank_1(tmp_path, raw=_with_field("comm_lib_version", b"]" * n + b"a" * (n - 1)))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "nccl_trace_rank_1: field 'comm_lib_version'" in proc.stderr and "nested" in proc.stderr


@pytest.mark.parametrize("where", ["comm_lib_version", "pg_status key", "entry field"])
def test_a_huge_integer_is_named_with_its_file_and_field(tmp_path, where):
    d1 = dump([op(1), op(2, state="started")])
    if where == "comm_lib_version":
        d1["comm_lib_version"] = 10**5000
    elif where == "pg_status key":
        d1["pg_status"][10**5000] = {}
    else:
        d1["entries"][0]["collective_seq_id"] = 10**5000
    proc = _read_dumps_with_rank_1(tmp_path, d1=d1)
    assert proc.returncode == 1 and "nccl_trace_rank_1" in proc.stderr, (proc.returncode, proc.stderr[-2000:])
    assert {"comm_lib_version": "'comm_lib_version'", "pg_status key": "pg_status key",
            "entry field": "'collective_seq_id'"}[where] in proc.stderr
    assert "an int of 16610 bits" in proc.stderr and len(proc.stderr) < 400


@pytest.mark.parametrize("value", ["x" * 1_000_000, ["x"] * 100_000, {"k": "v"}])
def test_a_bad_value_is_shown_short(tmp_path, value):
    def broken(r, es):
        if r == 2:
            es[1]["state"] = value
        return es

    with pytest.raises(InputError) as err:
        read_flight_recorder(str(write_job(tmp_path, lagging_job(broken))))
    assert "entries[1]: field 'state'" in str(err.value) and len(str(err.value)) < 300
    assert type(value).__name__ in str(err.value)


def test_a_pickle_with_a_set_or_a_call_is_refused(tmp_path):
    d = tmp_path / "dumps"
    write(d, 0, None, raw=pickle.dumps({"version": "2.10", "entries": [], "x": {1, 2}}, protocol=4))
    with pytest.raises(InputError, match=r"nccl_trace_rank_0: refused: .*set"):
        read_flight_recorder(str(d))
    write(d, 0, None, raw=_with_field("x", b"]]R"))  # REDUCE on data: a call
    with pytest.raises(InputError, match=r"nccl_trace_rank_0: refused: .*call"):
        read_flight_recorder(str(d))


def test_an_empty_op_name_is_a_bad_field(tmp_path):
    def broken(r, es):
        if r == 2:
            es[1]["profiling_name"] = "nccl:"
        return es

    with pytest.raises(InputError, match=r"nccl_trace_rank_2: entries\[1\]: field 'profiling_name' .*no op name"):
        read_flight_recorder(str(write_job(tmp_path, lagging_job(broken))))


# Many ranks: linear, and a bounded answer --------------------------------------------------
def test_many_missing_ranks_answer_fast_in_one_sentence(tmp_path):
    d = tmp_path / "dumps"
    for r in (0, 20_000):
        write(d, r, dump([op(1), op(2, state="started")]))
    t0 = __import__("time").perf_counter()
    fr = read_flight_recorder(str(d))
    assert __import__("time").perf_counter() - t0 < 20  # quadratic before: minutes
    assert fr.text() == ("ranks 1-19999 have no dump and never joined all_reduce #2 of group default_pg "
                         "(ranks 0-20000); the other 2 have waited 192 s in it")
    m = fr.metrics()
    assert (m["straggler/hang/kind"], m["straggler/hang/rank"], m["straggler/hang/no_snapshot_ranks"]) == \
        (MISSING, 1, "1-19999")
    assert json.loads(json.dumps(fr.summary()))["findings"][0]["ranks"] == "1-19999"


# pg_config and the expected ranks ------------------------------------------------------------
def test_a_rank_outside_its_groups_pg_config_is_refused(tmp_path, capsys):
    d = tmp_path / "dumps"
    for r in range(3):
        groups = {"0": ("default_pg", (0, 1))} if r == 1 else None
        write(d, r, dump([op(1), op(2, state="started")] if r != 1 else [op(1)], groups))
    with pytest.raises(InputError, match=r"nccl_trace_rank_2: rank 2 recorded ops in group '0' \(default_pg\), "
                                         r"whose pg_config in .*nccl_trace_rank_1 holds ranks 0-1"):
        read_flight_recorder(str(d))
    assert main(["flight-recorder", str(d)]) == 1
    assert "HANG" not in capsys.readouterr().out


def test_gloos_world_group_names_a_dead_last_rank(tmp_path):
    """Gloo's placeholder group "" lists every rank: a dead last rank is missing without --dp."""
    world = {"": ("", range(4))}
    job = lagging_job(lambda r, es: es + [op(5, t_s=100.0)] * (r == 1))
    fr = read_flight_recorder(str(write_job(tmp_path, job, groups=world, skip=(3,))))
    assert (fr.answer.kind, fr.answer.findings[0].rank, fr.expected) == (MISSING, 3, (0, 1, 2, 3))
    d = tmp_path / "disagree"
    for r in range(3):  # the dumps do not agree on the world: not used
        write(d, r, dump(job[r], {"": ("", range(4 + r))}))
    assert read_flight_recorder(str(d)).expected == (0, 1, 2)


def test_a_single_json_dump_file_is_a_flight_recorder_input(tmp_path, capsys):
    path = tmp_path / "nccl_trace_rank_0"
    path.write_text(json.dumps(dump([op(1), op(2, state="started")])))
    assert is_flight_recorder_input(str(path))
    assert main(["analyze", str(path), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["input"]["format"] == "flight-recorder"
    jsonl = tmp_path / "straggler.jsonl"
    jsonl.write_text(json.dumps({"step": 1, "stages": ["forward"], "device_ms": [[1.0]]}) + "\n")
    assert not is_flight_recorder_input(str(jsonl))


def test_the_report_speaks_of_one_dump_and_notes_options_that_do_not_apply(tmp_path, capsys):
    d = tmp_path / "dumps"
    write(d, 0, dump([op(1)]))
    assert main(["analyze", str(d), "--strict", "--ensemble-steps", "8"]) == 0
    captured = capsys.readouterr()
    assert "(1 Flight Recorder dump of rank 0," in captured.out
    assert "note: --strict, --ensemble-steps do not apply to Flight Recorder dumps" in captured.err
    assert "their own command: relax-straggler flight-recorder" in captured.err
