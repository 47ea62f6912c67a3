"""Detection quality: which detector finds which straggler, how often, and how fast.

A scenario generator with realistic noise drives five detectors over the same sampled
steps; the table goes to docs/PERFORMANCE.md.

    .venv/bin/python benchmarks/detection_quality.py               # full table (3 seeds)
    .venv/bin/python benchmarks/detection_quality.py --seeds 1 --steps 150   # quick look

Cluster model (128 ranks): 16 nodes of 8 GPUs (node = rank // 8); 4 pipeline stages of
32 ranks (group = rank // 32), each all-reducing its gradients among its 32 ranks.
Per sampled step and rank, in ms:
  data 3, forward 40, backward 80, optimizer 10  x log-normal jitter (sigma 1.5 %; data 10 %)
  communication = transfer (25 ms x log-normal, sigma 8 %) + wait, where wait is the time
                  until the last rank of its pipeline stage reaches the all-reduce (so the
                  rank that arrives last has the SHORTEST communication time, docs/ARCHITECTURE.md invariant 7).
  warm-up: the first 10 steps are up to 2x slower, unevenly across ranks.
  GC pauses: with probability 2 % a step is 20-60 ms longer in forward on every rank.
  hiccups: with probability 0.05 % per rank and step, one compute or data stage of that
           rank takes 30 ms longer (a page fault, a preempted host thread).
Every detector skips the 10 warm-up steps (the analyzer samples none of them).

Jitter model (4 DDP ranks, one comparison group, one node), for small shifts under noise
larger than them. Per sampled step and rank, in ms: data 1, backward 38, optimizer 5
(log-normal sigma 10 %, 3 %, 3 %), forward 7.5 + a sleep, communication = transfer (25 ms,
sigma 8 %) + the wait for the last rank, so a step takes ~90 ms. The sleep is
  uniform       U(0, 15) ms on every rank and step;
  heavy-tailed  log-normal (median 6 ms, sigma 0.5) plus, with probability 3 % per rank
                and step, a Pareto spike (shape 1.5, at least 15 ms; unbounded variance).
The same warm-up as the cluster model; no GC pauses or hiccups (the sleep is the noise).

Scenarios (the slowdown starts at step `onset` = 50):
  healthy                    nothing injected
  slow rank 5..100 %         rank 37's compute stages slower by that much
  slow node                  node 5 (ranks 40-47) 20 % slower
  intermittent straggler     rank 77 30 % slower on a random 30 % of steps
  slow link                  rank 90's transfers take 1.6x as long (compute unchanged)
  slow pipeline stage        pipeline stage 3 (ranks 96-127) 25 % slower in forward and
                             backward by design, from step 0: stage imbalance, no straggler
  unequal workloads          tokens per rank and step vary +-50 % (compute scales with them;
                             detectors see per-token times), rank 101 20 % slower
  4 ranks, <jitter>: healthy nothing injected (jitter model)
  4 ranks, <jitter>: +8 %    rank 2 sleeps 7.3 ms more in forward (8 % of the step, about
                             half the uniform sleep's spread)
Detectors (--sequential-budget 0 runs the confirmed verdict without its sequential test):
  RFC threshold        per step: t >= mean x 1.2 or t - mean >= 5 ms (noise floor 1 ms; the
                       analyzer's per-step rule, communication by late arrival)
  Greyhound-style      per step: t >= median x 1.1 (10 % slowdown), late arrival in communication
  NVRx-style           per step: relative score median / t < 0.75 on compute stages only
  ensemble             window detector (relax_straggler.window.live.WindowDetector): last 50
                       steps, every 10 steps, default WindowConfig (most votes, >= 3 of 6)
  confirmed verdict    the product's decision as install() builds it from the default flags
                       (ConfirmConfig.from_config(StragglerConfig()): the window ensemble
                       every 10 reports over the last 50), with the pipeline-group map and
                       the node map: the ranks in state "straggler" after each report
Scoring: every detector answers at its evaluation points (each step, or each analysis)
with a set of ranks. Precision, recall and F1 count (evaluation point, rank) decisions
over the steady state: steps before onset (truth: no straggler) and from onset + 50 on
(truth: the injected ranks), skipping the 50-step transition. False alarms: evaluation
points that flag a rank outside the truth, per 1,000 steps of the scored run. Steps to
detect: first evaluation step at or after onset that flags an injected rank, minus onset,
averaged over seeds, with the slowest seed's ("-" when never).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from relax_straggler._ext import core  # noqa: E402
from relax_straggler.config import StragglerConfig  # noqa: E402
from relax_straggler.judge.confirm import ConfirmConfig, ConfirmedVerdict, VerdictResult  # noqa: E402
from relax_straggler.window.detector import WindowConfig  # noqa: E402
from relax_straggler.window.live import WindowDetector  # noqa: E402

STAGES = ("forward", "backward", "optimizer", "communication", "data")
COMPUTE = (0, 1, 2)  # forward, backward, optimizer
COMM = 3
DATA = 4
BASE_MS = np.array([40.0, 80.0, 10.0, 0.0, 3.0])
TRANSFER_MS = 25.0
RANKS = 128
PER_NODE = 8
PER_GROUP = 32
WARMUP = 10
ONSET = 50
WINDOW = 50
EVERY = 10
TRANSITION = 50


@dataclass(frozen=True)
class Scenario:
    """What is injected; `truth` are the ranks a detector should report."""

    name: str
    truth: tuple[int, ...] = ()
    compute_slowdown: dict[int, float] = field(default_factory=dict)  # rank -> fraction, from onset
    intermittent: dict[int, tuple[float, float]] = field(default_factory=dict)  # rank -> (fraction, probability)
    transfer_factor: dict[int, float] = field(default_factory=dict)  # rank -> multiplier, from onset
    structural: Optional[tuple[int, float]] = None  # (pipeline group, fraction on forward/backward), always
    tokens_spread: float = 0.0  # tokens ~ U(1 - s, 1 + s) x mean per rank and step
    expect_imbalance: bool = False
    jitter: Optional[str] = None  # "uniform" or "heavy-tailed": the 4-rank jitter model
    forward_ms: dict[int, float] = field(default_factory=dict)  # rank -> ms added to forward, from onset


def scenarios() -> list[Scenario]:
    out = [Scenario("healthy")]
    for pct in (5, 10, 20, 50, 100):
        out.append(Scenario(f"slow rank {pct} %", (37,), compute_slowdown={37: pct / 100}))
    node = tuple(range(40, 48))
    out.append(Scenario("slow node (8 ranks, 20 %)", node, compute_slowdown={r: 0.2 for r in node}))
    out.append(Scenario("intermittent (30 % on 30 % of steps)", (77,), intermittent={77: (0.3, 0.3)}))
    out.append(Scenario("slow link (comm x1.6)", (90,), transfer_factor={90: 1.6}))
    out.append(Scenario("slow pipeline stage (+25 %)", (), structural=(3, 0.25), expect_imbalance=True))
    out.append(Scenario("unequal workloads (+-50 % tokens)", (101,), compute_slowdown={101: 0.2}, tokens_spread=0.5))
    for jitter in ("uniform", "heavy-tailed"):
        out.append(Scenario(f"4 ranks, {jitter} jitter: healthy", jitter=jitter))
        out.append(Scenario(f"4 ranks, {jitter} jitter: rank 2 +8 %", (2,), jitter=jitter, forward_ms={2: 7.3}))
    return out


JITTER_RANKS = 4
JITTER_BASE_MS = np.array([7.5, 38.0, 5.0, 0.0, 1.0])  # forward before its sleep


def jitter_sleep(kind: str, rng: np.random.Generator) -> np.ndarray:
    """Each of the 4 ranks' sleep in forward for one step, ms."""
    if kind == "uniform":
        return rng.uniform(0.0, 15.0, JITTER_RANKS)
    if kind == "heavy-tailed":
        sleep = rng.lognormal(np.log(6.0), 0.5, JITTER_RANKS)
        spikes = rng.random(JITTER_RANKS) < 0.03
        sleep[spikes] += 15.0 * (1.0 + rng.pareto(1.5, int(spikes.sum())))
        return sleep
    raise ValueError(f"unknown jitter {kind!r}")


