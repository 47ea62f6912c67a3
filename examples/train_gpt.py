"""A small character-level GPT trained with DDP over Gloo, with straggler analysis.

The main job of the README (`make demo`): 2 ranks on 127.0.0.1, one thread per rank
pinned to its own core, trained on the Python standard library's own source files (a
corpus every machine has). Part-way through, a CPU-bound process is pinned to rank 1's
core: the contention a throttled GPU causes, not a sleep. The analyzer reports as the
run goes, writes <output>/straggler.jsonl, and the run ends with a summary line naming
the flagged rank and stage.

    torchrun --standalone --nproc-per-node 2 examples/train_gpt.py --straggler-analysis

--inject-delay RANK:STAGE:MS adds a deterministic sleep inside a stage on one rank
(stages: forward, backward, optimizer, data) for tests.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import relax_straggler

log = logging.getLogger("train_gpt")


# --- data ------------------------------------------------------------------------------
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


# --- model -----------------------------------------------------------------------------
@dataclass
class GPTConfig:
    vocab: int = 256
    seq_len: int = 128
    d_model: int = 128
    heads: int = 4
    layers: int = 4


class CausalSelfAttention(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.heads = c.heads
        self.qkv = nn.Linear(c.d_model, 3 * c.d_model)
        self.proj = nn.Linear(c.d_model, c.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(c.d_model), nn.LayerNorm(c.d_model)
        self.attn = CausalSelfAttention(c)
        self.mlp = nn.Sequential(nn.Linear(c.d_model, 4 * c.d_model), nn.GELU(), nn.Linear(4 * c.d_model, c.d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(c.vocab, c.d_model)
        self.pos = nn.Parameter(torch.zeros(1, c.seq_len, c.d_model))
        self.blocks = nn.Sequential(*[Block(c) for _ in range(c.layers)])
        self.ln = nn.LayerNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos[:, : idx.shape[1]]
        return self.head(self.ln(self.blocks(x)))


# --- stragglers on purpose -------------------------------------------------------------
def parse_delays(specs: list[str], world: int) -> list[tuple[int, str, float]]:
    """RANK:STAGE:MS triples; raises argparse-style SystemExit on a bad spec."""
    out = []
    for spec in specs:
        try:
            rank_s, stage, ms_s = spec.split(":")
            rank, ms = int(rank_s), float(ms_s)
        except ValueError:
            raise SystemExit(f"--inject-delay {spec!r}: expected RANK:STAGE:MS, e.g. 1:forward:30")
        if stage not in ("forward", "backward", "optimizer", "data"):
            raise SystemExit(f"--inject-delay {spec!r}: STAGE must be forward, backward, optimizer or data")
        if not 0 <= rank < world or not (math.isfinite(ms) and ms >= 0):
            raise SystemExit(f"--inject-delay {spec!r}: RANK must be in [0, {world}) and MS >= 0")
        out.append((rank, stage, ms))
    return out


def inject_delays(delays: dict[str, float], model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Sleeps inside forward / backward / optimizer. Registered after install(), so these
    hooks run after the analyzer's and the sleep falls inside the timed stage."""
    if "forward" in delays:
        model.register_forward_pre_hook(lambda m, i: time.sleep(delays["forward"]))
    if "backward" in delays:
        def arm(m, i, out):
            if out.requires_grad:
                out.register_hook(lambda g: time.sleep(delays["backward"]))
        model.register_forward_hook(arm)
    if "optimizer" in delays:
        optimizer.register_step_pre_hook(lambda o, a, k: time.sleep(delays["optimizer"]))


class Contender:
    """A busy-looping process pinned to one core: real CPU contention for that rank."""

    def __init__(self, core: int) -> None:
        self.core = core
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        os.sched_setaffinity(self.proc.pid, {self.core})

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


