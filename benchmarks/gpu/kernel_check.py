"""Kernel records of a throttled rank, end to end: the GPU check's `kernel_stats` step.

    torchrun --standalone --nproc-per-node 2 benchmarks/gpu/kernel_check.py --device cuda \
        --output runs/gpu/kernel_stats.json

Two ranks train the demo GPT with DDP over Gloo (both on cuda:0: NCCL refuses two ranks on
one device) with straggler analysis and --straggler-kernel-stats at interval 10. From step
--contend-from on, rank 1 also runs a competing kernel stream: a thread looping large bf16
matmuls on its own CUDA stream, so rank 1's forward and backward kernels share the SMs.
On one GPU the two ranks' contexts are time-sliced, so the competitor slows rank 0's
kernels too, less than rank 1's: the result says what the records and the verdict read,
not what they should. The collector gives a kernel to the section whose correlation-id range
holds its launch, process-wide: the competitor's matmuls launched while one of rank 1's
sections is open count as that section's kernels (each rank's `top` kernels show them).
The default onset (step 30) leaves two healthy reports (steps 10 and
20) from which the confirmed verdict learns its noise before the slowdown.

Writes the reports (--straggler-jsonl, default OUTPUT with the suffix .jsonl) and OUTPUT, a
JSON object: per report the confirmed verdict's status, rank, stage and cause, the
published straggler/{stage}/kernel_ms, idle_ms, nccl_ms (the stage's top rank's) and each
rank's own kernel fields and top kernels of that step; per rank the collector's mode, its dropped, invalid
and unattributed record counts, the warnings logged, the median step time before and
after the onset and every step's time (ms). `failure` names why kernel records were not measured (the build has no
CUPTI: the warning's text), or is null.

--device cpu runs the same plumbing on the CPU (the competitor then loops CPU matmuls):
--straggler-kernel-stats warns and every kernel field reads null (NaN). The exit code is 1
when --device cuda measured no kernel records (`failure` says why), else 0.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import math
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any, Optional
from unittest import mock

import torch
import torch.distributed as dist

import relax_straggler
import relax_straggler.live.analyzer as analyzer_module
from relax_straggler.common.serialization import json_safe
from relax_straggler.common.stages import STAGES
from relax_straggler.demo import GPT, Batches, GPTConfig, load_corpus, next_token_loss
from relax_straggler.live.kernel_evidence import KernelSource, StageKernels

CONTEND_RANK = 1
REPORTED_STAGES = ("forward", "backward", "optimizer", "communication")
KERNEL_FIELDS = ("kernel_ms", "idle_ms", "nccl_ms")


class KernelContender:
    """A thread looping `size` x `size` matmuls on its own stream (CUDA: bf16 on a new
    stream; CPU: float32), competing with the training for the device."""

    def __init__(self, device: torch.device, size: int) -> None:
        if size < 1:
            raise ValueError(f"--contend-size must be >= 1, got {size}")
        self._device = device
        self._size = size
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.matmuls = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kernel-contender", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        cuda = self._device.type == "cuda"
        dtype = torch.bfloat16 if cuda else torch.float32
        stream = torch.cuda.Stream(self._device) if cuda else None
        with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
            a = torch.randn(self._size, self._size, device=self._device, dtype=dtype)
            b = torch.randn_like(a)
            c = torch.empty_like(a)
            while not self._stop.is_set():
                for _ in range(4):  # a few queued, then wait: the GIL is free while it waits
                    torch.mm(a, b, out=c)
                    self.matmuls += 1
                if stream is not None:
                    stream.synchronize()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


def _evidence(ev: StageKernels) -> dict[str, Any]:
    """One sampled step's kernel fields per stage that has any, and its record counts."""
    stages = {}
    for i, stage in enumerate(STAGES):
        values = (float(ev.kernel_ms[i]), float(ev.idle_ms[i]), float(ev.nccl_ms[i]))
        if any(math.isfinite(v) for v in values):
            stages[stage] = dict(zip(KERNEL_FIELDS, values), top=[list(t) for t in ev.top.get(stage, ())])
    return {"stages": stages, "records": ev.records, "invalid_records": ev.invalid_records,
            "dropped_records": ev.dropped_records, "unattributed_records": ev.unattributed_records}


