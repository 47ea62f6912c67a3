"""FileStore (file://DIR): recovery from torn writes, one writer with concurrent readers in
other processes, job ids that are not file names, a vanished directory."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from relax_straggler.stores import file as file_module
from relax_straggler.stores.file import FileStore
from relax_straggler.stores.base import STEP_METRIC, Sample, StoreError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

T0 = 1_800_000_000.0


def rows(job: str, iterations, ranks: int = 8) -> list[Sample]:
    return [Sample(T0 + it, job, STEP_METRIC, r, it, (100.0 + r,), node=f"n{r // 4}")
            for it in iterations for r in range(ranks)]


def job_dir(store: FileStore, job: str) -> str:
    return os.path.join(store.directory, "jobs", job)


def test_torn_frame_is_reported_and_earlier_rows_kept(tmp_path):
    store = FileStore(str(tmp_path))
    store.write(rows("j", range(3)))
    store.close()
    segment = os.path.join(job_dir(store, "j"), "seg-000001.arrows")
    with open(segment, "ab") as f:  # a writer that died after 20 bytes of its frame
        f.write(b"RSF1" + (5000).to_bytes(4, "little") + b"\0" * 12)
    writer = FileStore(str(tmp_path))
    writer.write(rows("j", [3, 4]))
    assert len(writer.problems) == 1 and "torn or corrupt frame at byte" in writer.problems[0]
    assert os.path.exists(os.path.join(job_dir(store, "j"), "seg-000002.arrows"))
    reader = FileStore(str(tmp_path))
    assert [i.iteration for i in reader.iterations("j")] == [0, 1, 2, 3, 4]
    assert len(list(reader.samples("j", 0, 4))) == 5 * 8
    assert reader.problems == []


@pytest.mark.parametrize("its", ['[[5, 1.0]]', '[["x", 1.0, 0, 0, 1]]', '[[5, 1.0, 0, 0, 1], 7]', '"abc"'])
def test_index_line_of_the_wrong_shape_is_reported_and_skipped(tmp_path, its):
    store = FileStore(str(tmp_path))
    store.write(rows("j", range(3)))
    with open(os.path.join(job_dir(store, "j"), "index.jsonl"), "a") as f:  # valid JSON, not an index entry
        f.write('{"seg": 1, "off": 0, "len": 100, "rows": 1, "its": %s}\n' % its)
    reader = FileStore(str(tmp_path))
    assert [i.iteration for i in reader.iterations("j")] == [0, 1, 2]
    assert len(reader.problems) == 1 and "unreadable index line" in reader.problems[0]
    store.write(rows("j", [3]))
    assert [i.iteration for i in reader.iterations("j", after_iteration=2)] == [3]
    assert len(list(reader.samples("j", 0, 3))) == 4 * 8


def test_frame_without_index_line_is_indexed_again(tmp_path):
    store = FileStore(str(tmp_path))
    store.write(rows("j", [0]))
    store.write(rows("j", [1]))
    store.close()
    index = os.path.join(job_dir(store, "j"), "index.jsonl")
    lines = open(index, "rb").read().splitlines(keepends=True)
    with open(index, "wb") as f:  # the writer died between frame 2 and its index line, mid-line
        f.write(lines[0] + lines[1][:10])
    reader = FileStore(str(tmp_path))
    assert [i.iteration for i in reader.iterations("j")] == [0]  # the torn line is not read
    writer = FileStore(str(tmp_path))
    writer.write(rows("j", [2]))
    assert any("torn last line" in p for p in writer.problems)
    assert [i.iteration for i in reader.iterations("j")] == [0, 1, 2]
    assert [i.iteration for i in FileStore(str(tmp_path)).iterations("j")] == [0, 1, 2]


def test_reader_in_another_process_never_sees_half_an_iteration(tmp_path):
    writer_code = textwrap.dedent(f"""
        import sys
        from relax_straggler.stores.file import FileStore
        from relax_straggler.stores.base import Sample
        store = FileStore({str(tmp_path)!r})
        for it in range(200):
            store.write([Sample({T0} + it, "live", "interval-time", r, it, (100.0,)) for r in range(64)])
        print("done", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", writer_code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    reader = FileStore(str(tmp_path))
    seen = []
    while proc.poll() is None or not seen or seen[-1] < 199:
        for it in reader.iterations("live", after_iteration=seen[-1] if seen else -1):
            assert it.ranks == 64 and it.step_ms == 100.0
            seen.append(it.iteration)
        if proc.poll() not in (None, 0):
            break
    assert proc.wait(timeout=60) == 0
    assert seen == list(range(200))


def test_two_writer_processes_append_to_one_job(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        from relax_straggler.stores.file import FileStore
        from relax_straggler.stores.base import Sample
        store = FileStore({str(tmp_path)!r})
        first = int(sys.argv[1])
        for it in range(first, first + 50):
            store.write([Sample({T0}, "shared", "interval-time", r, it, (10.0,)) for r in range(4)])
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code, str(first)], cwd=REPO) for first in (0, 50)]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    store = FileStore(str(tmp_path))
    assert [i.iteration for i in store.iterations("shared")] == list(range(100))
    assert len(list(store.samples("shared", 0, 99))) == 400
    assert store.problems == []