def generate_jitter(sc: Scenario, steps: int, seed: int) -> np.ndarray:
    """judged ms (steps, 4, stages) of the jitter model (module docstring)."""
    rng = np.random.default_rng(seed)
    ms = np.empty((steps, JITTER_RANKS, len(STAGES)))
    for s in range(steps):
        t = np.tile(JITTER_BASE_MS, (JITTER_RANKS, 1))
        t *= np.exp(rng.normal(0.0, 1.0, t.shape) * np.array([0.0, 0.03, 0.03, 0.0, 0.1]))
        t[:, 0] += jitter_sleep(sc.jitter, rng)
        if s >= ONSET:
            for r, extra in sc.forward_ms.items():
                t[r, 0] += extra
        if s < WARMUP:
            t[:, :3] *= 1.0 + np.exp(-s / 3.0) * rng.uniform(0.5, 1.0, (JITTER_RANKS, 1))
        arrive = t[:, [DATA, 0, 1]].sum(axis=1)
        t[:, COMM] = TRANSFER_MS * np.exp(rng.normal(0.0, 0.08, JITTER_RANKS)) + arrive.max() - arrive
        ms[s] = t
    return ms


def layout(ranks: int) -> tuple[list[int], list[int]]:
    """(pipeline group, node) per rank: the cluster model's, or one of each for the jitter model."""
    if ranks == RANKS:
        return list(np.arange(RANKS) // PER_GROUP), list(np.arange(RANKS) // PER_NODE)
    return [0] * ranks, [0] * ranks


def generate(sc: Scenario, steps: int, seed: int) -> np.ndarray:
    """judged ms (steps, ranks, stages) as the analyzer would judge them (per-token
    normalised forward/backward when workloads vary)."""
    if sc.jitter is not None:
        return generate_jitter(sc, steps, seed)
    rng = np.random.default_rng(seed)
    group = np.arange(RANKS) // PER_GROUP
    ms = np.empty((steps, RANKS, len(STAGES)))
    for s in range(steps):
        t = np.tile(BASE_MS, (RANKS, 1))
        sigma = np.array([0.015, 0.015, 0.015, 0.0, 0.1])
        t *= np.exp(rng.normal(0.0, 1.0, t.shape) * sigma)
        tokens = np.ones(RANKS)
        if sc.tokens_spread:
            tokens = rng.uniform(1 - sc.tokens_spread, 1 + sc.tokens_spread, RANKS)
            t[:, 0:2] *= tokens[:, None]
        if s < WARMUP:
            t[:, :3] *= 1.0 + np.exp(-s / 3.0) * rng.uniform(0.5, 1.0, (RANKS, 1))
        if sc.structural is not None:
            g, frac = sc.structural
            t[group == g, 0:2] *= 1.0 + frac
        if s >= ONSET:
            for r, frac in sc.compute_slowdown.items():
                t[r, list(COMPUTE)] *= 1.0 + frac
            for r, (frac, p) in sc.intermittent.items():
                if rng.random() < p:
                    t[r, list(COMPUTE)] *= 1.0 + frac
        if rng.random() < 0.02:  # GC pause on every rank
            t[:, 0] += rng.uniform(20.0, 60.0)
        for r in np.flatnonzero(rng.random(RANKS) < 0.0005):
            t[r, rng.choice([0, 1, 2, DATA])] += 30.0
        # The gradient all-reduce starts when the last rank of the pipeline stage arrives.
        arrive = t[:, [DATA, 0, 1]].sum(axis=1)
        last = np.array([arrive[group == g].max() for g in range(RANKS // PER_GROUP)])[group]
        transfer = TRANSFER_MS * np.exp(rng.normal(0.0, 0.08, RANKS))
        if s >= ONSET:
            for r, f in sc.transfer_factor.items():
                transfer[r] *= f
        t[:, COMM] = transfer + (last - arrive)
        if sc.tokens_spread:
            t[:, 0:2] *= tokens.mean() / tokens[:, None]
        ms[s] = t
    return ms


# --- detectors: each maps a run (steps, ranks, stages) to [(step, flagged ranks)] -------

Answers = list[tuple[int, frozenset[int]]]


def per_step(relative: float, absolute: float, floor: float, ref: str, stages: tuple[int, ...]) -> Callable:
    def run(ms: np.ndarray) -> Answers:
        C = core()
        cfg = C.VerdictConfig(relative, absolute, floor, C.Reference.MEAN if ref == "mean" else C.Reference.MEDIAN)
        names = [STAGES[j] for j in stages]
        out = []
        for s in range(WARMUP, ms.shape[0]):
            v = C.judge_step(ms[s][:, list(stages)], names, s, cfg)
            out.append((s, frozenset(r for sv in v.stages for r in sv.stragglers)))
        return out
    return run


def windowed(config: WindowConfig) -> Callable:
    def run(ms: np.ndarray) -> Answers:
        nodes = layout(ms.shape[1])[1]
        det = WindowDetector(window=WINDOW, every=EVERY, skip_reports=WARMUP, config=config, rank_to_node=nodes)
        out = []
        current: frozenset[int] = frozenset()
        for s in range(ms.shape[0]):
            if det.observe(_Report(s, STAGES, ms[s])):
                current = frozenset(det.last_result.anomaly_ranks)
            if s >= WARMUP and (s - WARMUP + 1) % EVERY == 0:
                out.append((s, current))
        return out
    return run


@dataclass(frozen=True)
class _Report:
    step: int
    stages: tuple[str, ...]
    judged_ms: np.ndarray


def confirmed_run(ms: np.ndarray, sequential_budget: Optional[float] = None) -> list[tuple[int, VerdictResult]]:
    """The product's confirmed verdict on every sampled step past warm-up; sequential_budget
    replaces the default's (0: the sequential test off, for a comparison)."""
    # The analyzer's own decision with the flags' defaults: what `install()` gives a user.
    groups, nodes = layout(ms.shape[1])
    config = ConfirmConfig.from_config(StragglerConfig(enabled=True))
    if sequential_budget is not None:
        config = config.replace(sequential_budget=sequential_budget)
    verdict = ConfirmedVerdict(config, rank_to_node=nodes)
    return [(s, verdict.update(s, ms[s], STAGES, groups=groups)) for s in range(WARMUP, ms.shape[0])]


def confirmed(sequential_budget: Optional[float] = None) -> Callable:
    def run(ms: np.ndarray) -> Answers:
        return [(s, frozenset(r.straggler_ranks)) for s, r in confirmed_run(ms, sequential_budget)]
    return run


def detectors(sequential_budget: Optional[float] = None) -> dict[str, Callable]:
    """Each detector, by its table name: all run the product's own code (judge_step at the
    peers' thresholds for the per-step baselines, WindowDetector, ConfirmedVerdict with the
    defaults install() uses); the benchmark adds only the data and the scoring."""
    all_stages = tuple(range(len(STAGES)))
    return {
        "RFC threshold (mean x1.2)": per_step(1.2, 5.0, 1.0, "mean", all_stages),
        "Greyhound-style (median x1.1)": per_step(1.1, 1e9, 1.0, "median", all_stages),
        "NVRx-style (score < 0.75)": per_step(1.0 / 0.75, 1e9, 0.0, "median", COMPUTE),
        "ensemble (window, 6 clusterers)": windowed(WindowConfig()),
        "confirmed verdict": confirmed(sequential_budget),
    }


# --- scoring ------------------------------------------------------------------------------

@dataclass
class Score:
    tp: int = 0
    fp: int = 0
    fn: int = 0
    false_alarms: int = 0
    steps: int = 0
    delays: list = field(default_factory=list)
    misses: int = 0

    def add(self, sc: Scenario, answers: Answers, steps: int) -> None:
        truth = frozenset(sc.truth)
        for s, flagged in answers:
            if ONSET <= s < ONSET + TRANSITION:
                continue
            expected = truth if s >= ONSET else frozenset()
            self.tp += len(flagged & expected)
            self.fp += len(flagged - expected)
            self.fn += len(expected - flagged)
            self.false_alarms += bool(flagged - expected)
        self.steps += steps - WARMUP - TRANSITION
        if truth:
            hits = [s for s, flagged in answers if s >= ONSET and flagged & truth]
            if hits:
                self.delays.append(hits[0] - ONSET)
            else:
                self.misses += 1

    def row(self) -> dict[str, str]:
        p = self.tp / (self.tp + self.fp) if self.tp + self.fp else float("nan")
        r = self.tp / (self.tp + self.fn) if self.tp + self.fn else float("nan")
        f1 = 2 * p * r / (p + r) if p + r > 0 else (0.0 if self.tp + self.fn else float("nan"))

        def fmt(x: float) -> str:
            return "-" if np.isnan(x) else f"{x:.3f}"
        delay = "-" if not self.delays else f"{np.mean(self.delays):.0f}"
        if len(self.delays) > 1:
            delay += f" (max {max(self.delays)})"
        if self.delays and self.misses:
            delay += f" ({self.misses} missed)"
        return {"precision": fmt(p), "recall": fmt(r), "F1": fmt(f1),
                "false alarms / 1k steps": f"{1000.0 * self.false_alarms / max(self.steps, 1):.1f}",
                "steps to detect": delay}


def evaluate(steps: int, seeds: int, only: Optional[list[str]] = None,
             sequential_budget: Optional[float] = None) -> list[dict[str, str]]:
    rows = []
    dets = detectors(sequential_budget)
    for sc in scenarios():
        if only and not any(o in sc.name for o in only):
            continue
        scores = {name: Score() for name in dets}
        imbalance = 0
        for seed in range(seeds):
            ms = generate(sc, steps, seed)
            for name, det in dets.items():
                scores[name].add(sc, det(ms), steps)
            if sc.expect_imbalance:
                last = confirmed_run(ms, sequential_budget)[-1][1]
                imbalance += any(f.state == "imbalance" and f.group == sc.structural[0] for f in last.findings)
        for name, score in scores.items():
            row = {"scenario": sc.name, "detector": name, **score.row()}
            if sc.expect_imbalance:
                row["steps to detect"] = f"imbalance in {imbalance}/{seeds} runs" if name == "confirmed verdict" else "-"
            rows.append(row)
    return rows


def markdown(rows: list[dict[str, str]]) -> str:
    cols = list(rows[0].keys())
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(r[c] for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300, help="sampled steps per run (>= 120)")
    p.add_argument("--seeds", type=int, default=3, help="runs per scenario")
    p.add_argument("--only", nargs="*", help="scenario name substrings to run")
    p.add_argument("--sequential-budget", type=float, default=None,
                   help="the confirmed verdict's sequential_budget (default: the product's; 0: off)")
    args = p.parse_args(argv)
    if args.steps < ONSET + TRANSITION + 2 * EVERY:
        p.error(f"--steps must be >= {ONSET + TRANSITION + 2 * EVERY}")
    t0 = time.perf_counter()
    rows = evaluate(args.steps, args.seeds, args.only, args.sequential_budget)
    print(markdown(rows))
    print(f"\n{args.seeds} seed(s) x {args.steps} steps x {RANKS} ranks ({JITTER_RANKS} in the jitter model); "
          f"{time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
