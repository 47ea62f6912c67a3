"""The what-if report: a typed result from the engine's replay, its JSON form and its
terminal summary."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from relax_straggler import _ext
from relax_straggler.whatif.errors import WhatIfInputError
from relax_straggler.whatif.loader import OpRecords, load_op_records

log = logging.getLogger(__name__)

# Pipeline sends and recvs are attributed together per direction, as in the study.
_OPTYPE_GROUP = {"forward-send": "forward-pp-comm", "forward-recv": "forward-pp-comm",
                 "backward-send": "backward-pp-comm", "backward-recv": "backward-pp-comm"}


@dataclass
class GiveBack:
    """Fixing a set of ops: mean step times (s) and the fraction of lost time returned."""

    t_ori: float
    t_ideal: float
    t_rem: float
    t_add: float
    rem: float  # (t_ori - t_rem) / (t_ori - t_ideal): fraction of the lost time fixing the set gives back
    add: float  # (t_add - t_ideal) / (t_ori - t_ideal): fraction the set alone adds to the ideal job

    @classmethod
    def of(cls, g) -> "GiveBack":
        return cls(g.t_ori, g.t_ideal, g.t_rem, g.t_add, g.rem, g.add)


@dataclass
class WhatIfReport:
    """Slowdown S (Eq. 1) and its attribution S_i (Eq. 2/4); step times in s; ids as recorded."""

    slowdown: float
    simulation_error: float  # mean measured / mean replayed step time
    steps: list[int]
    measured_step_s: list[float]
    replayed_step_s: list[float]
    ideal_step_s: list[float]
    per_step: dict[int, float]  # step -> S_t
    by_dp_rank: dict[int, float]
    by_stage: dict[int, float]
    by_optype: dict[str, float]
    by_worker: dict[tuple[int, int], float]  # (dp_rank, stage) -> S_w
    by_dp_rank_per_step: dict[int, dict[int, float]]
    by_stage_per_step: dict[int, dict[int, float]]
    by_optype_per_step: dict[int, dict[str, float]]
    top_workers: list[tuple[int, int]]  # the M_W set, (dp_rank, stage)
    m_w: GiveBack
    m_s: GiveBack
    seconds: float = 0.0
    model: object = field(default=None, repr=False, compare=False)
    steps_left_out: list[int] = field(default_factory=list)  # incomplete steps not replayed (reported)

    def worker_score(self, dp_rank: int, stage: int) -> float:
        """The heatmap score min(S_dp, S_stage) of one worker."""
        return min(self.by_dp_rank[dp_rank], self.by_stage[stage])

    def to_json(self) -> dict:
        """JSON-ready dict; keys of the by_* objects are ids as strings ("dp/stage" for workers)."""
        def num(x: float) -> Optional[float]:
            return None if x is None or math.isnan(x) else float(x)

        def obj(d: dict) -> dict:
            return {str(k): num(v) for k, v in d.items()}

        return {
            "slowdown": num(self.slowdown),
            "simulation_error": num(self.simulation_error),
            "by_dp_rank": obj(self.by_dp_rank),
            "by_stage": obj(self.by_stage),
            "by_optype": obj(self.by_optype),
            "by_worker": {f"{d}/{s}": num(v) for (d, s), v in self.by_worker.items()},
            "per_step": obj(self.per_step),
            "per_step_by_dp_rank": {str(k): obj(v) for k, v in self.by_dp_rank_per_step.items()},
            "per_step_by_stage": {str(k): obj(v) for k, v in self.by_stage_per_step.items()},
            "per_step_by_optype": {str(k): obj(v) for k, v in self.by_optype_per_step.items()},
            "m_w": num(self.m_w.rem),
            "m_s": num(self.m_s.rem),
            "m_w_detail": {k: num(v) for k, v in vars(self.m_w).items()},
            "m_s_detail": {k: num(v) for k, v in vars(self.m_s).items()},
            "top_workers": [{"dp_rank": d, "stage": s} for d, s in self.top_workers],
            "step_s": {str(st): {"measured": num(a), "replayed": num(b), "ideal": num(c)}
                       for st, a, b, c in zip(self.steps, self.measured_step_s, self.replayed_step_s,
                                              self.ideal_step_s)},
            "steps_left_out": list(self.steps_left_out),
            "seconds": self.seconds,
        }

    def summary_line(self) -> str:
        """The lead line (docs/WHATIF.md, "The lead line"): S, then the fix that gives back
        more of the lost time, the top workers' (the M_W set) or the last pipeline stage's
        (M_S), as the slowdown the job would keep with that fix, t_rem / t_ideal, and the
        share of the lost time it gives back. A fix that would not shorten the job (t_rem >=
        t_ori) is said so, without a number: no number on the line exceeds S."""
        line = f"the job runs {self.slowdown:.2f}x slower than without stragglers"
        fixes = []
        if self.top_workers:
            d, s = self.top_workers[0]
            n = len(self.top_workers)
            fixes.append((self.m_w, f"worker dp {d} / pp {s}" if n == 1 else f"the top {n} workers (dp {d} / pp {s} "
                                                                              "first)"))
        if len(self.by_stage) > 1:
            fixes.append((self.m_s, f"the last pipeline stage (pp {max(self.by_stage)})"))
        fixes = [(g, who) for g, who in fixes if not math.isnan(g.rem)]
        if not fixes:
            return line
        g, who = max(fixes, key=lambda f: f[0].rem)
        if not g.t_rem < g.t_ori:
            return f"{line}; fixing {who} would not shorten it"
        return (f"{line}; fixing {who} would leave {g.t_rem / g.t_ideal:.2f}x, giving back {g.rem * 100:.0f} % of the "
                "lost time")

    def brief(self) -> dict:
        """The figures `analyze` adds to its summary: slowdown S, the top worker (dp_rank,
        stage) and its S_w, give_back (M_W: fraction of the lost time fixing the top
        workers returns), m_s, simulation_error and the one-sentence summary."""
        top = self.top_workers[0] if self.top_workers else None
        num = lambda x: None if x is None or math.isnan(x) else float(x)  # noqa: E731
        return {"slowdown": num(self.slowdown), "simulation_error": num(self.simulation_error),
                "top_worker": None if top is None else {"dp_rank": top[0], "stage": top[1],
                                                        "score": num(self.worker_score(*top))},
                "give_back": num(self.m_w.rem), "m_s": num(self.m_s.rem), "steps_left_out": len(self.steps_left_out),
                "summary": self.summary_line()}

    def text(self) -> str:
        """The terminal report."""
        lines = [self.summary_line(),
                 f"  replayed vs measured step time: simulation error {self.simulation_error:.3f} "
                 f"(mean measured {_mean(self.measured_step_s):.3f} s, replayed {_mean(self.replayed_step_s):.3f} s, "
                 f"ideal {_mean(self.ideal_step_s):.3f} s)",
                 f"  stage imbalance M_S (fixing the last stage gives back): {self.m_s.rem * 100:.1f} %",
                 f"  top workers M_W (fixing {len(self.top_workers)} worker(s) gives back): {self.m_w.rem * 100:.1f} %",
                 "  by stage:    " + _top(self.by_stage),
                 "  by dp_rank:  " + _top(self.by_dp_rank),
                 "  by op type:  " + _top(self.by_optype)]
        if self.by_worker:  # S_w: the worker's ops alone recorded; can exceed S (ideal = means over everyone)
            lines.append("  by worker:   " + _top({f"dp {d} / pp {s}": v for (d, s), v in self.by_worker.items()}))
        return "\n".join(lines)


def _mean(v: list[float]) -> float:
    return sum(v) / len(v) if v else float("nan")


def _top(d: dict, n: int = 4) -> str:
    items = sorted(d.items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{k}: {v:.3f}" for k, v in items) + (", ..." if len(d) > n else "")


def analyze_records(rec: OpRecords, *, by_worker: bool = True, top_fraction: float = 0.03,
                    threads: int = 0) -> WhatIfReport:
    """Builds the engine model from the records and runs every analysis (S, S_i, M_W, M_S).
    Raises WhatIfInputError when the records cannot be modelled (the message names the op)."""
    t0 = time.perf_counter()
    engine = _ext.core().whatif
    try:
        model = engine.WhatIfModel(rec.dp_rank, rec.stage, rec.step, rec.optype, rec.start, rec.duration,
                                   rec.seq_id, rec.microbatch, rec.chunk, rec.optype_names)
    except ValueError as e:
        raise WhatIfInputError(str(e)) from None
    groups: dict[str, int] = {}
    optype_group = [groups.setdefault(_OPTYPE_GROUP.get(n, n), len(groups)) for n in rec.optype_names]
    r = model.analyze(optype_group, top_fraction, by_worker, threads)
    dps, steps, pp = list(model.dp_ranks), list(model.steps), model.pp
    names = list(groups)
    # Each attribute read converts the engine's whole vector: read the per-step tables once.
    dp_ps, stage_ps, group_ps = r.by_dp_per_step, r.by_stage_per_step, r.by_group_per_step
    report = WhatIfReport(
        slowdown=r.slowdown, simulation_error=r.simulation_error, steps=steps,
        measured_step_s=list(r.measured_step_s), replayed_step_s=list(r.replayed_step_s),
        ideal_step_s=list(r.ideal_step_s), per_step=dict(zip(steps, r.slowdown_per_step)),
        by_dp_rank=dict(zip(dps, r.by_dp)), by_stage=dict(enumerate(r.by_stage)),
        by_optype={names[g]: v for g, v in enumerate(r.by_group) if not math.isnan(v)},
        by_worker={(dps[w // pp], w % pp): v for w, v in enumerate(r.by_worker)},
        by_dp_rank_per_step={st: {dps[i]: dp_ps[i][k] for i in range(len(dps))} for k, st in enumerate(steps)},
        by_stage_per_step={st: {s: stage_ps[s][k] for s in range(pp)} for k, st in enumerate(steps)},
        by_optype_per_step={st: {names[g]: group_ps[g][k] for g in range(len(names)) if group_ps[g]}
                            for k, st in enumerate(steps)},
        top_workers=[(dps[w // pp], w % pp) for w in r.top_workers],
        m_w=GiveBack.of(r.m_w), m_s=GiveBack.of(r.m_s), model=model, steps_left_out=list(rec.left_out_steps))
    report.seconds = time.perf_counter() - t0
    log.debug("what-if analysis of %d ops took %.3f s", len(rec), report.seconds)
    return report


def run_whatif(path: str | Path, **kwargs) -> WhatIfReport:
    """load_op_records (format detected) + analyze_records(**kwargs)."""
    t0 = time.perf_counter()
    report = analyze_records(load_op_records(path), **kwargs)
    report.seconds = time.perf_counter() - t0
    return report