@pytest.mark.parametrize("job", ["a/b", "..", ".hidden", "x y%z", "ünïcode"])
def test_job_ids_that_are_not_file_names(tmp_path, job):
    store = FileStore(str(tmp_path))
    store.write(rows(job, [0]))
    assert store.jobs() == [job]
    assert os.listdir(tmp_path) == ["jobs"] and len(os.listdir(tmp_path / "jobs")) == 1  # nothing escapes jobs/
    assert [i.iteration for i in FileStore(str(tmp_path)).iterations(job)] == [0]


def test_vanished_directory_raises_storeerror_and_recovers(tmp_path):
    store = FileStore(str(tmp_path / "s"))
    store.write(rows("j", [0]))
    os.rename(tmp_path / "s", tmp_path / "away")
    with pytest.raises(StoreError, match="missing"):
        store.ping()
    with pytest.raises(StoreError, match="missing"):
        store.iterations("j")
    os.rename(tmp_path / "away", tmp_path / "s")
    store.ping()
    assert [i.iteration for i in store.iterations("j")] == [0]


def test_open_without_create_refuses_a_missing_directory(tmp_path):
    with pytest.raises(StoreError, match="missing"):
        FileStore(str(tmp_path / "nowhere"), create=False)
    assert not (tmp_path / "nowhere").exists()
    FileStore(str(tmp_path / "here"))
    FileStore(str(tmp_path / "here"), create=False).ping()


@pytest.mark.parametrize("job", ["a" + ":" * 127, "ü" * 128, "x" * 300])
def test_job_ids_too_long_for_a_file_name_are_stored(tmp_path, job):
    # "a" + 127 ":" percent-encodes to 381 bytes, more than the 255 a file name may have
    store = FileStore(str(tmp_path))
    store.write(rows(job, [0, 1]))
    store.write(rows("short", [0]))
    assert store.jobs() == sorted([job, "short"])
    names = os.listdir(tmp_path / "jobs")
    assert len(names) == 2 and all(len(n.encode()) <= 255 for n in names)
    again = FileStore(str(tmp_path))
    assert [i.iteration for i in again.iterations(job)] == [0, 1]
    assert len(list(again.samples(job, 0, 1))) == 16
    assert again.jobs() == sorted([job, "short"])


def test_a_job_name_of_exactly_the_limit_keeps_its_readable_form(tmp_path):
    job = "b" * 255
    store = FileStore(str(tmp_path))
    store.write(rows(job, [0]))
    assert os.listdir(tmp_path / "jobs") == [job]


WRITER = textwrap.dedent("""
    import sys
    from relax_straggler.stores.file import FileStore
    from relax_straggler.stores.base import Sample
    store = FileStore(sys.argv[1])
    it = int(sys.argv[2])
    store.write([Sample({t0} + it, "j", "interval-time", r, it, (100.0 + r,)) for r in range(8)])
    print("acknowledged", flush=True)
""").format(t0=T0)


def readable(store: FileStore, job: str, last: int) -> dict[int, int]:
    """Rows read back per iteration of `job` in [0, last]."""
    table = store.table(job, 0, last)
    its = table.column("iteration").to_pylist()
    return {it: its.count(it) for it in sorted(set(its))}


