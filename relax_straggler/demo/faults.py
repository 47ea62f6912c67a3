"""Stragglers on purpose: deterministic delays inside a stage, and real CPU contention."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time

import torch

STAGES = ("forward", "backward", "optimizer", "data")  # where a sleep can be injected


def parse_delays(specs: list[str], world: int) -> list[tuple[int, str, float, int]]:
    """Parses --inject-delay RANK:STAGE:MS[:FROM] specs into (rank, stage, ms, first step).
    Raises ValueError naming the bad spec."""
    out = []
    for spec in specs:
        try:
            rank_s, stage, ms_s, *rest = spec.split(":")
            rank, ms = int(rank_s), float(ms_s)
            (first,) = [int(x) for x in rest] or [0]
        except ValueError:
            raise ValueError(f"--inject-delay {spec!r}: expected RANK:STAGE:MS[:FROM], e.g. 1:forward:30 or "
                             "1:forward:30:100") from None
        if stage not in STAGES:
            raise ValueError(f"--inject-delay {spec!r}: STAGE must be forward, backward, optimizer or data")
        if not 0 <= rank < world or not (math.isfinite(ms) and ms >= 0) or first < 0:
            raise ValueError(f"--inject-delay {spec!r}: RANK must be in [0, {world}), MS >= 0 and FROM >= 0")
        out.append((rank, stage, ms, first))
    return out


def parse_jitter(specs: list[str]) -> list[tuple[str, float]]:
    """Parses --inject-jitter STAGE:MS specs into (stage, ms): every rank sleeps a fresh
    U(0, MS) ms in that stage each step. Raises ValueError naming the bad spec."""
    out = []
    for spec in specs:
        try:
            stage, ms_s = spec.split(":")
            ms = float(ms_s)
        except ValueError:
            raise ValueError(f"--inject-jitter {spec!r}: expected STAGE:MS, e.g. forward:15") from None
        if stage not in STAGES:
            raise ValueError(f"--inject-jitter {spec!r}: STAGE must be forward, backward, optimizer or data")
        if not (math.isfinite(ms) and ms > 0):
            raise ValueError(f"--inject-jitter {spec!r}: MS must be a finite number > 0")
        out.append((stage, ms))
    return out


def inject_delays(delays: dict[str, float], model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
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
    """`procs` busy-looping processes pinned to one core: real CPU contention for the rank
    on it, which then gets about 1 / (procs + 1) of its core (a throttled device)."""

    def __init__(self, core: int, procs: int = 1) -> None:
        if procs < 1:
            raise ValueError(f"Contender: procs must be >= 1, got {procs}")
        self.core = core
        self.procs = procs
        self._running: list[subprocess.Popen] = []

    def start(self) -> None:
        """Returns once every process is pinned and spinning, so the contention starts at the
        step that asked for it, not an interpreter start-up later."""
        spin = f"import os; os.sched_setaffinity(0, {{{self.core}}}); os.write(1, b'r'); os.close(1)\nwhile True: pass"
        for _ in range(self.procs):
            proc = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE)
            self._running.append(proc)
        for proc in self._running:
            if proc.stdout.read(1) != b"r":
                raise RuntimeError(f"Contender: busy process {proc.pid} exited before it started spinning")
            proc.stdout.close()

    def stop(self) -> None:
        for proc in self._running:
            proc.kill()
            proc.wait()
        self._running.clear()