# --- training --------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=240)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--corpus-bytes", type=int, default=2_000_000)
    p.add_argument("--contend-rank", type=int, default=1, help="Rank whose core gets a CPU hog (-1: none).")
    p.add_argument("--contend-steps", type=str, default="100:240", help="FIRST:LAST step of the contention.")
    p.add_argument("--inject-delay", action="append", default=[], metavar="RANK:STAGE:MS")
    p.add_argument("--output", type=str, default="runs/demo")
    p.add_argument("--log-every", type=int, default=20)
    relax_straggler.add_arguments(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    core = sorted(os.sched_getaffinity(0))[local_rank % len(os.sched_getaffinity(0))]
    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)

    delays = {stage: ms / 1e3 for r, stage, ms in parse_delays(args.inject_delay, world) if r == rank}
    first, last = (int(x) for x in args.contend_steps.split(":"))

    gpt = GPT(GPTConfig(seq_len=args.seq_len, d_model=args.d_model, heads=args.heads, layers=args.layers))
    model = nn.parallel.DistributedDataParallel(gpt) if distributed else gpt
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)

    config = relax_straggler.from_args(args)
    if config.enabled and config.jsonl_path is None:
        config = config.replace(jsonl_path=os.path.join(args.output, "straggler.jsonl"))
    analyzer = relax_straggler.install(model, optimizer, config=config)
    inject_delays(delays, model, optimizer)

    batches = Batches(load_corpus(args.corpus_bytes), args.batch_size, args.seq_len, args.seed, rank)
    contender = Contender(core) if rank == args.contend_rank else None
    losses, step_ms = [], []
    try:
        for step in range(args.steps):
            if contender is not None and step == first:
                contender.start()
            if contender is not None and step == last:
                contender.stop()
            t0 = time.perf_counter()
            with analyzer.section("data"):
                x, y = batches.next()
                if "data" in delays:
                    time.sleep(delays["data"])
            analyzer.set_workload(x.numel())
            logits = model(x)
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.reshape(-1))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step_ms.append((time.perf_counter() - t0) * 1e3)
            losses.append(loss.item())
            if rank == 0 and (step % args.log_every == 0 or step == args.steps - 1):
                log.info("step %4d  loss %.3f  step %.1f ms", step, losses[-1], step_ms[-1])
    finally:
        if contender is not None:
            contender.stop()
    analyzer.uninstall()

    if rank == 0:
        write_summary(args, analyzer, losses, step_ms, world)
    if distributed:
        dist.destroy_process_group()
    return 0


def write_summary(args: argparse.Namespace, analyzer, losses: list[float], step_ms: list[float], world: int) -> None:
    os.makedirs(args.output, exist_ok=True)
    warm = step_ms[min(10, len(step_ms) - 1):]
    summary = {
        "world_size": world,
        "steps": len(losses),
        "loss_first": losses[0],
        "loss_last": sum(losses[-10:]) / len(losses[-10:]),
        "median_step_ms": sorted(warm)[len(warm) // 2],
        "mean_step_ms": sum(warm) / len(warm),
        "straggler_analysis": analyzer.enabled,
    }
    run_summary = analyzer.summary()
    if run_summary is not None:
        findings = run_summary.findings()
        summary["reports"] = run_summary.reports
        summary["findings"] = [f.__dict__ for f in findings]
        summary["bottlenecks"] = run_summary.bottlenecks()
        top = next((f for f in findings if not f.stage.startswith("communication")), None)
        if top is None:
            log.info("summary: no straggler found in %d reports", run_summary.reports)
        else:
            log.info("summary: straggler rank %d, slow in %s (flagged in %d of %d reports, median %.2fx the "
                     "reference)", top.rank, top.stage, top.flagged, top.reports, top.median_slowdown)
            for f in [f for f in findings if f is not top][:3]:
                log.info("         also %s", f)
    log.info("loss %.3f -> %.3f, median step %.1f ms", summary["loss_first"], summary["loss_last"],
             summary["median_step_ms"])
    with open(os.path.join(args.output, "summary.json"), "w") as fh:
        json.dump(summary, fh, indent=2)


if __name__ == "__main__":
    sys.exit(main())
