"""Worker for test_collectives (run under torchrun, Gloo). Usage: collectives.py MODE OUT_JSON

Modes:
  counts    issue a known mix of collectives in one sampled step; report what the timer
            counted per op and the training group's sequence numbers with/without wrapping
  results   the same collectives on random tensors, wrapped and unwrapped: outputs must match
  lifecycle install / new group / uninstall: which backends are wrapped at each point
  errors    an op the inner backend rejects raises the same error through the wrapper
  ddp       DDP training with extra compute inside rank 2's backward
"""

import gc
import json
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

from relax_straggler import StragglerConfig
from relax_straggler._ext import ext
from relax_straggler.live.collectives import group_registry
import relax_straggler
from step_times import StepClock  # beside this file

C = ext()
OPS = ["allreduce", "reduce_scatter", "allgather", "broadcast", "alltoall", "send", "recv", "other"]


def mix(rank: int, world: int, seed: int) -> list[torch.Tensor]:
    """A fixed mix of collectives; returns every output tensor. Issued counts per op:
    allreduce 3, reduce_scatter 1, allgather 2, broadcast 1, alltoall 1, send 1, recv 1, other 2."""
    g = torch.Generator().manual_seed(seed * 100 + rank)
    x = torch.randn(8, generator=g)
    outs = []
    a = x.clone()
    dist.all_reduce(a)
    b = x.clone()
    dist.all_reduce(b, op=dist.ReduceOp.MAX, async_op=True).wait()
    c = [x.clone(), x.clone() * 2]
    for t in c:
        dist.all_reduce(t, async_op=True)  # waited below, through the DDP-style future path
    dist.barrier()
    gathered = [torch.empty(8) for _ in range(world)]
    dist.all_gather(gathered, x)
    into = torch.empty(8 * world)
    dist.all_gather_into_tensor(into, x)
    rs = torch.empty(2)
    dist.reduce_scatter_tensor(rs, torch.randn(2 * world, generator=g))
    bc = x.clone()
    dist.broadcast(bc, src=0)
    a2a = torch.empty(world * 2)
    dist.all_to_all_single(a2a, torch.randn(world * 2, generator=g))
    peer_to, peer_from = (rank + 1) % world, (rank - 1) % world
    recv = torch.empty(8)
    send_work = dist.isend(x * (rank + 1), peer_to)
    dist.recv(recv, peer_from)
    send_work.wait()
    red = x.clone()
    dist.reduce(red, dst=0)
    outs += [a, b, *c, *gathered, into, rs, bc, a2a, recv] + ([red] if rank == 0 else [])
    return outs


ISSUED = {"allreduce": 4, "reduce_scatter": 1, "allgather": 2, "broadcast": 1, "alltoall": 1, "send": 1, "recv": 1,
          "other": 2}


def sampled_timer() -> object:
    t = C.StageTimer(14, 1)
    t.begin_step(0)
    return t


