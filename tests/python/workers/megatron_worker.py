"""Megatron-Core on CPU for the Timers-adapter tests, and the worker of the 2-rank runs.

Megatron-Core 0.16 places two things on CUDA that its CPU/Gloo path otherwise does not
need: the schedules' token counter `total_num_tokens` (device="cuda", in
forward_backward_no_pipelining and both pipelined schedules) and the p2p receive
buffers (device=torch.cuda.current_device(), p2p_communication.py). `megatron_on_cpu()`
redirects those allocations to the CPU; with `batch_p2p_comm=False` the p2p path issues
plain isend/irecv (no torch.cuda.synchronize). A GPTModel (local layer spec) needs two
more: GlobalMemoryBuffer.get_tensor allocates the attention scores on
torch.cuda.current_device() (redirected like p2p), and attention dropout forks the CUDA
RNG tracker (the inference tracker is installed, which forks nothing; run with dropout 0).
Everything else that runs is
Megatron-Core's own code: get_forward_backward_func(), the microbatch loop and 1F1B
schedule, no_sync, forward_step / backward_step and p2p with their timers, the
finalize-grads hook.

Worker (under torchrun, 2 ranks), two phases, rank 1 slowed in forward in both:
  dp: data parallel. Two analyzers watch the same run: A through the Timers adapter
      (`integrations.megatron`), B through direct model hooks
      (`relax_straggler.install(model, None)`).
  pp: pipeline parallel, rank 0 the first stage, rank 1 the last, 1F1B schedule.
Rank 0 writes the reports, every rank's count of synchronize / barrier calls and every
rank's step times (the first STEPS of each run are its warm-up).
Usage: megatron_worker.py OUTPUT_JSON
"""

from __future__ import annotations

import contextlib
import gc
import json
import sys
import time
import types
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
import torch.nn as nn

STEPS = 6
MICROBATCHES = 3


def megatron_on_cpu() -> None:
    """Points the `torch` of Megatron-Core's schedules, p2p and utils modules at views of
    torch: zeros() ignores device= (schedules), torch.cuda.current_device() is "cpu" (p2p,
    GlobalMemoryBuffer); installs the inference RNG tracker (no CUDA generator states)."""
    from megatron.core import tensor_parallel, utils
    from megatron.core.pipeline_parallel import p2p_communication, schedules

    if schedules.torch is torch:
        view = types.ModuleType("torch_on_cpu")
        view.__dict__.update(torch.__dict__)
        view.zeros = lambda *a, device=None, **k: torch.zeros(*a, **k)
        schedules.torch = view
    if p2p_communication.torch is torch:
        view = types.ModuleType("torch_on_cpu")
        view.__dict__.update(torch.__dict__)
        view.cuda = types.SimpleNamespace(current_device=lambda: "cpu")
        p2p_communication.torch = view
    if utils.torch is torch:  # GlobalMemoryBuffer.get_tensor (the local attention's score buffer)
        view = types.ModuleType("torch_on_cpu")
        view.__dict__.update(torch.__dict__)
        view.cuda = _CudaOnCpu()
        utils.torch = view
    # The training RNG tracker keeps CUDA generator states (its fork() around attention
    # dropout reads them); the inference one forks nothing, the same with dropout 0.
    tensor_parallel.random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)


class _CudaOnCpu:
    """torch.cuda with current_device() "cpu"; every other name is torch.cuda's own."""

    def current_device(self) -> str:
        return "cpu"

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)


class TinyModel(nn.Module):
    """A model chunk as Megatron's schedules expect it: config, model_type,
    set_input_tensor. delay_s: sleep in every forward (the injected straggler)."""

    def __init__(self, delay_s: float = 0.0, d: int = 16) -> None:
        super().__init__()
        from megatron.core.enums import ModelType
        from megatron.core.transformer.transformer_config import TransformerConfig

        self.config = TransformerConfig(num_layers=1, hidden_size=d, num_attention_heads=1,
                                        pipeline_dtype=torch.float32, batch_p2p_comm=False)
        self.model_type = ModelType.encoder_or_decoder
        self.net = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.delay_s = delay_s
        self.input_tensor: Any = None

    def set_input_tensor(self, tensor: Any) -> None:
        """The activation received from the previous pipeline stage (None on the first)."""
        self.input_tensor = tensor[0] if isinstance(tensor, list) else tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.net(x if self.input_tensor is None else self.input_tensor)


def forward_step(data: Iterator[torch.Tensor], model: nn.Module):
    x = next(data)
    out = model(x)

    def loss_func(output: torch.Tensor):
        loss = output.pow(2).mean()
        return loss, {"loss": loss.detach()}

    return out, loss_func


def grads_finalize(group_of: Callable[[], Any] = lambda: None) -> Callable[..., None]:
    """A finalize_model_grads_func timed like Megatron's: 'all-grads-sync' around the
    gradient all-reduce over the group group_of() returns (None: every rank)."""
    def finalize(model_chunks, num_tokens, pg_collection=None, force_all_reduce=False) -> None:
        config = model_chunks[0].config
        if config.timers is not None:
            config.timers("all-grads-sync", log_level=1).start(barrier=config.barrier_with_L1_time)
        for chunk in model_chunks:
            for p in chunk.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad, group=group_of())
        if config.timers is not None:
            config.timers("all-grads-sync").stop()
    return finalize


