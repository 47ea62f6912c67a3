"""The demo's training as a parity factory (relax_straggler.demo.parity): the GPT of
examples/train_gpt.py with AdamW, a data section and a workload per step."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist

from relax_straggler.demo.data import Batches, load_corpus
from relax_straggler.demo.gpt import GPT, GPTConfig, train_step
from relax_straggler.demo.parity import AnyAnalyzer, ParityTraining, TrainingFactory


@dataclass(frozen=True)
class DemoSpec:
    """Shape of the demo GPT used by `demo_factory`; the defaults are examples/train_gpt.py's."""

    layers: int = 4
    d_model: int = 128
    heads: int = 4
    seq_len: int = 64
    batch_size: int = 8
    corpus_bytes: int = 2_000_000
    lr: float = 2e-3
    device: str = "cpu"


@functools.lru_cache(maxsize=4)
def _corpus(max_bytes: int) -> torch.Tensor:
    # Every run of a parity check reads the same corpus; read it once per process.
    return load_corpus(max_bytes)


def demo_factory(spec: DemoSpec = DemoSpec()) -> TrainingFactory:
    """The demo's training (relax_straggler.demo GPT, AdamW, a data section, a workload
    per step), wrapped in DistributedDataParallel when torch.distributed is initialized."""

    def factory(seed: int) -> ParityTraining:
        device = torch.device(spec.device)
        gpt = GPT(GPTConfig(seq_len=spec.seq_len, d_model=spec.d_model, heads=spec.heads, layers=spec.layers))
        gpt = gpt.to(device)
        distributed = dist.is_available() and dist.is_initialized()
        model = torch.nn.parallel.DistributedDataParallel(gpt) if distributed else gpt
        optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.0)
        batches = Batches(_corpus(spec.corpus_bytes), spec.batch_size, spec.seq_len, seed,
                          dist.get_rank() if distributed else 0)

        def step(analyzer: AnyAnalyzer, i: int) -> torch.Tensor:
            with analyzer.section("data"):
                x, y = (t.to(device) for t in batches.next())
            analyzer.set_workload(x.numel())
            return train_step(model, optimizer, x, y)

        return ParityTraining(model=model, optimizer=optimizer, step=step)

    return factory