def test_writers_after_a_segment_was_cut_short_index_only_rows_they_can_read_back(tmp_path):
    # a crash cut the segment's last 3,000 bytes (frames its index names); three new writer
    # processes then each write one iteration and are acknowledged
    store = FileStore(str(tmp_path))
    for it in range(20):
        store.write(rows("j", [it]))
    store.close()
    segment = os.path.join(job_dir(store, "j"), "seg-000001.arrows")
    with open(segment, "r+b") as f:
        f.truncate(os.path.getsize(segment) - 3000)
    for it in (20, 21, 22):
        out = subprocess.run([sys.executable, "-c", WRITER, str(tmp_path), str(it)], cwd=REPO, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0 and "acknowledged" in out.stdout, out.stderr
    reader = FileStore(str(tmp_path))
    listed = [i.iteration for i in reader.iterations("j")]
    back = readable(reader, "j", 22)
    assert list(back) == listed  # every iteration the index lists is read back, and no other
    assert listed[-3:] == [20, 21, 22] and all(back[it] == 8 for it in listed)
    assert 12 <= len(listed) - 3 < 20  # the frames before the cut survive, those past it are lost
    assert any("cut short" in p and "seg-000001" in p for p in reader.problems), reader.problems


def test_a_writer_after_a_cut_short_segment_starts_a_new_one_and_says_so(tmp_path):
    store = FileStore(str(tmp_path))
    for it in range(5):
        store.write(rows("j", [it]))
    store.close()
    segment = os.path.join(job_dir(store, "j"), "seg-000001.arrows")
    with open(segment, "r+b") as f:
        f.truncate(os.path.getsize(segment) - 10)  # mid-frame: the last frame is torn
    writer = FileStore(str(tmp_path))
    writer.write(rows("j", [5]))
    writer.write(rows("j", [6]))
    assert len(writer.problems) == 1 and "cut short" in writer.problems[0], writer.problems
    assert os.path.exists(os.path.join(job_dir(store, "j"), "seg-000002.arrows"))
    assert readable(FileStore(str(tmp_path)), "j", 6) == {0: 8, 1: 8, 2: 8, 3: 8, 5: 8, 6: 8}


def append_index_line(store: FileStore, job: str, line: bytes) -> None:
    with open(os.path.join(job_dir(store, job), "index.jsonl"), "ab") as f:
        f.write(line + b"\n")


@pytest.mark.parametrize("line, why", [
    (b'{"seg": 1, "off": 0, "len": 1000000000000, "rows": 8, "its": [[9, 1.0, 0, 0, 8]]}', "past the end"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deep"),
    (b'{"seg": "x", "off": 0, "len": 100, "rows": 8, "its": [[9, 1.0, 0, 0, 8]]}', "seg"),
    (b'{"seg": -1, "off": 0, "len": 100, "rows": 8, "its": [[9, 1.0, 0, 0, 8]]}', "seg"),
    (b'{"seg": 1e30, "off": 0, "len": 100, "rows": 8, "its": [[9, 1.0, 0, 0, 8]]}', "seg"),
    (b'{"seg": 99999999999999999999, "off": 0, "len": 100, "rows": 8, "its": [[9, 1.0, 0, 0, 8]]}', "seg"),
    (b'{"seg": 7, "off": 0, "len": 100, "rows": 8, "its": [[9, 1.0, 0, 0, 8]]}', "seg-000007.arrows is missing"),
    (b'{"seg": 1, "off": -5, "len": 100, "rows": 8, "its": [[9, 1.0, 0, 0, 8]]}', "off"),
    (b"\xff\xfe not json", "not JSON"),
])
def test_a_damaged_index_line_is_skipped_naming_file_and_line(tmp_path, line, why):
    store = FileStore(str(tmp_path))
    store.write(rows("j", [0, 1]))
    append_index_line(store, "j", line)
    store.write(rows("j", [2]))  # the writer goes on past the damaged line
    reader = FileStore(str(tmp_path))
    assert [i.iteration for i in reader.iterations("j")] == [0, 1, 2]
    assert readable(reader, "j", 10) == {0: 8, 1: 8, 2: 8}
    index = os.path.join(job_dir(store, "j"), "index.jsonl")
    assert len(reader.problems) == 1 and f"{index} line 2:" in reader.problems[0] and why in reader.problems[0], \
        reader.problems
    assert reader.job_problems("j") == reader.problems and reader.job_problems("other") == []


def test_a_duplicated_index_line_is_read_once(tmp_path):
    store = FileStore(str(tmp_path))
    store.write(rows("j", [0]))
    index = os.path.join(job_dir(store, "j"), "index.jsonl")
    with open(index, "rb") as f:
        line = f.read().rstrip(b"\n")
    append_index_line(store, "j", line)
    reader = FileStore(str(tmp_path))
    assert [(i.iteration, i.ranks) for i in reader.iterations("j")] == [(0, 8)]
    assert readable(reader, "j", 0) == {0: 8}
    assert len(reader.problems) == 1 and "line 2" in reader.problems[0] and "again" in reader.problems[0]


def test_a_changed_digit_in_an_index_line_is_caught_by_its_checksum(tmp_path):
    store = FileStore(str(tmp_path))
    store.write(rows("j", [4]))
    store.write(rows("j", [5]))
    index = os.path.join(job_dir(store, "j"), "index.jsonl")
    with open(index, "rb") as f:
        first, second = f.read().splitlines()
    damaged = first.replace(b"[[4,", b"[[7,")  # still a well-formed line, of another iteration
    assert damaged != first
    with open(index, "wb") as f:
        f.write(damaged + b"\n" + second + b"\n")
    reader = FileStore(str(tmp_path))
    assert [i.iteration for i in reader.iterations("j")] == [5]
    assert len(reader.problems) == 1 and "line 1" in reader.problems[0] and "checksum" in reader.problems[0]


def test_frames_damaged_after_they_were_indexed_are_skipped_and_reported(tmp_path):
    store = FileStore(str(tmp_path))
    for it in range(4):
        store.write(rows("j", [it]))
        store.write(rows("k", [it]))
    reader = FileStore(str(tmp_path))
    assert [i.iteration for i in reader.iterations("j")] == [0, 1, 2, 3]
    segment = os.path.join(job_dir(store, "j"), "seg-000001.arrows")
    with open(segment, "r+b") as f:
        f.seek(40)
        f.write(b"\xff" * 8)  # inside the first frame
    os.remove(os.path.join(job_dir(store, "k"), "seg-000001.arrows"))
    assert readable(reader, "j", 3) == {1: 8, 2: 8, 3: 8}
    assert readable(reader, "k", 3) == {}
    assert "fails its checksum" in reader.job_problems("j")[0] and "iteration 0" in reader.job_problems("j")[0]
    assert "is missing" in reader.job_problems("k")[0]


@pytest.mark.parametrize("damage", ["a middle line deleted", "the index removed", "the index cut at a line"])
def test_frames_whose_index_lines_were_lost_are_indexed_again_by_the_next_writer(tmp_path, monkeypatch, damage):
    monkeypatch.setattr(file_module, "SEGMENT_BYTES", 6000)  # a few frames per segment: several segments
    store = FileStore(str(tmp_path))
    for it in range(12):
        store.write(rows("j", [it]))
    store.close()
    assert len([n for n in os.listdir(job_dir(store, "j")) if n.startswith("seg-")]) >= 3
    index = os.path.join(job_dir(store, "j"), "index.jsonl")
    lines = open(index, "rb").read().splitlines(keepends=True)
    kept = {"a middle line deleted": lines[:2] + lines[3:], "the index removed": [],
            "the index cut at a line": lines[:5]}[damage]
    with open(index, "wb") as f:
        f.write(b"".join(kept))
    writer = FileStore(str(tmp_path))
    writer.write(rows("j", [12]))
    assert writer.problems == []  # every frame was whole: nothing lost, nothing to report
    reader = FileStore(str(tmp_path))
    assert [i.iteration for i in reader.iterations("j")] == list(range(13))
    assert readable(reader, "j", 12) == {it: 8 for it in range(13)} and reader.problems == []