allreduce_grads_finalize = grads_finalize()


def start_pp2() -> int:
    """Joins the Gloo job (one thread), redirects Megatron-Core to the CPU and lays the ranks
    out as 2 pipeline stages (tensor parallel 1, data parallel world / 2); returns the rank."""
    from megatron.core import parallel_state

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    megatron_on_cpu()
    parallel_state.initialize_model_parallel(1, 2)
    torch.manual_seed(0)
    return dist.get_rank()


def finish_pp2() -> None:
    """Leaves the job start_pp2 joined."""
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    gc.collect()  # the model's reference cycles, while Gloo threads can still take the GIL
    dist.destroy_process_group()


def batches(rank: int, step: int, d: int = 16, microbatches: int = MICROBATCHES) -> Iterator[torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return iter([torch.randn(8, 2, d, generator=gen) for _ in range(microbatches)])


def megatron_step(analysis: Any, fb: Callable[..., Any], model: nn.Module, opt: Any, rank: int, step: int,
                  microbatches: int = MICROBATCHES, label: Any = None, clock: Any = None) -> None:
    """One training step of the schedule `fb` on batches(rank, step) inside the adapter's
    train_step scope, numbered `label` (None: the adapter counts), timed on `clock` (a
    step_times.StepClock) if given."""
    with clock or contextlib.nullcontext(), analysis.train_step(**({} if label is None else {"step": label})):
        fb(forward_step_func=forward_step, data_iterator=batches(rank, step, microbatches=microbatches), model=model,
           num_microbatches=microbatches, seq_length=8, micro_batch_size=2, forward_only=False)
        with analysis.section("optimizer"):
            opt.step()
        opt.zero_grad()


def train(analysis: Any, model: nn.Module, rank: int, clock: Any, after_step: Any = None) -> None:
    from megatron.core.pipeline_parallel import get_forward_backward_func

    fb = get_forward_backward_func()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    clock.start()
    for step in range(STEPS):
        megatron_step(analysis, fb, model, opt, rank, step, label=100 + step, clock=clock)
        if after_step is not None:
            after_step()


def main() -> None:
    out = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    calls = {"synchronize": 0, "barrier": 0}

    def counting(name, fn):
        def wrapped(*a, **k):
            calls[name] += 1
            return fn(*a, **k)
        return wrapped

    torch.cuda.synchronize = counting("synchronize", torch.cuda.synchronize)
    dist.barrier = counting("barrier", dist.barrier)

    from megatron.core import parallel_state

    import relax_straggler
    from relax_straggler import StragglerConfig
    from relax_straggler.integrations import megatron

    megatron_on_cpu()
    config = StragglerConfig(enabled=True, interval=1, warmup_steps=2, noise_floor_ms=20.0)
    result: dict[str, Any] = {}

    # dp: the adapter (a) and direct hooks (b) on the same run.
    parallel_state.initialize_model_parallel(1, 1)
    torch.manual_seed(0)
    model = TinyModel(delay_s=0.04 if rank == 1 else 0.0)
    model.config.finalize_model_grads_func = allreduce_grads_finalize
    via_timers, via_hooks = [], []
    a = megatron.install(model, None, config=config, report_fn=lambda m, s, details: via_timers.append((s, {**m, **details})))
    b = relax_straggler.install(model, None, config=config, report_fn=lambda m, s, details: via_hooks.append((s, {**m, **details})))
    calls.update(synchronize=0, barrier=0)  # count the training loops only
    from step_times import StepClock  # beside this file

    clock = StepClock()  # every step of the three analyzed runs
    train(a, model, rank, clock, after_step=b.step)
    counted = dict(calls)
    a.uninstall()
    b.uninstall()
    result.update(timers=via_timers, hooks=via_hooks)
    parallel_state.destroy_model_parallel()

    # pp: two pipeline stages, the last one slowed; judged within pipeline stages (the
    # default) and across them.
    parallel_state.initialize_model_parallel(1, 2)
    model = TinyModel(delay_s=0.03 if rank == 1 else 0.0)
    for key, group in (("pipeline", "pipeline"), ("pipeline_ungrouped", None)):
        pipelined = []
        p = megatron.install(model, None, config=config, report_fn=lambda m, s, details: pipelined.append((s, {**m, **details})),
                             comparison_group=group)
        calls.update(synchronize=0, barrier=0)
        train(p, model, rank, clock)
        counted = {name: counted[name] + calls[name] for name in counted}
        p.uninstall()
        result[key] = pipelined
    parallel_state.destroy_model_parallel()

    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, counted)
    result["calls"] = everyone
    step_s: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(step_s, clock.times)
    result["step_s"] = step_s
    if rank == 0:
        with open(out, "w") as fh:
            json.dump(result, fh)
    gc.collect()  # DDP's reference cycles, while Gloo threads can still take the GIL
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