def main() -> None:
    mode, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    pg = dist.group.WORLD
    result: dict = {}

    if mode == "counts":
        seq0 = pg._get_sequence_number_for_group()
        mix(rank, world, 0)
        plain = pg._get_sequence_number_for_group() - seq0
        timer = sampled_timer()
        assert C.wrap_process_group(pg, "cpu", timer, True)
        seq0 = pg._get_sequence_number_for_group()
        mix(rank, world, 0)
        wrapped = pg._get_sequence_number_for_group() - seq0
        sample = timer.end_step()
        C.unwrap_process_group(pg, "cpu")
        result = {"calls": dict(zip(OPS, sample.comm_op_calls)), "seq_plain": plain, "seq_wrapped": wrapped,
                  "incomplete": sample.comm_incomplete, "comparable": len(sample.comparable_ms),
                  "total_ms": sample.comm_total_ms}
    elif mode == "results":
        plain = mix(rank, world, 1)
        timer = sampled_timer()
        C.wrap_process_group(pg, "cpu", timer, True)
        wrapped = mix(rank, world, 1)
        C.unwrap_process_group(pg, "cpu")
        result = {"equal": all(torch.equal(p, w) for p, w in zip(plain, wrapped)), "n": len(plain)}
    elif mode == "lifecycle":
        model = nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        off = relax_straggler.install(model, opt, config=StragglerConfig(enabled=False))
        result["disabled_wrapped"] = C.is_wrapped(pg, "cpu")
        off.uninstall()
        analyzer = relax_straggler.install(model, opt, config=StragglerConfig(enabled=True, interval=1, warmup_steps=0))
        result["installed_world"] = C.is_wrapped(pg, "cpu")
        side = analyzer._gather.group
        result["side_wrapped"] = C.is_wrapped(side, "cpu")
        late = dist.new_group(list(range(world)))
        result["new_group_before_step"] = C.is_wrapped(late, "cpu")
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        result["new_group_after_step"] = C.is_wrapped(late, "cpu")
        analyzer.uninstall()
        result["after_uninstall"] = [C.is_wrapped(g, "cpu") for g in group_registry()]
        again = relax_straggler.install(model, opt, config=StragglerConfig(enabled=True, interval=1, warmup_steps=0))
        result["reinstalled_world"] = C.is_wrapped(pg, "cpu")
        again.uninstall()
        result["after_second_uninstall"] = [C.is_wrapped(g, "cpu") for g in group_registry()]
    elif mode == "errors":
        def attempt() -> str:
            try:
                # Gloo checks split sizes inside its alltoall_base.
                dist.all_to_all_single(torch.empty(4), torch.empty(4), output_split_sizes=[1, 1],
                                       input_split_sizes=[2, 2])
            except Exception as exc:  # noqa: BLE001 - comparing whatever the backend raises
                return f"{type(exc).__name__}: {exc}"
            return "no error"

        plain = attempt()
        timer = sampled_timer()
        C.wrap_process_group(pg, "cpu", timer, True)
        wrapped = attempt()
        C.unwrap_process_group(pg, "cpu")
        result = {"plain": plain, "wrapped": wrapped}
    elif mode == "ddp":
        result = ddp_run(rank)
    if rank == 0:
        with open(out, "w") as fh:
            json.dump(result, fh)
    # DDP models sit in reference cycles: collect them now, while Gloo's threads can still
    # take the GIL to release tensors. Left to interpreter shutdown, a Gloo thread that
    # needs the GIL then aborts the process (seen with and without the analyzer).
    gc.collect()
    dist.destroy_process_group()


class Net(nn.Module):
    def __init__(self, slow_backward_s: float) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(64, 256), nn.Linear(256, 64)
        self.slow_backward_s = slow_backward_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        if self.slow_backward_s and h.requires_grad:
            h.register_hook(self._spin)  # extra compute in the middle of backward
        return self.b(h)

    def _spin(self, grad: torch.Tensor) -> None:
        end = time.perf_counter() + self.slow_backward_s
        while time.perf_counter() < end:
            pass


def ddp_run(rank: int) -> dict:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.parallel.DistributedDataParallel(Net(0.060 if rank == 2 else 0.0))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    reports, wall = [], []
    config = StragglerConfig(enabled=True, interval=1, warmup_steps=3)  # the default noise settings
    analyzer = relax_straggler.install(model, opt, config=config, report_fn=lambda m, s, details: reports.append({**m, **details}))
    clock = StepClock()
    for _ in range(15):
        with clock:
            loss = model(torch.randn(16, 64)).pow(2).mean()
            t0 = time.perf_counter()
            loss.backward()  # a phase timer around backward: what today's tools measure
            wall.append((time.perf_counter() - t0) * 1e3)
            opt.step()
            opt.zero_grad()
    analyzer.uninstall()
    step_s: list = [None] * dist.get_world_size()
    dist.all_gather_object(step_s, clock.times)
    walls = torch.tensor(wall[3:]).median().reshape(1)
    gathered = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, walls)
    keys = ("straggler/backward/top_rank", "straggler/communication/blamed_rank", "straggler/likely_bottleneck",
            "straggler/communication/top_rank", "straggler/verdict/status", "straggler/verdict/rank",
            "straggler/verdict/stage", "straggler/verdict/cause")
    return {"reports": [{k: m.get(k) for k in keys} for m in reports],
            "phase_backward_ms": [float(g) for g in gathered], "step_s": step_s, "warmup": config.warmup_steps}


if __name__ == "__main__":
    main()
