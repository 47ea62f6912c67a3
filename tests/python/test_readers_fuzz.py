"""A short bounded fuzz of the text readers: random byte flips, deletions, duplicated and
truncated lines of the fixtures. Every mutant either reads or fails with InputError (file
and line in the message); nothing else may escape, and a mutant that reads never counts
more records skipped than it read. Fixed seed, 150 mutants per format."""

from __future__ import annotations

import os
import random

import pytest

from relax_straggler.analysis import AnalyzeConfig, analyze
from relax_straggler.readers import InputError, open_source

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
MUTANTS = 150
ALPHABET = b" \n\t:.,-{}[]\"0123456789eErankNa\x00\xff"


def mutate(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        op = rng.randrange(4)
        i = rng.randrange(len(b)) if b else 0
        if op == 0 and b:
            b[i] = rng.choice(ALPHABET)
        elif op == 1 and b:
            del b[i:i + rng.randint(1, 40)]
        elif op == 2:
            lines = bytes(b).split(b"\n")
            j = rng.randrange(len(lines))
            lines.insert(j, lines[j])
            b = bytearray(b"\n".join(lines))
        else:
            b = b[: rng.randrange(len(b) + 1)]
    return bytes(b)


@pytest.mark.parametrize("name, fmt", [
    ("megatron_all.log", "megatron-log"), ("megatron_minmax.log", "megatron-log"),
    ("straggler.jsonl", "straggler-jsonl"), ("timeline-small.json", "chrome-trace"),
])
def test_mutants_read_or_fail_cleanly(name, fmt, tmp_path):
    rng = random.Random(f"{name}-1234")
    data = open(os.path.join(FIXTURES, name), "rb").read()
    path = tmp_path / name
    outcomes = {"ok": 0, "input_error": 0}
    for _ in range(MUTANTS):
        path.write_bytes(mutate(data, rng))
        try:
            source = open_source(str(path), fmt)
            analyze(source, AnalyzeConfig())
            assert source.problems.skipped <= source.records, (source.problems.skipped, source.records)
            outcomes["ok"] += 1
        except InputError as exc:
            assert str(path) in str(exc)
            outcomes["input_error"] += 1
    assert sum(outcomes.values()) == MUTANTS