class RecordingSource:
    """The analyzer's own kernel source (open_kernel_source's), passed through; keeps what it
    returned for each sampled step on this rank (None: not measured)."""

    def __init__(self, inner: KernelSource) -> None:
        self._inner = inner
        self.name = inner.name
        self.steps: dict[int, Optional[dict[str, Any]]] = {}
        self.mode = getattr(inner, "mode", inner.name)

    def begin_step(self, step: int) -> None:
        self._inner.begin_step(step)

    def end_step(self, step: int) -> Optional[StageKernels]:
        ev = self._inner.end_step(step)
        self.mode = getattr(self._inner, "mode", self._inner.name)
        self.steps[step] = None if ev is None else _evidence(ev)
        return ev

    def close(self) -> None:
        self._inner.close()


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cuda: every rank on cuda:0; cpu: the same plumbing without kernel records.")
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--contend-from", type=int, default=30, help="First step of rank 1's competing stream.")
    p.add_argument("--contend-size", type=int, default=8192, help="Side of the competing matmuls.")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--corpus-bytes", type=int, default=1_000_000)
    p.add_argument("--output", type=str, default="runs/gpu/kernel_stats.json")
    relax_straggler.add_arguments(p)
    p.set_defaults(straggler_analysis=True, straggler_kernel_stats=True, straggler_interval=10)
    return p


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 0 <= args.contend_from < args.steps:
        parser.error(f"--contend-from must be in [0, --steps), got {args.contend_from}")
    out = Path(args.output)
    try:
        config = relax_straggler.from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    config = config.replace(jsonl_path=config.jsonl_path or str(out.with_suffix(".jsonl")))

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != 2:
        raise SystemExit(f"kernel_check.py: run it on 2 ranks (--nproc-per-node 2), got {world}")
    if args.device == "cuda":
        device = torch.device("cuda", 0)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
    torch.manual_seed(0)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")  # the log keeps them too
    warnings = _Warnings()
    logging.getLogger("relax_straggler").addHandler(warnings)
    if rank == 0 and config.jsonl_path and os.path.exists(config.jsonl_path):
        os.unlink(config.jsonl_path)  # the sink appends: one run per file
    dist.barrier()

    gpt = GPT(GPTConfig(seq_len=args.seq_len, d_model=args.d_model, heads=args.heads, layers=args.layers)).to(device)
    model = torch.nn.parallel.DistributedDataParallel(gpt)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-4)
    batches = Batches(load_corpus(args.corpus_bytes), args.batch_size, args.seq_len, seed=0, rank=rank)
    # The training stream's own work, not the competitor's queue.
    sync = torch.cuda.current_stream(device).synchronize if device.type == "cuda" else (lambda: None)

    # The analyzer opens its kernel source over its own stage timer; the script wraps what
    # it opens to keep this rank's fields (the reports publish the top rank's only).
    recorders: list[RecordingSource] = []
    real_open = analyzer_module.open_kernel_source

    def open_recording(timer: Any = None) -> Optional[KernelSource]:
        source = real_open(timer)
        if source is None:
            return None
        recorders.append(RecordingSource(source))
        return recorders[-1]

    reports: list[dict[str, Any]] = []
    with mock.patch.object(analyzer_module, "open_kernel_source", open_recording):
        analyzer = relax_straggler.install(model, optimizer, config=config,
                                           report_fn=lambda m, s, details: reports.append(dict(m, **details, step=s)))
    contender = KernelContender(device, args.contend_size) if rank == CONTEND_RANK else None
    step_ms: list[float] = []
    try:
        for step in range(args.steps):
            if contender is not None and step == args.contend_from:
                contender.start()
            t0 = time.perf_counter()
            with analyzer.section("data"):
                x, y = (t.to(device, non_blocking=True) for t in batches.next())
            analyzer.set_workload(x.numel())
            loss = next_token_loss(model(x), y)
            loss.backward()
            optimizer.step()  # its post-hook ends the analyzer's step
            optimizer.zero_grad(set_to_none=True)
            sync()  # the step's wall time, for the result only
            step_ms.append((time.perf_counter() - t0) * 1e3)
    finally:
        if contender is not None:
            contender.stop()
    recorder = recorders[0] if recorders else None
    mode = recorder.mode if recorder is not None else "unavailable"
    analyzer.uninstall()

    mine = {"rank": rank, "kernel_source": None if recorder is None else recorder.name, "mode": mode,
            "steps": {} if recorder is None else recorder.steps, "warnings": warnings.messages,
            "contender_matmuls": None if contender is None else contender.matmuls,
            "step_ms_before": _median(step_ms[min(5, args.contend_from):args.contend_from]),
            "step_ms_after": _median(step_ms[args.contend_from + 5:]), "step_ms": step_ms}
    ranks: list[Any] = [None] * world
    dist.all_gather_object(ranks, mine)
    failure = None
    if rank == 0:
        result = build_result(args, device, config, reports, ranks)
        failure = result["failure"]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(json_safe(result), indent=2, allow_nan=False))
        print(summary_line(result), flush=True)
    gc.collect()  # DDP's reference cycles, while Gloo threads can still take the GIL
    dist.destroy_process_group()
    return 1 if args.device == "cuda" and failure is not None else 0


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def _rank_totals(r: dict[str, Any]) -> dict[str, Any]:
    measured = [s for s in r["steps"].values() if s is not None]
    totals = {k: sum(s[k] for s in measured) for k in ("records", "invalid_records", "dropped_records",
                                                       "unattributed_records")}
    return {"rank": r["rank"], "kernel_source": r["kernel_source"], "mode": r["mode"],
            "sampled_steps": len(r["steps"]), "measured_steps": len(measured), **totals,
            "warnings": r["warnings"], "contender_matmuls": r["contender_matmuls"],
            "step_ms_before": r["step_ms_before"], "step_ms_after": r["step_ms_after"], "step_ms": r["step_ms"]}


