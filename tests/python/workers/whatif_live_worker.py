"""The live what-if on a 2-stage pipeline: Megatron-Core's real 1F1B schedule on CPU/Gloo
(helpers of megatron_worker.py), the Timers adapter recording per-op data on sampled steps.

Every forward sleeps BASE_S (compute that scheduling jitter on shared cores cannot drown);
in the slowed phases one rank's forward sleeps SLOW_S more. Phases, in one process group:
  slow1: rank 1 (pp stage 1) slowed;  slow0: rank 0 (pp stage 0) slowed;  even: nobody.
Rank 0 writes {phase: [metrics of each report], "step_s": every rank's step times}. Usage: whatif_live_worker.py OUTPUT_JSON
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from megatron_worker import TinyModel, megatron_on_cpu, megatron_step  # noqa: E402
from step_times import StepClock  # noqa: E402

STEPS = 9
MICROBATCHES = 6
BASE_S = 0.02
SLOW_S = 0.06
PHASES = {"slow1": 1, "slow0": 0, "even": None}


def run_phase(slow_rank: Any, rank: int, clock: StepClock) -> list[dict]:
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from relax_straggler import StragglerConfig
    from relax_straggler.integrations import megatron

    parallel_state.initialize_model_parallel(1, 2)
    torch.manual_seed(0)
    model = TinyModel(delay_s=BASE_S + (SLOW_S if rank == slow_rank else 0.0))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    reports: list[dict] = []
    config = StragglerConfig(enabled=True, interval=1, warmup_steps=2, noise_floor_ms=20.0)
    analysis = megatron.install(model, None, config=config, report_fn=lambda m, s, details: reports.append({**m, **details}))
    fb = get_forward_backward_func()
    clock.start()
    for step in range(STEPS):
        megatron_step(analysis, fb, model, opt, rank, step, microbatches=MICROBATCHES, clock=clock)
    analysis.uninstall()
    parallel_state.destroy_model_parallel()
    return reports


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    megatron_on_cpu()
    clock = StepClock()  # every step of the three phases
    result = {phase: run_phase(slow_rank, rank, clock) for phase, slow_rank in PHASES.items()}
    step_s: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(step_s, clock.times)
    if rank == 0:
        keep = lambda m: {k: v for k, v in m.items() if k.startswith("straggler/whatif/") or k == "straggler/dropped_ops"}  # noqa: E731
        with open(sys.argv[1], "w") as fh:
            json.dump({"step_s": step_s, **{phase: [keep(m) for m in reports] for phase, reports in result.items()}},
                      fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
