"""Training data: the Python standard library's own source files as a byte-level corpus."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch


def load_corpus(max_bytes: int) -> torch.Tensor:
    """Bytes of the standard library's top-level .py files, in sorted order (uint8 tensor)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(stdlib.glob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    if total == 0:
        raise RuntimeError(f"no .py files found under {stdlib}")
    return torch.frombuffer(bytearray(b"".join(chunks)[:max_bytes]), dtype=torch.uint8).long()


class Batches:
    """Random windows of the corpus; the order depends only on (seed, rank)."""

    def __init__(self, corpus: torch.Tensor, batch_size: int, seq_len: int, seed: int, rank: int) -> None:
        self.corpus, self.batch_size, self.seq_len = corpus, batch_size, seq_len
        self.gen = torch.Generator().manual_seed(seed * 1000 + rank)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(0, len(self.corpus) - self.seq_len - 1, (self.batch_size,), generator=self.gen)
        idx = starts[:, None] + torch.arange(self.seq_len + 1)
        window = self.corpus[idx]
        return window[:, :-1], window[:, 1:]