def _failure(ranks: list[dict[str, Any]]) -> Optional[str]:
    """Why no kernel record was measured on some rank, or None."""
    for r in ranks:
        if r["kernel_source"] is None:
            why = next((w for w in r["warnings"] if "--straggler-kernel-stats" in w), "no kernel source was opened")
            return f"rank {r['rank']}: kernel records not measured: {why}"
        if not any(s is not None and s["records"] > 0 for s in r["steps"].values()):
            return (f"rank {r['rank']}: kernel source {r['kernel_source']} (mode {r['mode']}) returned no kernel "
                    f"record in {len(r['steps'])} sampled steps")
    return None


def build_result(args: argparse.Namespace, device: torch.device, config: Any, reports: list[dict[str, Any]],
                 ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The result object (documented in the module docstring) from the metrics rank's
    reports and every rank's own records."""
    rows = []
    for m in sorted(reports, key=lambda m: m["step"]):
        step = m["step"]
        published = {stage: {k: m.get(f"straggler/{stage}/{k}") for k in ("top_rank", *KERNEL_FIELDS)}
                     for stage in REPORTED_STAGES if f"straggler/{stage}/top_rank" in m}
        per_rank = {}
        for r in ranks:
            ev = r["steps"].get(step)
            per_rank[str(r["rank"])] = None if ev is None else {
                stage: ev["stages"][stage] for stage in REPORTED_STAGES if stage in ev["stages"]}
        rows.append({"step": step, **{k: m.get(f"straggler/verdict/{k}") for k in ("status", "rank", "stage", "cause")},
                     "max_ms": {stage: m.get(f"straggler/{stage}/max_ms") for stage in published},
                     "published": published, "per_rank": per_rank})
    confirmed = [r for r in rows if r["status"] == "straggler" and r["rank"] == CONTEND_RANK]
    return {
        "device": str(device), "world_size": len(ranks), "torch": torch.__version__, "steps": args.steps,
        "interval": config.interval, "warmup_steps": config.warmup_steps, "kernel_stats": config.kernel_stats,
        "contend_rank": CONTEND_RANK, "contend_from": args.contend_from, "contend_size": args.contend_size,
        "model": {k: getattr(args, k) for k in ("layers", "d_model", "heads", "seq_len", "batch_size")},
        "jsonl": config.jsonl_path, "failure": _failure(ranks),
        "confirmed_rank1_from_step": confirmed[0]["step"] if confirmed else None,
        "rank1_causes": sorted({r["cause"] for r in confirmed}),
        "final": {k: rows[-1][k] for k in ("step", "status", "rank", "stage", "cause")} if rows else None,
        "ranks": [_rank_totals(r) for r in ranks],
        "reports": rows,
    }


def summary_line(result: dict[str, Any]) -> str:
    final = result["final"] or {}
    return (f"kernel_check: {len(result['reports'])} reports; rank 1 confirmed from step "
            f"{result['confirmed_rank1_from_step']}, causes {result['rank1_causes']}; last verdict "
            f"{final.get('status')} rank {final.get('rank')} {final.get('stage')} {final.get('cause')}; "
            f"failure: {result['failure']}")


if __name__ == "__main__":
    raise SystemExit(main())
