"""Worker for test_module_stages: a DDP model of attention and MoE blocks with activation
recomputation, rank 1's attention slowed by 80 ms in backward. The metrics rank writes
{"reports": its reports, "step_s": every rank's step times}. Usage (under torchrun): module_stages_worker.py OUTPUT_JSON"""

import gc
import json
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import relax_straggler
from relax_straggler import StragglerConfig
from slow_backward import SlowBackward  # beside this script
from step_times import StepClock


class SelfAttention(nn.Module):
    def __init__(self, d: int, delay_s: float) -> None:
        super().__init__()
        self.qkv, self.out, self.delay_s = nn.Linear(d, 3 * d), nn.Linear(d, d), delay_s

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        y = self.out(F.scaled_dot_product_attention(q, k, v))
        return SlowBackward.apply(y, self.delay_s) if self.delay_s else y


class MoELayer(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.router, self.experts = nn.Linear(d, 2), nn.ModuleList(nn.Linear(d, d) for _ in range(2))

    def forward(self, x):
        w = self.router(x).softmax(-1)
        return sum(w[..., i:i + 1] * e(x) for i, e in enumerate(self.experts))


class Block(nn.Module):
    def __init__(self, d: int, delay_s: float) -> None:
        super().__init__()
        self.attn, self.moe = SelfAttention(d, delay_s), MoELayer(d)

    def _body(self, x):
        x = x + self.attn(x)
        return x + self.moe(x)

    def forward(self, x):
        return checkpoint(self._body, x, use_reentrant=True)


def main() -> None:
    out = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    d = 16
    net = nn.Sequential(nn.Linear(d, d), Block(d, 0.08 if rank == 1 else 0.0), Block(d, 0.0))
    model = nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    reports = []
    config = StragglerConfig(enabled=True, interval=1, warmup_steps=2, enable_module_stages=True,
                             noise_floor_ms=20.0)
    analyzer = relax_straggler.install(model, opt, config=config, report_fn=lambda m, s, details: reports.append({**m, **details}))
    clock = StepClock()
    for step in range(6):
        with clock:
            x = torch.randn(4, 8, d, generator=torch.Generator().manual_seed(step * 10 + rank))
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    analyzer.uninstall()  # flushes the report thread
    step_s: list = [None] * dist.get_world_size()
    dist.all_gather_object(step_s, clock.times)
    if rank == 0:
        with open(out, "w") as fh:
            json.dump({"reports": reports, "step_s": step_s}, fh)
    gc.collect()  # DDP's reference cycles, while Gloo threads can still take the GIL
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
